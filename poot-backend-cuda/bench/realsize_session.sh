#!/bin/bash
# One H200 call for issue 16 (decode at real model sizes), run from the repository root:
#
#   PARTS="bench peer8b" bash poot-backend-cuda/bench/realsize_session.sh
#
# with .whl (gguf at least) carried. Parts, in the order given by $PARTS (default: all):
#   conf       the conformance suite on cuda (pytest -n 8), the support matrix it writes
#              (support-cuda.md: docs/support/cuda-<gpu>.md)
#   memcheck   compute-sanitizer memcheck over the contraction, attention, norm, argmax and
#              model cases ($MEMCHECK_K: another pytest -k selection)
#   racecheck  compute-sanitizer racecheck over the norm, contraction, matmul (the warpgroup
#              GEMM's staged epilogue), argmax and attention cases ($RACECHECK_K)
#   variants   the schedules apart from the defaults (test_gpu.py -k variants: the
#              contraction schedule's switches off, decode attention workgroup sizes)
#              against the oracle, under compute-sanitizer memcheck
#   smollm2    SmolLM2-135M's shape (random Q4_1 weights: the checkpoint does not travel)
#              greedy 32 tokens cuda vs reference, decode tok/s; again without the
#              compile passes in $SMOLLM2_OFF (e.g. "gated") when set
#   bench      llama_gpu.py: the 8B-shaped 2-layer logits check (decode at two positions,
#              a prefill step of $CHECK_PREFILL tokens, default 128), 8B and 1B decode in bf16,
#              Q4_0 and Q4_K (profiled 8B steps); $VARIANTS compares contraction schedules
#              (llama_gpu.py --variants); $SHAPES / $FORMATS narrow it
#   prefill    llama_gpu.py --prefill: 8B prefill steps of $PREFILL tokens (default 32,512:
#              the default chunk, and one wide enough for the bf16 planes) in
#              $PREFILL_FORMATS (default Q4_K,bf16), tok/s under each variant of
#              $PREFILL_VARIANTS (e.g. ";PLANE_MIN_ROWS=100000": without the planes)
#   sweep      llama_gpu.py over the 8B Q4_0/Q4_K steps under each GEMV schedule variant of
#              $SWEEP (';'-separated, e.g. "SHARED_BYTES=32768;RUN_COLUMNS=1"), no profile
#   grids      wave_sweep.py: the packed decode GEMVs alone by grid size (workgroups, waves,
#              GB/s of copy) under each variant of $GRIDS (';'-separated, as $SWEEP);
#              $GRID_ARGS: more arguments (e.g. "--rows 2048 --bands 1,16": prefill tiles)
#   peer8b     the PyTorch peer at the 8B shape (eager, eager in a CUDA graph; torch.compile
#              when $PEER_COMPILE is a number of seconds to allow it)
#   peer1b     the same at the 1B shape
#   peersmollm2  the same at SmolLM2-135M's shape (the smollm2 part's peer)
#   gemm       wgmma_gemm.py --quick: the warpgroup GEMM against numpy on edge shapes, bf16
#              4096^3 TFLOP/s against torch.matmul in the same process; $GEMM_SCHEDULES
#              (e.g. "band=8;bn=128") timed beside the default
#   ncu        Nsight Compute over the first layer's four GEMVs of an 8B step in each format
#              of $NCU_FORMATS (default Q4_0,bf16): DRAM throughput, occupancy, warp issue
# Each part runs under its own timeout ($T_<part> seconds: 150, memcheck 300, unless set);
# a failing part never stops the later ones. Logs in $OUT (at most 8 files); SUMMARY lines
# collected into a table last.
set -u -o pipefail
export PYTHONUNBUFFERED=1 POOT_CACHE=/tmp/poot-cache
export TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor-cache TRITON_CACHE_DIR=/tmp/triton-cache
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" "$POOT_CACHE"
B=poot-backend-cuda/bench
PARTS=${PARTS:-conf memcheck racecheck variants smollm2 bench prefill peer8b peer1b peersmollm2 gemm}
VARIANTS=${VARIANTS:-}
START=$SECONDS
SUM=$OUT/summary.txt
: >"$SUM"
row() { printf '%-60s | %s\n' "$1" "$2" >>"$SUM"; }
status() {
  local s="OK"
  if (($2 == 124 || $2 == 137)); then s="TIMEOUT"; elif (($2 != 0)); then s="FAILED (exit $2)"; fi
  row "PART $1" "$s, $3 s"
  echo "=== part $1: $s, $3 s (call at $((SECONDS - START)) s)"
}
has() { [[ " $PARTS " == *" $1 "* ]]; }

# -- setup: wheels, editable installs; kernels compiled ahead in the background ----------
t=$SECONDS
{
  nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm,clocks.mem --format=csv
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/gguf-*.whl
  python3 -m pip install -q --no-deps --no-build-isolation --no-index \
    -e poot-core -e poot-quant -e poot-backend-cuda
} >/tmp/setup.log 2>&1 || echo "SETUP FAILED" | tee -a /tmp/setup.log
export PYTHONPATH=/tmp/site:$B
python3 -c "import poot, poot_cuda, poot_quant, gguf; print('probe', poot_cuda.probe())" \
  >>/tmp/setup.log 2>&1 || echo "IMPORT FAILED" | tee -a /tmp/setup.log
warm=()
if has bench; then   # one compile-only planner per shape and format: NVRTC in parallel
  IFS=';' read -ra vs <<<"${VARIANTS:-}"
  ((${#vs[@]})) || vs=("")
  for sf in 8bQ4_0 8bQ4_K 1bbf16 1bQ4_0 1bQ4_K 8bbf16; do
    s=${sf:0:2} f=${sf:2}
    [[ ",${SHAPES:-8b,1b}," == *",$s,"* && ",${FORMATS:-bf16,Q4_0,Q4_K}," == *",$f,"* ]] ||
      continue
    for v in "${vs[@]}"; do   # one process per shape, format and variant
      [ $sf = 8bbf16 ] && [ "$v" = "${vs[0]}" ] && continue   # the check warmer's
      (cd $B && python3 llama_gpu.py --plan --shapes $s --formats $f --check-layers 0 \
        --variants "$v" >/tmp/warm_$s$f${#warm[@]}.log 2>&1) &
      warm+=($!)
    done
  done
  (cd $B && python3 llama_gpu.py --plan --shapes 8b --formats bf16 --check-layers 2 \
    --variants "${vs[0]}" >/tmp/warm_check.log 2>&1) &
  warm+=($!)
fi
if has sweep; then
  IFS=';' read -ra sw <<<"${SWEEP:-}"
  for v in "${sw[@]}"; do for f in Q4_0 Q4_K; do
    (cd $B && python3 llama_gpu.py --plan --shapes 8b --formats $f --check-layers 0 \
      --variants "$v" >/tmp/warm_sweep$f${#warm[@]}.log 2>&1) &
    warm+=($!)
  done; done
fi
command -v compute-sanitizer >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
tail -4 /tmp/setup.log | cut -c1-200 | sed 's/^/  setup: /' >>"$SUM"   # $OUT keeps 8 files
status setup 0 $((SECONDS - t))
waitwarm() {
  for p in "${warm[@]}"; do
    for _ in $(seq "${1:-90}"); do kill -0 "$p" 2>/dev/null || break; sleep 1; done
    kill "$p" 2>/dev/null && echo "cache warmer $p still running: stopped"
  done
  warm=()
}

for part in $PARTS; do
  t=$SECONDS
  lim_var="T_$part"
  lim=${!lim_var:-150}
  # the sanitizers are slow over these cases (the warpgroup GEMM's MatMul cases most;
  # timings in docs/performance.md): room for them
  [ $part = memcheck ] || [ $part = racecheck ] && lim=${!lim_var:-300}
  case $part in
    conf)
      timeout -k 5 "$lim" python3 -m pytest -q -p no:cacheprovider -n 8 --pyargs \
        poot.conformance --poot-backend cuda --poot-support "$OUT/support-cuda.md" \
        >"$OUT/conformance.log" 2>&1
      rc=$?
      line=$(grep -E '[0-9]+ (passed|failed)' "$OUT/conformance.log" | tail -1)
      grep -E '^(FAILED|ERROR)' "$OUT/conformance.log" | cut -c1-160 | head -8
      row "conformance suite, cuda" "${line:-no summary line}" ;;
    memcheck | racecheck)
      sel=${MEMCHECK_K:-"Contraction or Attention or FusedRow or ArgTopK or model"}
      [ $part = racecheck ] &&
        sel=${RACECHECK_K:-"FusedRow or DenseContraction or PackedContraction or GatedContraction or ArgTopK or Attention or MatMul"}
      timeout -k 5 "$lim" compute-sanitizer --tool $part --target-processes all \
        --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -n 4 --pyargs \
        poot.conformance --poot-backend cuda -k "$sel" >"$OUT/$part.log" 2>&1
      rc=$?
      errs=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$part.log" | sort | uniq -c |
        tr '\n' ';')
      line=$(grep -E '[0-9]+ (passed|failed)' "$OUT/$part.log" | tail -1)
      row "compute-sanitizer $part ($sel)" "rc $rc; ${line:-no pytest line}; ${errs:-none}" ;;
    variants)
      timeout -k 5 "$lim" compute-sanitizer --tool memcheck --target-processes all \
        --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider \
        poot-backend-cuda/tests/test_gpu.py -k variants >/tmp/variants.log 2>&1
      rc=$?
      cat /tmp/variants.log >>"$OUT/memcheck.log"     # one log file fewer to bring back
      errs=$(grep -E 'ERROR SUMMARY' /tmp/variants.log | sort | uniq -c | tr '\n' ';')
      line=$(grep -E '[0-9]+ (passed|failed|skipped)' /tmp/variants.log | tail -1)
      row "schedule variants vs oracle, memcheck" "rc $rc; ${line:-no pytest line}; ${errs:-none}" ;;
    smollm2)
      waitwarm 60
      timeout -k 5 "$lim" python3 $B/smollm2_gpu.py --random --tokens 32 \
        >"$OUT/smollm2.log" 2>&1
      rc=$?
      if [ -n "${SMOLLM2_OFF:-}" ]; then   # the same without those compile passes
        timeout -k 5 "$lim" python3 $B/smollm2_gpu.py --random --tokens 32 --no-reference \
          --disable "$SMOLLM2_OFF" >>"$OUT/smollm2.log" 2>&1 || rc=$?
      fi ;;
    bench)   # the warmers keep compiling ahead of it
      timeout -k 5 "$lim" bash -c "cd $B && python3 llama_gpu.py --shapes ${SHAPES:-8b,1b} \
        --formats ${FORMATS:-bf16,Q4_0,Q4_K} --profile 8b --check-layers ${CHECK:-2} \
        --check-prefill ${CHECK_PREFILL:-128} --variants '$VARIANTS'" >"$OUT/bench.log" 2>&1
      rc=$?
      grep -E 'Error|error' "$OUT/bench.log" | cut -c1-200 | tail -6 ;;
    prefill)
      timeout -k 5 "$lim" bash -c "cd $B && python3 llama_gpu.py --shapes 8b \
        --formats ${PREFILL_FORMATS:-Q4_K,bf16} --prefill ${PREFILL:-32,512} \
        --check-layers 0 --variants '${PREFILL_VARIANTS:-}'" >"$OUT/prefill.log" 2>&1
      rc=$? ;;
    sweep)
      timeout -k 5 "$lim" bash -c "cd $B && python3 llama_gpu.py --shapes 8b \
        --formats Q4_0,Q4_K --profile none --check-layers 0 --variants '${SWEEP:-}'" \
        >"$OUT/sweep.log" 2>&1
      rc=$? ;;
    grids)
      timeout -k 5 "$lim" bash -c "cd $B && python3 wave_sweep.py --variants '${GRIDS:-}' ${GRID_ARGS:-}" \
        >"$OUT/grids.log" 2>&1
      rc=$? ;;
    ncu)
      : >"$OUT/ncu.log"
      for f in $(tr , ' ' <<<"${NCU_FORMATS:-Q4_0,bf16}"); do
        echo "=== ncu 8b $f" >>"$OUT/ncu.log"
        timeout -k 5 "$lim" ncu -k regex:contraction -c 4 --section SpeedOfLight \
          --section Occupancy --section LaunchStats --section WarpStateStats \
          --section MemoryWorkloadAnalysis bash -c "cd $B && python3 llama_gpu.py \
          --shapes 8b --formats $f --profile none --check-layers 0" 2>&1 |
          grep -vE '^ *(----|$)|SUMMARY' | cut -c1-150 >>"$OUT/ncu.log"
        rc=$?
      done ;;
    gemm)
      timeout -k 5 "$lim" bash -c "cd $B && python3 wgmma_gemm.py --quick \
        --schedules '${GEMM_SCHEDULES:-}'" \
        >"$OUT/gemm.log" 2>&1
      rc=$? ;;
    peer8b | peer1b | peersmollm2)
      shape=${part#peer}
      args=(--shape "$shape" --steps 100)
      if [ -n "${PEER_COMPILE:-}" ]; then args+=(--compile-timeout "$PEER_COMPILE")
      else args+=(--no-compile); fi
      timeout -k 5 "$lim" python3 $B/torch_peer.py "${args[@]}" >"$OUT/peer$shape.log" 2>&1
      rc=$? ;;
    *) echo "unknown part $part"; rc=2 ;;
  esac
  status "$part" $rc $((SECONDS - t))
done

for p in "${warm[@]}"; do kill "$p" 2>/dev/null; done
grep -h '^SUMMARY ' "$OUT"/*.log 2>/dev/null | sed 's/^SUMMARY //' |
  awk -F' [|] ' '{printf "  %-58s | %s\n", $1, $2}' >>"$SUM"
echo
echo "=========== SUMMARY ($(date -u +%FT%TZ), call $((SECONDS - START)) s) ==========="
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1
cut -c1-200 "$SUM"
