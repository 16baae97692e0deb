#!/bin/bash
# One H200 session for the CUDA backend (issue 8), run from the repository root:
#
#   bash poot-backend-cuda/bench/h200_session.sh
#
# with .whl (wheels the device lacks: gguf at least) and .model (smol.part1, smol.part2, SIZE,
# SHA256) beside the repo. Parts, in order; each runs under its own timeout and a failing
# part never stops the later ones:
#   1. setup: carried wheels, editable installs, the SmolLM2 GGUF reassembled and checked;
#      a background process fills the NVRTC disk cache with the SmolLM2 and bench kernels
#   2. the conformance suite on the cuda backend (pytest -n 8)
#   3. SmolLM2 greedy 32 tokens, cuda vs reference; decode tok/s with and without replay;
#      prefill tok/s                                                   (smollm2_gpu.py)
#   4. copy ceiling, GEMV/Q4 GEMV GB/s, GEMM vs torch.matmul, the SmolLM2-shaped step with
#      and without replay                                              (bench_gpu.py)
#   5. the PyTorch peer: eager and torch.compile(reduce-overhead)      (torch_peer.py)
# Full logs land in $OUT (at most 8 files); a summary table is printed last.
# POOT_SESSION_BUDGET (seconds, default 470) bounds the whole session: each part's timeout
# is its own cap or what is left after the later parts' minimum shares, whichever is less.
set -u -o pipefail
export PYTHONUNBUFFERED=1 POOT_CACHE=/tmp/poot-cache
export TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor-cache TRITON_CACHE_DIR=/tmp/triton-cache
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" "$POOT_CACHE"
B=poot-backend-cuda/bench
BUDGET=${POOT_SESSION_BUDGET:-470}
START=$SECONDS
SUM=$OUT/summary.txt
: >"$SUM"

row() { printf '%-58s | %s\n' "$1" "$2" >>"$SUM"; }
left() { echo $((BUDGET - (SECONDS - START))); }
# limit CAP RESERVE: CAP seconds, or what is left after RESERVE seconds for later parts
limit() {
  local l=$(($(left) - $2))
  ((l > $1)) && l=$1
  ((l < 30)) && l=30
  echo $l
}
# status NAME RC SECONDS LIMIT: one summary row per part (timeout's 124/137 say TIMEOUT)
status() {
  local s="OK"
  if (($2 == 124 || $2 == 137)); then s="TIMEOUT after $4 s"; elif (($2 != 0)); then
    s="FAILED (exit $2)"; fi
  row "PART $1" "$s, $3 s"
  echo "=== part $1: $s, $3 s (session at $((SECONDS - START)) s)"
}
banner() { echo; echo "=== part $1 (session at $((SECONDS - START)) s, $(left) s left)"; }
# collect LOG: its SUMMARY lines into the summary table
collect() { grep -h '^SUMMARY ' "$@" 2>/dev/null | sed 's/^SUMMARY //' |
  awk -F' [|] ' '{printf "  %-56s | %s\n", $1, $2}' >>"$SUM"; }

# -- 1. setup ---------------------------------------------------------------------------
banner "1 setup"
t=$SECONDS
rc=0
{
  python3 --version
  nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm,clocks.mem --format=csv
} >"$OUT/setup.log" 2>&1
if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >>"$OUT/setup.log" 2>&1; then
  export PYTHONPATH=/tmp/site
else
  echo "installing every carried wheel failed; trying gguf alone" | tee -a "$OUT/setup.log"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/gguf-*.whl >>"$OUT/setup.log" 2>&1 && export PYTHONPATH=/tmp/site
  rc=1
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index \
  -e poot-core -e poot-quant -e poot-backend-cuda >>"$OUT/setup.log" 2>&1 || {
  echo "EDITABLE INSTALL FAILED" | tee -a "$OUT/setup.log"
  rc=1
}
python3 - >>"$OUT/setup.log" 2>&1 <<'EOF' || { echo "IMPORT CHECK FAILED"; rc=1; }
import gguf, numpy, poot, poot_cuda, poot_quant
from poot.plugin import backends
print("gguf", getattr(gguf, "__version__", "?"), "numpy", numpy.__version__)
print("backends", sorted(backends()))
print("probe", poot_cuda.probe())
EOF
tail -4 "$OUT/setup.log"
# the SmolLM2 GGUF travels as two parts (part1 may be left on the machine by an earlier call)
model_ok=0
if [ -f .model/smol.part1 ] && [ -f .model/smol.part2 ] && [ -f .model/SIZE ] &&
  [ -f .model/SHA256 ]; then
  cat .model/smol.part1 .model/smol.part2 >/tmp/smol.gguf
  size=$(stat -c %s /tmp/smol.gguf)
  want_size=$(tr -d ' \n' <.model/SIZE)
  sha=$(sha256sum /tmp/smol.gguf | cut -d' ' -f1)
  want_sha=$(cut -d' ' -f1 <.model/SHA256 | tr -d ' \n')
  if [ "$size" = "$want_size" ] && [ "$sha" = "$want_sha" ]; then
    model_ok=1
    export POOT_SMOLLM2_GGUF=/tmp/smol.gguf
    echo "model: /tmp/smol.gguf, $size bytes, sha256 matches" | tee -a "$OUT/setup.log"
  else
    echo "MODEL CHECK FAILED: $size bytes (want $want_size), sha256 $sha (want $want_sha)" |
      tee -a "$OUT/setup.log"
  fi
else
  echo "MODEL MISSING: $(ls -l .model 2>&1 | tr '\n' ' ')" | tee -a "$OUT/setup.log"
fi
((model_ok)) || rc=1
row "model /tmp/smol.gguf size + sha256" "$( ((model_ok)) && echo OK || echo FAILED)"
# kernels compiled ahead on another machine with the same NVRTC (13.0.88) for sm_90
[ -d .cudacache ] && cp -r .cudacache/. "$POOT_CACHE"/ &&
  echo "carried NVRTC cache: $(ls "$POOT_CACHE" | wc -l) kernels" | tee -a "$OUT/setup.log"
# fill the NVRTC disk cache while the conformance suite runs (compile-only, no GPU context)
warm=()
python3 $B/bench_gpu.py --plan >/tmp/warm_bench.log 2>&1 &
warm+=($!)
if ((model_ok)); then
  python3 $B/smollm2_gpu.py --plan >/tmp/warm_smollm2.log 2>&1 &
  warm+=($!)
fi
status "1 setup" $rc $((SECONDS - t)) -

# -- 2. conformance suite on cuda ------------------------------------------------------
banner "2 conformance (cuda)"
t=$SECONDS
lim=$(limit 200 210)
if [ "${POOT_SKIP_CONFORMANCE:-0}" = 1 ]; then
  echo "skipped (POOT_SKIP_CONFORMANCE=1: run in an earlier call)" >"$OUT/conformance.log"
  rc=0
else
  timeout -k 10 "$lim" python3 -m pytest -q -p no:cacheprovider -n 8 --pyargs \
    poot.conformance --poot-backend cuda --poot-support "$OUT/support_cuda.md" \
    >"$OUT/conformance.log" 2>&1
  rc=$?
fi
grep -E '^(FAILED|ERROR)' "$OUT/conformance.log" | cut -c1-160 | head -12
grep -E '^(declared cases|=+ poot conformance)' "$OUT/conformance.log" | cut -c1-220 | head -3
line=$(grep -E '[0-9]+ (passed|failed|error)' "$OUT/conformance.log" | tail -1)
echo "${line:-no pytest summary line (see conformance.log)}"
row "conformance suite, cuda" "${line:-no summary line}"
status "2 conformance" $rc $((SECONDS - t)) "$lim"

# the cache warmers are compile-only; let them finish (bounded) before anything is timed
for p in "${warm[@]}"; do
  for _ in $(seq 60); do kill -0 "$p" 2>/dev/null || break; sleep 1; done
  kill "$p" 2>/dev/null && echo "cache warmer $p still running after 60 s: stopped"
done
wait 2>/dev/null
echo "cache warmers: $(tail -qn1 /tmp/warm_*.log 2>/dev/null | tr '\n' ';')"

# -- 3. SmolLM2 on cuda vs reference ---------------------------------------------------
banner "3 smollm2 (cuda vs reference)"
t=$SECONDS
lim=$(limit 150 ${POOT_RESERVE_AFTER_MODEL:-150})
if ((model_ok)); then
  timeout -k 10 "$lim" python3 $B/smollm2_gpu.py --tokens 32 >"$OUT/smollm2.log" 2>&1
  rc=$?
  grep -E '(\] (ids|text|decode|prefill|first|loaded)|MATCH|MISMATCH|Error|error)' \
    "$OUT/smollm2.log" | cut -c1-240 | tail -16
else
  echo "no checked model: SmolLM2's shape with random Q4_1 weights instead" |
    tee "$OUT/smollm2.log"
  timeout -k 10 "$lim" python3 $B/smollm2_gpu.py --random --tokens 32 >>"$OUT/smollm2.log" 2>&1
  rc=$?
  grep -E '(\] (ids|text|decode|prefill|first|loaded)|MATCH|MISMATCH|Error|error|random)' \
    "$OUT/smollm2.log" | cut -c1-240 | tail -16
fi
status "3 smollm2" $rc $((SECONDS - t)) "$lim"

# -- 4. kernel and step benchmark ------------------------------------------------------
banner "4 bench_gpu"
t=$SECONDS
lim=$(limit 150 ${POOT_RESERVE_AFTER_BENCH:-90})
timeout -k 10 "$lim" python3 $B/bench_gpu.py >"$OUT/bench.log" 2>&1
rc=$?
grep -E 'Error|error' "$OUT/bench.log" | cut -c1-200 | tail -8
awk 'BEGIN{b=0} /^$/{b=NR} {l[NR]=$0} END{for(i=b+1;i<=NR;i++) print l[i]}' "$OUT/bench.log" |
  cut -c1-160 | tail -24
status "4 bench_gpu" $rc $((SECONDS - t)) "$lim"

# -- 5. the PyTorch peer ---------------------------------------------------------------
banner "5 torch peer"
t=$SECONDS
lim=$(limit 200 5)
ct=$((lim - 45))
((ct < 20)) && ct=20
peer_args=(--compile-timeout "$ct")
[ "${POOT_TORCH_COMPILE:-1}" = 0 ] && peer_args=(--no-compile)
timeout -k 10 "$lim" python3 $B/torch_peer.py "${peer_args[@]}" >"$OUT/torch_peer.log" 2>&1
rc=$?
grep -vE '^SUMMARY ' "$OUT/torch_peer.log" | cut -c1-200 | tail -8
status "5 torch peer" $rc $((SECONDS - t)) "$lim"

# -- summary ---------------------------------------------------------------------------
{
  echo "  numbers:"
} >>"$SUM"
collect "$OUT/smollm2.log" "$OUT/bench.log" "$OUT/torch_peer.log"
echo
echo "================ SUMMARY ($(date -u +%FT%TZ), session $((SECONDS - START)) s) ================"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1
cat "$SUM"
echo "logs in \$OUT: $(ls "$OUT" | tr '\n' ' ')"
