#!/bin/bash
# The landed backends and features checked on one H200, in two device calls from the
# repository root:
#
#   bash scripts/h200_validate.sh check   # correctness, run side by side (about 6 min)
#   bash scripts/h200_validate.sh time    # timings, one at a time (about 6 min)
#
# The wheels the device image lacks (.whl), the Vulkan loader packages (.gl) and the real
# SmolLM2 and Gemma 3 GGUFs travel as one stream cut into chunks (/root/stash/c00, c01, ...
# left by earlier calls; see scripts/h200_stage.sh), reassembled and checked by sha256 here.
#   check: the conformance suite on cuda and on vulkan (NVIDIA's Vulkan driver); `poot run`
#          of SmolLM2 on cuda, vulkan and wgpu and of Gemma 3 270M on cuda (real files);
#          the 10,000-step decode soak on cuda
#   time:  SmolLM2 decode tok/s on vulkan, wgpu and cuda side by side and bf16 GEMV GB/s
#          against a copy (vulkan_bench.py); Gemma 3 beside SmolLM2 on cuda
#          (family_decode.py); `poot serve` with 1 and 32 streaming clients (serve_bench.py)
# Logs land in $OUT; a summary is printed last.
set -u -o pipefail
PART=${1:-check}
export PYTHONUNBUFFERED=1 POOT_CACHE=/tmp/poot-cache NCCL_NVLS_ENABLE=0
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
export WGPU_BACKEND_TYPE=Vulkan
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" "$POOT_CACHE/models"
SUM=$OUT/summary.txt
: >"$SUM"
START=$SECONDS
row() { printf '%-44s | %s\n' "$1" "$2" >>"$SUM"; }

# -- setup: reassemble the stream, install, check the models -----------------------------
# the stream's parts, as scripts/h200_stage.sh printed their sizes
TAR=${POOT_STAGE_TAR:-32819200} SMOL=98362432
if [ ! -s /tmp/stream.done ]; then
  cat /root/stash/c* >/tmp/stream || exit 1
  head -c "$TAR" /tmp/stream | tar xf - || exit 1
  tail -c +$((TAR + 1)) /tmp/stream | head -c $SMOL >"$POOT_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
  tail -c +$((TAR + SMOL + 1)) /tmp/stream >"$POOT_CACHE/models/gemma-3-270m-q4_k_m.gguf"
  rm /tmp/stream
  (cd "$POOT_CACHE/models" && sha256sum -c - <<'EOF') >"$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  SmolLM2-135M-Instruct.Q4_1.gguf
a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  gemma-3-270m-q4_k_m.gguf
EOF
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >>"$OUT/setup.log" 2>&1 || { tail "$OUT/setup.log"; exit 1; }
  echo ok >/tmp/stream.done
fi
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e poot-core -e poot-quant \
  -e poot-backend-cuda -e poot-backend-wgpu -e poot-backend-vulkan >>"$OUT/setup.log" 2>&1 ||
  { echo "EDITABLE INSTALL FAILED"; tail "$OUT/setup.log"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 120 python3 -m poot backends 2>&1 | grep -A1 -E "^(cuda|vulkan|wgpu)" | cut -c1-160

conformance() {  # BACKEND WORKERS
  timeout -k 10 330 python3 -m pytest -q -p no:cacheprovider -n "$2" --pyargs poot.conformance \
    --poot-backend "$1" --poot-support "$OUT/support_$1_h200.md" -rf \
    -W ignore::pytest.PytestAssertRewriteWarning >"$OUT/conformance_$1.log" 2>&1
  echo "rc=$?" >>"$OUT/conformance_$1.log"
}

if [ "$PART" = check ]; then
  conformance cuda 6 &
  conformance vulkan 6 &
  {
    for b in cuda vulkan wgpu; do
      echo "== smollm2 on $b"
      timeout 150 python3 -m poot run smollm2 --backend "$b" --max-tokens 24 \
        --prompt "The capital of France is" 2>&1 | tail -4
    done
    echo "== gemma3-270m on cuda"
    timeout 150 python3 -m poot run gemma3-270m --backend cuda --max-tokens 24 \
      --prompt "The capital of France is" 2>&1 | tail -4
    echo "== gemma3-270m chat on cuda"
    timeout 150 python3 -m poot run gemma3-270m --backend cuda --max-tokens 32 --chat \
      --prompt "Name three colours." 2>&1 | tail -4
    echo "== soak on cuda"
    timeout 200 python3 poot-core/benchmarks/decode_soak.py --backend cuda --steps 10000 \
      --json "$OUT/soak_cuda.json" 2>&1 | tail -12
  } >"$OUT/runs.log" 2>&1 &
  wait
  cat "$OUT/runs.log"
  for b in cuda vulkan; do
    grep -E '^(FAILED|ERROR)' "$OUT/conformance_$b.log" | cut -c1-200 | head -8
    row "conformance $b" "$(grep -E '[0-9]+ (passed|failed)' "$OUT/conformance_$b.log" | tail -1) $(tail -1 "$OUT/conformance_$b.log")"
    grep -h "declared cases" "$OUT/conformance_$b.log" | head -2 >>"$SUM"
  done
fi

if [ "$PART" = time ]; then
  timeout 240 python3 poot-backend-vulkan/bench/vulkan_bench.py --tokens 64 \
    >"$OUT/vulkan_bench.log" 2>&1
  tail -12 "$OUT/vulkan_bench.log"
  grep -h '^SUMMARY ' "$OUT/vulkan_bench.log" | sed 's/^SUMMARY /  /' >>"$SUM"
  timeout 150 python3 poot-core/benchmarks/family_decode.py --backend cuda --tokens 128 \
    >"$OUT/family.log" 2>&1
  tail -4 "$OUT/family.log" | tee -a "$SUM"
  python3 -m poot serve smollm2 --backend cuda --host 127.0.0.1 --port 8000 \
    --max-batch 32 --max-seq 512 --max-queue 64 >"$OUT/server.log" 2>&1 &
  server=$!
  for _ in $(seq 240); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/health', timeout=2)" \
      2>/dev/null && break
    kill -0 $server 2>/dev/null || break
    sleep 1
  done
  grep -m3 -iE "serving|planned|error" "$OUT/server.log"
  timeout 200 python3 poot-core/benchmarks/serve_bench.py --url http://127.0.0.1:8000 \
    --clients 1,32 --max-tokens 128 >"$OUT/serve_bench.log" 2>&1
  tail -14 "$OUT/serve_bench.log" | tee -a "$SUM"
  kill $server
  wait $server 2>/dev/null
fi

echo
echo "=== summary ($(date -u +%FT%TZ), $((SECONDS - START)) s)"
cat "$SUM"
