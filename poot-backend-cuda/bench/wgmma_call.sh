#!/bin/bash
# One H200 call for the warpgroup GEMM (issue 16, item 4), from the root of a checkout
# whose parent holds the carried .whl:
#
#   bash poot-backend-cuda/bench/wgmma_call.sh
#
# 1. wgmma_gemm.py: the warpgroup kernel against numpy on edge shapes, then bf16 4096^3
# TFLOP/s of its schedules and of the mma.sync one against torch.matmul; the HGMMA count
# in each compiled kernel's SASS; 2. the contraction conformance cases on cuda.
# Summary in $OUT/summary.txt.
set -u
source scripts/h200_lib.sh
START=$SECONDS
h200_bench_setup || exit 1
echo "set up in $((SECONDS - START)) s"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee -a "$S"
(cd poot-backend-cuda/bench && PYTHONPATH=/tmp/site:. timeout -k 5 "${T_GEMM:-150}" \
  python3 wgmma_gemm.py >"$OUT/wgmma_gemm.log" 2>&1)
echo "wgmma_gemm.py rc $?" | tee -a "$S"
grep -E "^SUMMARY|Error" "$OUT/wgmma_gemm.log" | cut -c1-220 | tee -a "$S"
for f in "${POOT_CACHE:-$HOME/.cache/poot}"/cuda/*.cubin; do
  n=$(cuobjdump --dump-sass "$f" 2>/dev/null | grep -c HGMMA)
  [ "$n" -gt 0 ] && echo "$(basename "$f" | cut -c1-12): $n HGMMA" | tee -a "$S"
done
echo "at $((SECONDS - START)) s" | tee -a "$S"
timeout -k 5 "${T_CONF:-90}" python3 -m pytest -q -p no:cacheprovider -n 6 --pyargs \
  poot.conformance --poot-backend cuda -k "ontract or Dot or MatMul" \
  -W ignore::pytest.PytestAssertRewriteWarning >"$OUT/conformance_cuda.log" 2>&1
echo "cuda contraction conformance (rc $?): $(grep -E '[0-9]+ (passed|failed)' \
  "$OUT/conformance_cuda.log" | tail -1)" | tee -a "$S"
grep -E '^(FAILED|ERROR)' "$OUT/conformance_cuda.log" | cut -c1-200 | head -8 | tee -a "$S"
echo "at $((SECONDS - START)) s" | tee -a "$S"
