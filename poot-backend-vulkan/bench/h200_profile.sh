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
export PYTHONUNBUFFERED=1 POOT_CACHE=/tmp/poot-cache WGPU_BACKEND_TYPE=Vulkan
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
OUT=${OUT:-/tmp/out}
WHL=${WHL:-../.whl} GL=${GL:-../.gl}
mkdir -p "$OUT" "$POOT_CACHE"
START=$SECONDS
{
  for f in "$GL"/*.deb; do dpkg -x "$f" /; done
  ldconfig
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHL"/*.whl
} >"$OUT/setup.log" 2>&1 || { tail "$OUT/setup.log"; exit 1; }
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e poot-core -e poot-quant \
  -e poot-backend-cuda -e poot-backend-vulkan >>"$OUT/setup.log" 2>&1 ||
  { echo "EDITABLE INSTALL FAILED"; tail "$OUT/setup.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "setup $((SECONDS - START)) s"

CONFORMANCE=no
if [ "${1:-}" = conformance ]; then CONFORMANCE=yes; shift; fi
[ "${1:-}" = -- ] && shift
timeout -k 10 330 python3 poot-backend-vulkan/bench/vulkan_bench.py --backends vulkan,cuda \
  --random --tokens 48 --profile --copy-mb 256 "$@" >"$OUT/bench.log" 2>&1
echo "bench rc=$? at $((SECONDS - START)) s"
if [ $CONFORMANCE = yes ]; then  # after the bench: nothing else runs while it times
  timeout -k 10 150 python3 -m pytest -q -p no:cacheprovider -n 12 --pyargs poot.conformance \
    --poot-backend vulkan --poot-support "$OUT/support_vulkan_h200.md" -rf \
    -W ignore::pytest.PytestAssertRewriteWarning >"$OUT/conformance.log" 2>&1
  echo "conformance rc=$? at $((SECONDS - START)) s"
  tail -3 "$OUT/conformance.log"
fi
grep -A40 "decode step profile" "$OUT/bench.log" | head -45
grep -h "^SUMMARY " "$OUT/bench.log" | sed 's/^SUMMARY /  /'
echo "session $((SECONDS - START)) s"
