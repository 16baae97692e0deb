#!/bin/bash
# One H200 call for the Vulkan backend (issue 15), run from the repository root with the
# Vulkan loader packages in .gl and the wheels the image lacks in .whl:
#
#   for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig; bash poot-backend-vulkan/bench/h200_session.sh PART
#
# PART is "conformance" (about 4 minutes) or "bench" (about 8: the random weights alone take
# a minute or more), one device call each (a call may last 10 minutes); "all" runs both.
# Setup runs first in every call. Each part has its own timeout:
#   1. setup: carried wheels, editable installs, `poot backends` (the NVIDIA Vulkan device)
#   2. the conformance suite on vulkan (pytest -n 8), writing the H200 support matrix
#   3. vulkan_bench.py: SmolLM2 decode tok/s on vulkan, wgpu and cuda side by side (the real
#      GGUF when .model holds it as in poot-backend-cuda/bench/h200_session.sh, else random
#      Q4_1 weights of its exact shape), then bf16 GEMV GB/s against a buffer copy
# Full logs land in $OUT; the summary is printed last.
set -u -o pipefail
PART=${1:-all}
export PYTHONUNBUFFERED=1 POOT_CACHE=/tmp/poot-cache
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export __EGL_VENDOR_LIBRARY_FILENAMES=${__EGL_VENDOR_LIBRARY_FILENAMES:-/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json}
export WGPU_BACKEND_TYPE=Vulkan
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" "$POOT_CACHE"
B=poot-backend-vulkan/bench
SUM=$OUT/summary.txt
: >"$SUM"
START=$SECONDS
status() {
  local s="OK"
  if (($2 == 124 || $2 == 137)); then s="TIMEOUT"; elif (($2 != 0)); then s="FAILED (exit $2)"; fi
  printf '%-58s | %s\n' "PART $1" "$s, $3 s" >>"$SUM"
  echo "=== part $1: $s, $3 s (session at $((SECONDS - START)) s)"
}

echo "=== part 1 setup"
t=$SECONDS
{
  nvidia-smi --query-gpu=name,driver_version --format=csv
  ldconfig -p | grep libvulkan
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
} >"$OUT/setup.log" 2>&1
rc=$?
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e poot-core -e poot-quant \
  -e poot-backend-cuda -e poot-backend-wgpu -e poot-backend-vulkan >>"$OUT/setup.log" 2>&1 ||
  rc=1
if [ -f .model/smol.part1 ] && [ -f .model/smol.part2 ]; then
  cat .model/smol.part1 .model/smol.part2 >/tmp/smol.gguf &&
    export POOT_SMOLLM2_GGUF=/tmp/smol.gguf
fi
timeout 120 python3 -m poot backends >>"$OUT/setup.log" 2>&1 || rc=1
grep -A1 "^vulkan\|^wgpu\|^cuda" "$OUT/setup.log" | cut -c1-150
status "1 setup" $rc $((SECONDS - t))

if [ "$PART" = conformance ] || [ "$PART" = all ]; then
echo "=== part 2 conformance vulkan"
t=$SECONDS
timeout 300 python3 -m pytest --pyargs poot.conformance --poot-backend vulkan \
  --poot-support "$OUT/support_vulkan_h200.md" -q -n 8 -rf -p no:cacheprovider \
  -W ignore::pytest.PytestAssertRewriteWarning >"$OUT/conformance.log" 2>&1
rc=$?
tail -25 "$OUT/conformance.log"
grep -h "declared cases" "$OUT/conformance.log" >>"$SUM"
status "2 conformance" $rc $((SECONDS - t))
fi

if [ "$PART" = bench ] || [ "$PART" = all ]; then
echo "=== part 3 bench"
t=$SECONDS
timeout 480 python3 $B/vulkan_bench.py --tokens 32 >"$OUT/bench.log" 2>&1
rc=$?
tail -40 "$OUT/bench.log"
grep -h '^SUMMARY ' "$OUT/bench.log" | sed 's/^SUMMARY /  /' >>"$SUM"
status "3 bench" $rc $((SECONDS - t))
fi

echo
echo "=== summary ($(date -u +%FT%TZ), session $((SECONDS - START)) s)"
cat "$SUM"
