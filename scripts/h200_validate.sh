#!/bin/bash
# The landed backends and features checked on one H200, in two device calls from the
# repository root, after scripts/h200_stage.sh's chunks are in /root/stash:
#
#   bash scripts/h200_validate.sh check   # correctness, run side by side (about 6 min)
#   bash scripts/h200_validate.sh time    # timings, one at a time (about 6 min)
#
# or several parts in one call, in this order: check, vulkan, family, serve (time is the
# last three).
#   check: the conformance suite on cuda and on vulkan (NVIDIA's Vulkan driver); `poot run`
#          of SmolLM2 on cuda, vulkan and wgpu and of Gemma 3 270M on cuda (real files, when
#          staged); the seeded sampler on cuda against reference; the in-graph sampler,
#          hosted rows, sparse/scan ops, LoRA and the expert pool on cuda; a 1-rank NCCL
#          communicator inside a recorded step; the 10,000-step decode soak on cuda
#   vulkan: SmolLM2 decode tok/s on vulkan, wgpu and cuda side by side and bf16 GEMV GB/s
#          against a copy (vulkan_bench.py)
#   family: Gemma 3 beside SmolLM2 on cuda (family_decode.py)
#   serve: `poot serve` with 1 and 32 streaming clients (serve_bench.py)
# Logs land in $OUT; a summary is printed last.
set -u -o pipefail
PARTS=" ${*:-check} "
[[ $PARTS == *" time "* ]] && PARTS+=" vulkan family serve "
has() { [[ $PARTS == *" $1 "* ]]; }
source scripts/h200_lib.sh
export WGPU_BACKEND_TYPE=Vulkan
SUM=$OUT/summary.txt
: >"$SUM"
START=$SECONDS
row() { printf '%-44s | %s\n' "$1" "$2" >>"$SUM"; }
h200_unstage >"$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
h200_editable poot-core poot-quant poot-backend-cuda poot-backend-wgpu poot-backend-vulkan
timeout 120 python3 -m poot backends 2>&1 | grep -A1 -E "^(cuda|vulkan|wgpu)" | cut -c1-160
on_cuda() {  # a pytest selection with cuda in place of reference
  POOT_FAMILY_BACKEND=cuda timeout 200 python3 -m pytest -q -p no:randomly -p no:cacheprovider \
    "$@" 2>&1 | tail -2
}
run16() {  # BACKEND [ARGS...]: 16 tokens of SmolLM2
  timeout 150 python3 -m poot run smollm2 --backend "$1" --max-tokens 16 \
    --prompt "The capital of France is" "${@:2}" 2>&1 | tail -3
}

if has check; then
  conformance cuda 6 330 &
  conformance vulkan 6 330 &
  {
    for b in cuda vulkan wgpu; do
      echo "== smollm2 on $b"
      run16 "$b"
    done
    if [ -s "$POOT_CACHE/models/gemma-3-270m-q4_k_m.gguf" ]; then
      echo "== gemma3-270m on cuda"
      timeout 150 python3 -m poot run gemma3-270m --backend cuda --max-tokens 24 \
        --prompt "The capital of France is" 2>&1 | tail -4
    fi
    for b in reference cuda; do
      echo "== seeded sampler on $b"
      run16 "$b" --temperature 0.8 --seed 7 --quiet
    done
    echo "== in-graph sampler and hosted rows on cuda"
    on_cuda poot-core/tests/test_sample_graph.py poot-core/tests/test_hosted_rows.py -k cuda
    echo "== sparse/scan ops on cuda"
    on_cuda poot-backend-cuda/tests/test_gpu.py -k "block or selected or scan"
    echo "== LoRA and the expert pool on cuda"
    on_cuda tests/test_lora.py tests/test_expert_pool.py \
      -k "merged_weights_one_batch or fully_resident_logits or shares_the_pool"
    echo "== 1-rank NCCL communicator in a recorded step"
    timeout 150 python3 poot-backend-cuda/bench/tp_check.py collectives --ranks 1 2>&1 | tail -4
    echo "== soak on cuda"
    timeout 200 python3 poot-core/benchmarks/decode_soak.py --backend cuda --steps 10000 \
      --json "$OUT/soak_cuda.json" 2>&1 | tail -12
  } >"$OUT/runs.log" 2>&1 &
  wait
  cat "$OUT/runs.log"
  for b in cuda vulkan; do conformance_summary "$b" >>"$SUM"; done
fi

if has vulkan; then
  timeout 240 python3 poot-backend-vulkan/bench/vulkan_bench.py --tokens 64 \
    >"$OUT/vulkan_bench.log" 2>&1
  tail -12 "$OUT/vulkan_bench.log"
  grep -h '^SUMMARY ' "$OUT/vulkan_bench.log" | sed 's/^SUMMARY /  /' >>"$SUM"
fi
if has family; then
  timeout 150 python3 poot-core/benchmarks/family_decode.py --backend cuda --tokens 128 \
    >"$OUT/family.log" 2>&1
  tail -4 "$OUT/family.log" | tee -a "$SUM"
fi
if has serve; then
  serve_up cuda
  timeout 200 python3 poot-core/benchmarks/serve_bench.py --url http://127.0.0.1:8000 \
    --clients 1,32 --max-tokens 128 >"$OUT/serve_bench.log" 2>&1
  tail -14 "$OUT/serve_bench.log" | tee -a "$SUM"
  serve_down
fi

echo
echo "=== summary ($(date -u +%FT%TZ), $((SECONDS - START)) s)"
cat "$SUM"
