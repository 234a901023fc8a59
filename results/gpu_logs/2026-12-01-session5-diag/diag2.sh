D=/tmp/diag; rm -rf $D; mkdir -p $D
( export TORCHINDUCTOR_CACHE_DIR=$D/indA TRITON_CACHE_DIR=$D/triA; timeout 150 python .gpu/diag.py A $D ) > $OUT/diagA.log 2>&1; tail -3 $OUT/diagA.log
( export TORCHINDUCTOR_CACHE_DIR=$D/indB1 TORCHINDUCTOR_COMPILE_THREADS=1; cp -r $D/triA $D/triB1; timeout 100 python .gpu/reprochild.py plain $D/art.bin $D/triB1 ) > $OUT/diagB1.log 2>&1
grep -v "^emit" $OUT/diagB1.log | tail -30
export PYTHONPATH=$PYTHONPATH:$PWD/.gpu
timeout 150 python .gpu/reproparent.py $D > $OUT/diagB2.log 2>&1; tail -c 8000 $OUT/diagB2.log
