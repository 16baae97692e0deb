#!/bin/bash
# One H200 call for the split-operand tensor-core schedule (issue 18's b=32 step, issue 16's
# contraction item), from the root of a checkout whose parent holds the carried .whl:
#
#   bash poot-backend-cuda/bench/split_call.sh
#
# NVRTC warmers (split_sweep.py --warm, $WARM processes) compile the sweep's kernels while
# the whole conformance suite runs on cuda; then split_sweep.py: the decode steps at
# $BATCHES under the FMA schedules and the split one (profiled at the largest), and
# SmolLM2's Q4_1 shapes at $ROWS rows under fma, the chosen schedule and $TILES (at
# $TILE_ROWS). Summary in $OUT/summary.txt.
set -u
source scripts/h200_lib.sh
S=$OUT/summary.txt START=$SECONDS
h200_bench_setup || exit 1
echo "set up in $((SECONDS - START)) s" | tee -a "$S"
ARGS=(--rows "${ROWS:-8,16,32,64}" --tiles "${TILES:-}" --tile-rows "${TILE_ROWS:-32}")
warm=()
for i in $(seq 0 $((${WARM:-6} - 1))); do
  (cd poot-backend-cuda/bench && PYTHONPATH=/tmp/site:. timeout -k 5 "${T_WARM:-150}" \
    python3 split_sweep.py "${ARGS[@]}" --warm "$i/${WARM:-6}" >"/tmp/warm$i.log" 2>&1) &
  warm+=($!)
done
conformance cuda "${CONF_N:-8}" "${T_CONF:-120}" "${CONF_K:-}"
conformance_summary cuda | tee -a "$S"
echo "at $((SECONDS - START)) s" | tee -a "$S"
for p in "${warm[@]}"; do wait "$p"; done
echo "warmers done at $((SECONDS - START)) s; $(cat /tmp/warm*.log | grep -c Error) errors" \
  | tee -a "$S"
cd poot-backend-cuda/bench || exit 1
PYTHONPATH=/tmp/site:. timeout -k 5 "${T_SWEEP:-150}" python3 split_sweep.py "${ARGS[@]}" \
  --batches "${BATCHES:-1,8,32}" >"$OUT/sweep.log" 2>&1
echo "split_sweep.py rc $?" | tee -a "$S"
grep -E "^SUMMARY|Error|Contraction|FusedRow|PagedAtt" "$OUT/sweep.log" | cut -c1-220 | tee -a "$S"
echo "at $((SECONDS - START)) s" | tee -a "$S"
