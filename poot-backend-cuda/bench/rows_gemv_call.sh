#!/bin/bash
# One H200 call for the rows GEMV's tile (issue 18's b=32 step, issue 16's contraction
# item), from the root of a checkout whose parent holds the carried .whl:
#
#   bash poot-backend-cuda/bench/rows_gemv_call.sh
#
# 1. the contraction conformance cases on cuda; 2. rows_sweep.py: the decode steps at
# BATCHES (profiled at the largest) under the first tile (32:1:2: the schedule before row
# tiles), SmolLM2's Q4_1 shapes at M = 32 under each tile, the steps again under the best
# by time per step. Summary in $OUT/summary.txt.
set -u
source scripts/h200_lib.sh
START=$SECONDS
h200_bench_setup || exit 1
echo "set up in $((SECONDS - START)) s"
S=$OUT/summary.txt
timeout -k 5 "${T_CONF:-90}" python3 -m pytest -q -p no:cacheprovider -n 6 --pyargs \
  poot.conformance --poot-backend cuda -k "ontract or Dot or MatMul" \
  -W ignore::pytest.PytestAssertRewriteWarning >"$OUT/conformance_cuda.log" 2>&1
echo "cuda contraction conformance (rc $?): $(grep -E '[0-9]+ (passed|failed)' \
  "$OUT/conformance_cuda.log" | tail -1); $(grep -h 'declared cases' "$OUT/conformance_cuda.log" \
  | tail -1)" | tee -a "$S"
grep -E '^(FAILED|ERROR)' "$OUT/conformance_cuda.log" | cut -c1-200 | head -8 | tee -a "$S"
echo "at $((SECONDS - START)) s" | tee -a "$S"
cd poot-backend-cuda/bench || exit 1
PYTHONPATH=/tmp/site:. timeout -k 5 "${T_SWEEP:-120}" python3 rows_sweep.py \
  ${TILES:+--tiles "$TILES"} --batches "${BATCHES:-1,8,32}" >"$OUT/sweep.log" 2>&1
echo "rows_sweep.py rc $?" | tee -a "$S"
grep -E "^(SUMMARY|BEST)|Error|Contraction" "$OUT/sweep.log" | cut -c1-200 | tee -a "$S"
echo "at $((SECONDS - START)) s" | tee -a "$S"
