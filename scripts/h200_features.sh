#!/bin/bash
# One H200 call for what landed on 2026-12-01 (third session), from the repository root,
# after scripts/h200_stage.sh's chunks are in /root/stash (wheels, Vulkan loaders, SmolLM2;
# POOT_STAGE_GEMMA=0 when the Gemma 3 chunks were not staged):
#
#   bash scripts/h200_features.sh
#
# Correctness, side by side: the conformance suite on cuda and on vulkan (support matrices
# to $OUT), the new sparse/scan ops' GPU tests, the seeded sampler on cuda against the
# reference backend, LoRA and the expert pool on cuda, a 1-rank NCCL communicator inside a
# recorded step. Then timings, one at a time: `poot serve` with 1 and 32 clients, the
# Vulkan bf16 GEMV against a shader copy.
set -u -o pipefail
export PYTHONUNBUFFERED=1 POOT_CACHE=/tmp/poot-cache NCCL_NVLS_ENABLE=0
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" "$POOT_CACHE/models"
START=$SECONDS
TAR=${POOT_STAGE_TAR:-32819200} SMOL=98362432
if [ ! -s /tmp/stream.done ]; then
  cat /root/stash/c* >/tmp/stream || exit 1
  head -c "$TAR" /tmp/stream | tar xf - || exit 1
  tail -c +$((TAR + 1)) /tmp/stream | head -c $SMOL >"$POOT_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
  rm /tmp/stream
  echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $POOT_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf" |
    sha256sum -c - || exit 1
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >"$OUT/setup.log" 2>&1 || { tail "$OUT/setup.log"; exit 1; }
  echo ok >/tmp/stream.done
fi
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e poot-core -e poot-quant \
  -e poot-backend-cuda -e poot-backend-wgpu -e poot-backend-vulkan >>"$OUT/setup.log" 2>&1 ||
  { echo "EDITABLE INSTALL FAILED"; tail "$OUT/setup.log"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

conformance() {  # BACKEND WORKERS
  timeout -k 10 280 python3 -m pytest -q -p no:cacheprovider -n "$2" --pyargs poot.conformance \
    --poot-backend "$1" --poot-support "$OUT/support_$1.md" -rf \
    -W ignore::pytest.PytestAssertRewriteWarning >"$OUT/conf_$1.log" 2>&1
  echo "rc=$?" >>"$OUT/conf_$1.log"
}
conformance cuda 6 &
conformance vulkan 4 &
{
  echo "== sparse/scan ops on cuda"
  timeout 200 python3 -m pytest -q -p no:randomly -p no:cacheprovider \
    poot-backend-cuda/tests/test_gpu.py -k "block or selected or scan" 2>&1 | tail -2
  for b in reference cuda; do
    echo "== seeded sampler on $b"
    timeout 150 python3 -m poot run smollm2 --backend "$b" --max-tokens 16 --temperature 0.8 \
      --seed 7 --prompt "The capital of France is" --quiet 2>&1 | tail -2
  done
  echo "== greedy on cuda"
  timeout 100 python3 -m poot run smollm2 --backend cuda --max-tokens 16 \
    --prompt "The capital of France is" 2>&1 | tail -2
  echo "== LoRA and the expert pool on cuda"
  POOT_FAMILY_BACKEND=cuda timeout 200 python3 -m pytest -q -p no:randomly -p no:cacheprovider \
    tests/test_lora.py tests/test_expert_pool.py \
    -k "merged_weights_one_batch or fully_resident_logits or shares_the_pool" 2>&1 | tail -2
  echo "== 1-rank NCCL communicator in a recorded step"
  timeout 150 python3 poot-backend-cuda/bench/tp_check.py collectives --ranks 1 2>&1 | tail -6
} >"$OUT/features.log" 2>&1 &
wait
cat "$OUT/features.log"
for b in cuda vulkan; do
  grep -E '^(FAILED|ERROR)' "$OUT/conf_$b.log" | cut -c1-200 | head -8
  echo "conformance $b: $(grep -E '[0-9]+ (passed|failed)' "$OUT/conf_$b.log" | tail -1) $(tail -1 "$OUT/conf_$b.log")"
  grep -h "declared cases" "$OUT/conf_$b.log" | head -1
done
echo "=== correctness done at $((SECONDS - START)) s"

python3 -m poot serve smollm2 --backend cuda --host 127.0.0.1 --port 8000 \
  --max-batch 32 --max-seq 512 --max-queue 64 >"$OUT/server.log" 2>&1 &
server=$!
for _ in $(seq 200); do
  python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/health', timeout=2)" \
    2>/dev/null && break
  kill -0 $server 2>/dev/null || break
  sleep 1
done
timeout 120 python3 poot-core/benchmarks/serve_bench.py --url http://127.0.0.1:8000 \
  --clients 1,32 --max-tokens 128 --no-serial >"$OUT/serve_bench.log" 2>&1
tail -8 "$OUT/serve_bench.log"
kill $server
wait $server 2>/dev/null
timeout 60 python3 poot-backend-vulkan/bench/vulkan_bench.py --skip-decode 2>&1 | grep SUMMARY
echo "=== done at $((SECONDS - START)) s"
