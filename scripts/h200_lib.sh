# Shared set-up for the device scripts (scripts/h200_*.sh), sourced from the repository root
# on the GPU machine. Nothing runs on sourcing but the exports.
export PYTHONUNBUFFERED=1 POOT_CACHE=${POOT_CACHE:-/tmp/poot-cache} NCCL_NVLS_ENABLE=0
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export __EGL_VENDOR_LIBRARY_FILENAMES=${__EGL_VENDOR_LIBRARY_FILENAMES:-/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" "$POOT_CACHE/models"

# The stream scripts/h200_stage.sh cut into /root/stash/c00, c01, ...: the tar of .whl and
# .gl, then SmolLM2, then Gemma 3 (absent when only the first chunks were staged). Unpacked
# once per machine: the Vulkan loaders, the wheels into /tmp/site, the models by sha256.
h200_unstage() {
  local tar=${POOT_STAGE_TAR:-37898240} smol=98362432 m=$POOT_CACHE/models
  if [ ! -s /tmp/stream.done ]; then
    cat /root/stash/c* >/tmp/stream || return 1
    head -c "$tar" /tmp/stream | tar xf - || return 1
    tail -c +$((tar + 1)) /tmp/stream | head -c $smol >"$m/SmolLM2-135M-Instruct.Q4_1.gguf"
    tail -c +$((tar + smol + 1)) /tmp/stream >"$m/gemma-3-270m-q4_k_m.gguf"
    rm /tmp/stream
    # Gemma 3 only when every chunk of it was staged
    (($(stat -c %s "$m/gemma-3-270m-q4_k_m.gguf") == 253113024)) || rm "$m/gemma-3-270m-q4_k_m.gguf"
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
    h200_wheels .whl/*.whl || return 1
    echo ok >/tmp/stream.done
  fi
  export PYTHONPATH=/tmp/site
  (cd "$m" && sha256sum -c --ignore-missing - <<'SUMS') || return 1
b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  SmolLM2-135M-Instruct.Q4_1.gguf
a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  gemma-3-270m-q4_k_m.gguf
SUMS
}

# h200_wheels WHEEL...: carried wheels into /tmp/site, first on the path.
h200_wheels() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$@" >>"$OUT/setup.log" 2>&1 || { tail "$OUT/setup.log"; return 1; }
  export PYTHONPATH=/tmp/site
}

# h200_editable DIR...: the project's packages, editable, over the carried wheels.
h200_editable() {
  local args=()
  for d in "$@"; do args+=(-e "$d"); done
  python3 -m pip install -q --no-deps --no-build-isolation --no-index "${args[@]}" \
    >>"$OUT/setup.log" 2>&1 || { echo "EDITABLE INSTALL FAILED"; tail "$OUT/setup.log"; }
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
}

# h200_bench_setup: a bench call's carried wheels ($WHL, default ../.whl: the call runs in
# a copy of the tree one level down) and the packages it times, editable.
h200_bench_setup() {
  h200_wheels "${WHL:-../.whl}"/*.whl || return 1
  h200_editable poot-core poot-quant poot-backend-cuda
}

# h200_gpu_apis_setup: a call comparing the GPU APIs (vulkan, wgpu, cuda), from the
# repository root carrying .whl, .whl2 and .gl: the staged real models where the stash has
# them (a failed unstage leaves none, so the bench falls back to random weights), the
# Vulkan loaders, the wheels, the five packages editable.
h200_gpu_apis_setup() {
  if [ -s /root/stash/c00 ]; then
    h200_unstage >>"$OUT/setup.log" 2>&1 ||
      { echo "no staged model"; rm -f "$POOT_CACHE"/models/*.gguf; }
  fi
  { for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig; } >>"$OUT/setup.log" 2>&1
  h200_wheels .whl/gguf-*.whl .whl2/*.whl || return 1
  h200_editable poot-core poot-quant poot-backend-cuda poot-backend-vulkan poot-backend-wgpu
}

# conformance BACKEND WORKERS SECONDS [FILTER]: the suite on one backend (the cases pytest's
# -k FILTER selects, where given), its support matrix and log in $OUT, the exit status as the
# log's last line.
conformance() {
  local only=()
  [ -n "${4:-}" ] && only=(-k "$4")
  timeout -k 10 "$3" python3 -m pytest -q -p no:cacheprovider -n "$2" --pyargs poot.conformance \
    --poot-backend "$1" --poot-support "$OUT/support_$1_h200.md" -rf ${only[@]+"${only[@]}"} \
    -W ignore::pytest.PytestAssertRewriteWarning >"$OUT/conformance_$1.log" 2>&1
  echo "rc=$?" >>"$OUT/conformance_$1.log"
}

# conformance_summary BACKEND: its failures and pass counts, one line each.
conformance_summary() {
  local log=$OUT/conformance_$1.log
  grep -E '^(FAILED|ERROR)' "$log" | cut -c1-200 | head -8
  echo "conformance $1: $(grep -E '[0-9]+ (passed|failed)' "$log" | tail -1) $(tail -1 "$log")"
  grep -h "declared cases" "$log" | head -2
}

# serve_start BACKEND [ARGS...]: `poot serve smollm2` on port 8000 in the background ($SERVER);
# serve_wait: until /health answers (0) or the server exits (1); serve_up: both;
# serve_down stops it.
serve_start() {
  local backend=$1
  shift
  python3 -m poot serve smollm2 --backend "$backend" --host 127.0.0.1 --port 8000 \
    --max-batch 32 --max-seq 512 --max-queue 64 "$@" >"$OUT/server.log" 2>&1 &
  SERVER=$!
}
serve_wait() {
  for _ in $(seq 300); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/health', timeout=2)" \
      2>/dev/null && { grep -m3 -iE "serving|planned|error" "$OUT/server.log"; return 0; }
    kill -0 "$SERVER" 2>/dev/null || { tail -20 "$OUT/server.log"; return 1; }
    sleep 1
  done
  return 1
}
serve_up() {
  serve_start "$@"
  serve_wait
}
serve_down() {
  kill "$SERVER"
  wait "$SERVER" 2>/dev/null
}
