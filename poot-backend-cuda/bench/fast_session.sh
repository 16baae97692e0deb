#!/bin/bash
# One device call for issue 50's first slice (the `fast` precision on CUDA), from the
# repository root, with .whl (the gguf wheel) carried:
#
#   bash poot-backend-cuda/bench/fast_session.sh
#
# Parts, in the order of $PARTS (default: all), each under its own timeout (T_<part>
# seconds; defaults: conf 100, precision 90, decode and prefill 150, peer 80), cut so the
# call ends by $BUDGET + 60 seconds (default BUDGET 480: nine minutes in all; the device's
# per-call limit is ten), later parts skipped past $BUDGET:
#   conf      the conformance suite on cuda over the contraction and quantization cases
#             ($CONF_K: the pytest -k selection): pass, or a typed refusal
#   precision poot-core/tests/test_precision_models.py on cuda (fast and exact steps
#             against the oracle of the rewritten graph; the SmolLM2 checkpoint stays home)
#   decode    llama_gpu.py: the 8B-shaped 2-layer logits check (decode, and a prefill step
#             of 128 tokens: the bf16 weight read in place by the warpgroup GEMM), 8B decode in
#             $FORMATS (default bf16,Q4_0,Q4_K) at exact and fast (Q8PackedContraction's
#             integer GEMV for the packed formats), tok/s and % of copy
#   prefill   llama_gpu.py --prefill $PREFILL (default 32,512): 8B prefill steps in $FORMATS
#             at exact and fast (bf16: the warpgroup GEMM reading the weight in place, one
#             activation plane where the activations are bf16 already)
#   peer      torch_peer.py at the 8B shape: eager prefill forwards of $PREFILL tokens
#             (SDPA), then eager decode (and in one CUDA graph), bf16, random weights
# Compile-only planners fill the NVRTC cache in the background while conf and precision
# run. Logs in $OUT; a summary table last (fast against exact per row where both ran).
set -u -o pipefail
export PYTHONUNBUFFERED=1 POOT_CACHE=/tmp/poot-cache
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" "$POOT_CACHE"
B=poot-backend-cuda/bench
PARTS=${PARTS:-conf precision decode prefill peer}
FORMATS=${FORMATS:-bf16,Q4_0,Q4_K}
PREFILL=${PREFILL:-32,512}
BUDGET=${BUDGET:-480}
START=$SECONDS
SUM=$OUT/summary.txt
: >"$SUM"
row() { printf '%-62s | %s\n' "$1" "$2" >>"$SUM"; }
status() {
  local s="OK"
  if (($2 == 124 || $2 == 137)); then s="TIMEOUT"; elif (($2 != 0)); then s="FAILED (exit $2)"; fi
  row "PART $1" "$s, $3 s"
  echo "=== part $1: $s, $3 s (call at $((SECONDS - START)) s)"
}

# -- setup: wheels, editable installs (offline); kernels compiled ahead in the background --
t=$SECONDS
{
  nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm,clocks.mem --format=csv
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/gguf-*.whl
  python3 -m pip install -q --no-deps --no-build-isolation --no-index \
    -e poot-core -e poot-quant -e poot-backend-cuda
} >"$OUT/setup.log" 2>&1 || echo "SETUP FAILED" | tee -a "$OUT/setup.log"
export PYTHONPATH=/tmp/site:$B
python3 -c "import poot, poot_cuda, poot_quant, gguf; print('probe', poot_cuda.probe())" \
  >>"$OUT/setup.log" 2>&1 || echo "IMPORT FAILED" | tee -a "$OUT/setup.log"
warm=()
for f in ${FORMATS//,/ }; do   # a planner per format and kind of step: NVRTC in parallel
  (cd $B && python3 llama_gpu.py --plan --shapes 8b --formats "$f" --precision exact,fast \
    --check-layers 0 >"/tmp/warm_decode_$f.log" 2>&1) &
  warm+=($!)
  (cd $B && python3 llama_gpu.py --plan --shapes 8b --formats "$f" --precision exact,fast \
    --prefill "$PREFILL" --check-layers 0 >"/tmp/warm_prefill_$f.log" 2>&1) &
  warm+=($!)
done
(cd $B && python3 llama_gpu.py --plan --shapes 8b --formats bf16 --check-layers 2 \
  --layers 2 --prefill 1,128 >/tmp/warm_check.log 2>&1) &
warm+=($!)
tail -3 "$OUT/setup.log" | cut -c1-200 | sed 's/^/  setup: /' >>"$SUM"
status setup 0 $((SECONDS - t))
waitwarm() {   # the warmers get up to $1 more seconds, then stop
  for p in "${warm[@]}"; do
    for _ in $(seq "${1:-60}"); do kill -0 "$p" 2>/dev/null || break; sleep 1; done
    kill "$p" 2>/dev/null && echo "cache warmer $p still running: stopped"
  done
  warm=()
}

for part in $PARTS; do
  t=$SECONDS
  if ((SECONDS - START > BUDGET)); then
    row "PART $part" "SKIPPED (the call had run $((SECONDS - START)) s)"
    continue
  fi
  lim_var="T_$part"
  declare -A dflt=([conf]=100 [precision]=90 [decode]=150 [prefill]=150 [peer]=80)
  lim=${!lim_var:-${dflt[$part]:-120}}
  left=$((BUDGET + 60 - (SECONDS - START)))
  ((lim > left)) && lim=$left
  case $part in
    conf)
      sel=${CONF_K:-"Contraction or QuantizeI8 or MatMul"}
      timeout -k 5 "$lim" python3 -m pytest -q -p no:cacheprovider -n 8 --pyargs \
        poot.conformance --poot-backend cuda -k "$sel" >"$OUT/conformance.log" 2>&1
      rc=$?
      line=$(grep -E '[0-9]+ (passed|failed)' "$OUT/conformance.log" | tail -1)
      grep -E '^(FAILED|ERROR)' "$OUT/conformance.log" | cut -c1-200 | head -12
      row "conformance on cuda ($sel)" "${line:-no summary line}" ;;
    precision)
      timeout -k 5 "$lim" python3 -m pytest -q -p no:cacheprovider -rs \
        poot-core/tests/test_precision_models.py -k "cuda and not smollm2" \
        >"$OUT/precision.log" 2>&1
      rc=$?
      line=$(grep -E '[0-9]+ (passed|failed|skipped)' "$OUT/precision.log" | tail -1)
      grep -E '^(FAILED|ERROR)' "$OUT/precision.log" | cut -c1-200 | head -8
      row "test_precision_models.py on cuda" "${line:-no summary line}" ;;
    decode)
      waitwarm 45
      timeout -k 5 "$lim" bash -c "cd $B && python3 llama_gpu.py --shapes 8b \
        --formats $FORMATS --precision exact,fast --profile none --check-layers 2 \
        --check-prefill 128" \
        >"$OUT/decode.log" 2>&1
      rc=$?
      grep -E 'Error|error' "$OUT/decode.log" | cut -c1-200 | tail -6 ;;
    prefill)
      timeout -k 5 "$lim" bash -c "cd $B && python3 llama_gpu.py --shapes 8b \
        --formats $FORMATS --precision exact,fast --prefill $PREFILL --check-layers 0 \
        --profile none" \
        >"$OUT/prefill.log" 2>&1
      rc=$?
      grep -E 'Error|error' "$OUT/prefill.log" | cut -c1-200 | tail -6 ;;
    peer)
      timeout -k 5 "$lim" python3 $B/torch_peer.py --shape 8b --prefill "$PREFILL" \
        >"$OUT/peer.log" 2>&1
      rc=$?
      left=$((BUDGET + 60 - (SECONDS - START)))
      if ((rc == 0 && left > 30)); then
        timeout -k 5 $((left < 90 ? left : 90)) python3 $B/torch_peer.py --shape 8b \
          --steps 100 --no-compile >>"$OUT/peer.log" 2>&1 || rc=$?
      fi ;;
    *) echo "unknown part $part"; rc=2 ;;
  esac
  status "$part" $rc $((SECONDS - t))
done

for p in "${warm[@]}"; do kill "$p" 2>/dev/null; done
grep -h '^SUMMARY ' "$OUT"/*.log 2>/dev/null | sed 's/^SUMMARY //' >/tmp/summary_rows.txt
awk -F' [|] ' '{printf "  %-60s | %s\n", $1, $2}' /tmp/summary_rows.txt >>"$SUM"
# fast against exact: each "<shape> <format> fast <rest>" row beside "<shape> <format> <rest>"
awk -F' [|] ' '
  { split($2, v, " "); rate[$1] = v[1] }
  END {
    for (k in rate) {
      n = split(k, w, " ")
      if (n < 3 || w[3] != "fast") continue
      base = w[1] " " w[2]; for (i = 4; i <= n; i++) base = base " " w[i]
      if ((base in rate) && rate[base] > 0)
        printf "  %-60s | %.2fx exact (%s vs %s tok/s)\n", "fast/exact " base, rate[k] / rate[base], rate[k], rate[base]
    }
  }' /tmp/summary_rows.txt | sort >>"$SUM"
echo
echo "=========== SUMMARY ($(date -u +%FT%TZ), call $((SECONDS - START)) s) ==========="
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1
cut -c1-220 "$SUM"
