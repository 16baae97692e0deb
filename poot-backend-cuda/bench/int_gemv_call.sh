#!/bin/bash
# One H200 call comparing the integer GEMV with the f32 schedule (issue 16), from the
# repository root with .whl carried:
#
#   bash poot-backend-cuda/bench/int_gemv_call.sh
#
# realsize_session.sh's bench (8B Q4_0/Q4_K: the defaults, INT_MAX_K=0 = the f32 schedule,
# INT_WIDE_N=1048576 = one column a group) and conf parts, then batch_step.py's b=1 step
# of the SmolLM2 shape under each schedule (batch_<INT_MAX_K>.log). About 70 s warm.
set -u
export OUT=${OUT:-/tmp/out}
PARTS="bench conf" SHAPES=8b FORMATS=Q4_0,Q4_K CHECK=0 \
  VARIANTS=";INT_MAX_K=0;INT_WIDE_N=1048576" T_conf=110 T_bench=150 \
  bash poot-backend-cuda/bench/realsize_session.sh 2>&1 | tail -60
cd poot-backend-cuda/bench || exit 1
for v in 1048576 0; do
  PYTHONPATH=/tmp/site:. POOT_CACHE=/tmp/poot-cache timeout 40 python3 batch_step.py \
    --set "INT_MAX_K=$v" --batches 1 --old-batches '' --greedy 0 --rows '' \
    >"$OUT/batch_$v.log" 2>&1
  echo "INT_MAX_K=$v rc $?"
  grep -E "SUMMARY step rows GEMV|Error" "$OUT/batch_$v.log" | cut -c1-200
done
