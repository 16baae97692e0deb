#!/bin/bash
# One H100 call for the steps of several tokens (issue 50's prefill chunks, issue 55's
# verifications): the SmolLM2-shaped Q4_0 steps of 8 and 32 tokens planned now (gate|up as
# one GatedContraction joined in the rows GEMV, k's rotated rows and v's rows written
# straight to the cache, attention over the query rows as they are) and as before
# (stacked_gate, rope_update, kv_write and attention_rows off), over the same weights in
# one run; and the new plan with the GEMV (not the rows GEMV) up to 8 rows
# (GEMV_MAX_ROWS=8: one kernel a contraction either way). From the repository root with
# .whl carried:
#
#   bash poot-backend-cuda/bench/rows_call.sh
#
# 1. the cuda conformance cases of what changed (GatedContraction, RopeUpdateSlice,
# TransposedUpdateSlice, TokenMajorAttention, the decode-batch contractions);
# 2. llama_gpu.py: each step's kernels, time and tok/s under both plans, the logits of the
# old plan against the new one's, each profiled by kernel kind. Summary in
# $OUT/summary.txt. Under 200 s warm.
set -u
source scripts/h200_lib.sh
START=$SECONDS
h200_wheels .whl/*.whl || exit 1
h200_editable poot-core poot-quant poot-backend-cuda
echo "set up in $((SECONDS - START)) s"
S=$OUT/summary.txt
conformance cuda 8 "${T_CONF:-55}" "GatedContraction or UpdateSlice or TokenMajor or batch"
conformance_summary cuda | tee -a "$S"
echo "at $((SECONDS - START)) s" | tee -a "$S"
cd poot-backend-cuda/bench || exit 1
PYTHONPATH=/tmp/site:. timeout -k 5 "${T_BENCH:-125}" python3 llama_gpu.py --shapes smollm2 \
  --formats Q4_0 --precision exact --prefill "${TOKENS:-8,32}" --check-layers 0 \
  --profile smollm2 \
  --variants ";GEMV_MAX_ROWS=8;STACKED_GATE=0,ROPE_UPDATE=0,KV_WRITE=0,ATTENTION_ROWS=0" \
  >"$OUT/rows.log" 2>&1
echo "llama_gpu.py rc $?" | tee -a "$S"
grep -E "SUMMARY|Error|FAIL" "$OUT/rows.log" | grep -v "profile " | cut -c1-200 | tee -a "$S"
grep -E "SUMMARY .*profile" "$OUT/rows.log" | cut -c1-170 | head -48 | tee -a "$S"
echo "at $((SECONDS - START)) s" | tee -a "$S"
