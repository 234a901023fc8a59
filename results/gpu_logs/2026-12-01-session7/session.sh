#!/bin/bash
# usage: bash .gpu/session.sh NAME DEADLINE_S STEPS_FILE   (lines "A|label|limit_s|cmd": lane A on GPU0, B on GPU1)
# runs from a copy of .gpu/tree (git archive of .gpu/commit); logs to /tmp/$NAME, tarred to /tmp/$NAME.tgz at the end.
NAME=$1; DEADLINE=$(( $(date +%s) + $2 )); STEPS=$3
rm -rf /tmp/tree && cp -r .gpu/tree /tmp/tree && cp .gpu/*.py /tmp/tree/
export PYTHONPATH=/tmp/tree:/tmp/site:/opt/nvidia/nsight-compute/2025.3.1/extras/python
export BEAM_GIT_COMMIT=$(cat .gpu/commit)
L=/tmp/$NAME; mkdir -p $L/results $L/profiles
echo "start $(date +%T) commit $BEAM_GIT_COMMIT" > $L/progress
nvidia-smi > $L/nvidia-smi.txt 2>&1
lane() {  # lane GPU steps...
  local gpu=$1; shift
  for step in "$@"; do
    IFS="|" read -r lab lim cmd <<< "$step"
    local left=$(( DEADLINE - $(date +%s) ))
    if (( left < 30 )); then echo "$gpu $lab SKIPPED (deadline)" >> $L/progress; continue; fi
    (( lim > left )) && lim=$left
    echo "$gpu $lab started $(date +%T) limit=$lim" >> $L/progress
    local t0=$(date +%s)
    (cd /tmp/tree && export L CUDA_VISIBLE_DEVICES=$gpu && timeout -k 10 $lim bash -c "$cmd") > $L/$lab.log 2>&1
    echo "$gpu $lab rc=$? $(( $(date +%s) - t0 ))s $(date +%T)" >> $L/progress
  done
}
A=(); B=()
while IFS= read -r s; do case $s in "A|"*) A+=("${s#A|}");; "B|"*) B+=("${s#B|}");; esac; done < $STEPS
lane 0 "${A[@]}" & lane 1 "${B[@]}" & wait
echo "done $(date +%T)" >> $L/progress
tar -C /tmp -czf /tmp/$NAME.tgz $NAME
cat $L/progress
