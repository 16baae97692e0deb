#!/bin/bash
# One H200 call: the Vulkan decode step profiled, vulkan beside cuda on SmolLM2 decode
# (random Q4_1 weights of its shape: no model staging), the bf16 GEMV chain against a copy
# and, with "conformance", then the vulkan conformance suite. From the repository root, with
# the wheels the image lacks in ../.whl and the Vulkan loader packages in ../.gl (the
# device tool's carry):
#
#   bash poot-backend-vulkan/bench/h200_profile.sh [conformance] [-- vulkan_bench.py flags]
#
# Logs land in $OUT; the SUMMARY lines are printed last.
set -u -o pipefail
source scripts/h200_lib.sh
export WGPU_BACKEND_TYPE=Vulkan
WHL=${WHL:-../.whl} GL=${GL:-../.gl}
START=$SECONDS
{
  for f in "$GL"/*.deb; do dpkg -x "$f" /; done
  ldconfig
  h200_wheels "$WHL"/*.whl
} >"$OUT/setup.log" 2>&1 || { tail "$OUT/setup.log"; exit 1; }
h200_editable poot-core poot-quant poot-backend-cuda poot-backend-vulkan
echo "setup $((SECONDS - START)) s"

CONFORMANCE=no
if [ "${1:-}" = conformance ]; then CONFORMANCE=yes; shift; fi
[ "${1:-}" = -- ] && shift
timeout -k 10 330 python3 poot-backend-vulkan/bench/vulkan_bench.py --backends vulkan,cuda \
  --random --tokens 48 --profile --copy-mb 256 "$@" >"$OUT/bench.log" 2>&1
echo "bench rc=$? at $((SECONDS - START)) s"
if [ $CONFORMANCE = yes ]; then  # after the bench: nothing else runs while it times
  conformance vulkan 12 150
  conformance_summary vulkan
fi
grep -A40 "decode step profile" "$OUT/bench.log" | head -45
grep -h "^SUMMARY " "$OUT/bench.log" | sed 's/^SUMMARY /  /'
echo "session $((SECONDS - START)) s"
