#!/bin/bash
# llama.cpp CUDA against poot on one GGUF (issue 50), one device call from the repository
# root, carrying .peer (llama.cpp.tar.xz: llama.cpp's source stripped to what llama-bench
# with GGML_CUDA builds from) and the gguf wheel (.whl):
#
#   bash poot-backend-cuda/bench/llamacpp_peer.sh
#
# Steps, each under `timeout`, logs in $OUT, a table last (also $OUT/summary.txt):
#   build    (background) llama-bench for sm_90a only, Release, Ninja, -j16 under nice:
#            GGML_CUDA_FA_QUANTS=f16-f16 (the default f16 KV cache's flash-attention
#            kernels only: other K/V type pairs are instances nobody here runs), no fatbin
#            compression (saves the compression pass), NCCL and OpenSSL off (one GPU, no
#            downloads). Killed at $BUILD_BY seconds into the call: then no llama.cpp row.
#   gguf     random_gguf.py writes the Llama-3-8B-shaped file in each of $FORMATS to /tmp
#            (while the build runs)
#   poot     llama_gpu.py --gguf: decode (graph replay at position 100) and one prefill
#            step of 512 tokens, exact and fast, over those files, while the build runs:
#            its tok/s come from CUDA events around queued graph launches, which a busy
#            host does not stretch (the build is niced)
#   llama    llama-bench -p 512 -n 128 -ngl 99 -r 3 -fa on on each file once built (the GPU
#            is free by then: poot is done)
# Everything is bounded so the call ends by $BUDGET seconds (default 570; the limit is 600).
# $GGUF_ARGS goes to random_gguf.py ("--shape tiny": a dry run's few-MB files).
# A second call on the still-warm machine resumes: ninja rebuilds nothing it finished, the
# files already written are kept (their .done marks), POOT=0 skips poot's step.
set -u -o pipefail
source scripts/h200_lib.sh                 # OUT, POOT_CACHE, h200_wheels, h200_editable
B=poot-backend-cuda/bench
FORMATS=${FORMATS:-Q4_0 Q4_K}
BUDGET=${BUDGET:-570}
BUILD_BY=${BUILD_BY:-470}
T_POOT=${T_POOT:-330}
JOBS=${JOBS:-16}
SRC=/tmp/llama.cpp
BUILD=/tmp/llama-build
START=$SECONDS
SUM=$OUT/summary.txt
: >"$SUM"
row() { printf '%-28s | %s\n' "$1" "$2" | tee -a "$SUM"; }
at() { echo $((SECONDS - START)); }
left() { echo $((BUDGET - (SECONDS - START))); }
bound() { local l; l=$(left); echo $(($1 < l ? $1 : (l > 1 ? l : 1))); }
verdict() {  # exit status -> word
  if (($1 == 124 || $1 == 137)); then echo TIMEOUT; elif (($1)); then echo "FAILED ($1)"; else echo OK; fi
}
step() {  # NAME SECONDS COMMAND...: the command under timeout, its log $OUT/NAME.log
  local name=$1 lim t=$SECONDS rc
  lim=$(bound "$2")
  shift 2
  timeout -k 5 "$lim" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  row "step $name" "$(verdict $rc), $((SECONDS - t)) s (limit $lim s), done at $(at) s"
  return $rc
}

# -- the source unpacked (Python's tarfile where the image has no xz) ---------------------
nproc
step unpack 60 bash -c "tar xJf .peer/llama.cpp.tar.xz -C /tmp || python3 -c \"import tarfile; \
tarfile.open('.peer/llama.cpp.tar.xz').extractall('/tmp')\"" || exit 1

# -- build in the background: the whole of it dies at BUILD_BY ---------------------------
CMAKE_ARGS=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
  -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_CUDA_NCCL=OFF
  -DGGML_CUDA_FA_QUANTS=f16-f16 -DGGML_CUDA_COMPRESSION_MODE=none
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
  -DLLAMA_BUILD_APP=OFF)
build_started=$SECONDS
by=$((BUILD_BY - $(at)))
timeout -k 5 $((by > 1 ? by : 1)) bash -c "
  cmake -S $SRC -B $BUILD ${CMAKE_ARGS[*]} >'$OUT/configure.log' 2>&1 &&
  nice -n 10 ninja -C $BUILD -j$JOBS llama-bench >'$OUT/build.log' 2>&1" &
BUILD_PID=$!

# -- setup while it builds: the gguf wheel, poot editable ---------------------------------
h200_wheels .whl/gguf-*.whl || exit 1
h200_editable poot-core poot-quant poot-backend-cuda

# -- the files, then poot on them (the GPU is poot's alone until the build is done) -----
files=()
for f in $FORMATS; do
  path=/tmp/llama8b-$f.gguf
  if [ -e "$path.done" ] || step "gguf_$f" 150 python3 $B/random_gguf.py "$path" \
    --type "$f" ${GGUF_ARGS:-}; then
    touch "$path.done"
    files+=("$path")
  fi
  ls -l "$path" 2>/dev/null
done
if ((${#files[@]})) && ((${POOT:-1})); then
  list=$(IFS=,; echo "${files[*]}")
  step poot "$T_POOT" python3 $B/llama_gpu.py --gguf "$list" --prefill 512 --decode \
    --precision exact,fast --check-layers 0 --profile none
  grep '^SUMMARY' "$OUT/poot.log"
fi

# -- llama-bench on the same files, once built ------------------------------------------
wait $BUILD_PID
brc=$?
row "step build" "$(verdict $brc) after $((SECONDS - build_started)) s ($(tail -1 \
  "$OUT/build.log" 2>/dev/null | cut -c1-60)), done at $(at) s"
if ((brc)); then
  echo "=== llama.cpp was not built by $BUILD_BY s (exit $brc): no llama.cpp rows"
  tail -5 "$OUT/configure.log" "$OUT/build.log" 2>/dev/null
fi
if [ -x $BUILD/bin/llama-bench ]; then
  for path in "${files[@]}"; do
    f=$(basename "$path" .gguf)
    f=${f#llama8b-}
    (($(left) > 20)) || { row "step llama_$f" "skipped: $(left) s left"; continue; }
    # the JSON on stdout for the table, markdown and messages on stderr (the log)
    step "llama_$f" 90 bash -c "$BUILD/bin/llama-bench -m $path -p 512 -n 128 -ngl 99 \
      -r 3 -fa on -o json -oe md >$OUT/llama_$f.json"
    tail -6 "$OUT/llama_$f.log"
  done
fi

# -- one table: engine, format, pp512 and tg128 tok/s, poot over llama.cpp ----------------
python3 - "$OUT" $FORMATS <<'EOF' | tee -a "$SUM"
import json, re, sys
from pathlib import Path

out, formats = Path(sys.argv[1]), sys.argv[2:]
poot = {}
log = out / "poot.log"
for line in log.read_text().splitlines() if log.exists() else []:
    m = re.match(r"SUMMARY gguf (\S+)( fast)? (decode|prefill 512) \| ([0-9.]+) tok/s", line)
    if m:
        fmt, fast, what, value = m.groups()
        key = ("pp512" if what.startswith("prefill") else "tg128")
        poot.setdefault((fmt, "fast" if fast else "exact"), {})[key] = float(value)
llama = {}
for fmt in formats:
    path = out / f"llama_{fmt}.json"
    try:
        tests = json.loads(path.read_text())
    except (OSError, ValueError):
        tests = []
    for t in tests:
        key = "pp512" if t.get("n_prompt") == 512 and not t.get("n_gen") else \
            "tg128" if t.get("n_gen") == 128 and not t.get("n_prompt") else None
        if key:
            llama.setdefault(fmt, {})[key] = float(t["avg_ts"])
print(f"{'engine':<24} {'format':<6} {'pp512 tok/s':>12} {'tg128 tok/s':>12} "
      f"{'pp512 / llama.cpp':>18} {'tg128 / llama.cpp':>18}")


def cell(v):
    return f"{v:12.1f}" if v is not None else f"{'-':>12}"


def ratio(a, b):
    return f"{a / b:18.2f}" if a is not None and b else f"{'-':>18}"


for fmt in formats:
    ref = llama.get(fmt, {})
    print(f"{'llama.cpp CUDA (fa on)':<24} {fmt:<6} {cell(ref.get('pp512'))} "
          f"{cell(ref.get('tg128'))} {ratio(ref.get('pp512'), ref.get('pp512'))} "
          f"{ratio(ref.get('tg128'), ref.get('tg128'))}")
    for prec in ("exact", "fast"):
        got = poot.get((fmt, prec), {})
        print(f"{'poot cuda ' + prec:<24} {fmt:<6} {cell(got.get('pp512'))} "
              f"{cell(got.get('tg128'))} {ratio(got.get('pp512'), ref.get('pp512'))} "
              f"{ratio(got.get('tg128'), ref.get('tg128'))}")
print("poot tg128: one decode step at position 100 (graph replay); llama.cpp tg128: the "
      "mean over positions 0..127")
EOF
echo "=== done at $(at) s"
