set -x
D=/tmp/diag; rm -rf $D; mkdir -p $D
( export TORCHINDUCTOR_CACHE_DIR=$D/indA TRITON_CACHE_DIR=$D/triA; timeout 150 python .gpu/diag.py A $D ) > $OUT/diagA.log 2>&1
cp -r $D/triA $D/triB; rm -rf $D/indA $D/triA
( export TORCHINDUCTOR_CACHE_DIR=$D/indB TRITON_CACHE_DIR=$D/triB; timeout 120 python .gpu/diag.py B $D ) > $OUT/diagB.log 2>&1
tail -5 $OUT/diagA.log; grep -v "^emit" $OUT/diagB.log | tail -40
timeout 150 python -m harness run task=output_gate keep_scratch=true progress=false bench.max_seconds=1 results_dir=/tmp/r > $OUT/og.log 2>&1; tail -3 $OUT/og.log
for f in /tmp/beam-harness-output_gate-*/*/child.log; do n=$(basename $(dirname $f)); cp $f $OUT/$n.child.log; done
ls $OUT; grep -c "Failed to load" $OUT/*.child.log
