#!/bin/bash
# Tensor parallelism through NCCL (issue 19), run from the repository root on a GPU machine:
#
#   bash poot-backend-cuda/bench/tp_session.sh
#
# with .whl (carried wheels: gguf at least) and .model (smol.part1, smol.part2, SIZE, SHA256:
# the SmolLM2 GGUF, as h200_session.sh takes it) beside the repo. Parts, each under its own
# timeout; a failing part never stops the later ones:
#   1. setup: carried wheels, editable installs, the SmolLM2 GGUF reassembled; NCCL's version
#      through CuPy; the GPU count
#   2. one H200: the collectives' conformance over a 1-rank NCCL communicator inside a
#      recorded step (tp_check.py collectives --ranks 1)
#   with 2 GPUs or more:
#   3. the collectives' conformance over every GPU (tp_check.py collectives)
#   4. SmolLM2 greedy 32 tokens, `poot run --tp 2` against one GPU: the same text
#   5. the 8B-shaped decode benchmark (random bf16 weights), 1 GPU and --tp 2: tok/s and the
#      collectives' time per step
# NCCL_NVLS_ENABLE=0 (NVLink multicast off) is set for everything here, and the launcher sets
# it again for every rank process. Logs land in $OUT; the summary table is printed last.
set -u -o pipefail
export PYTHONUNBUFFERED=1 POOT_CACHE=/tmp/poot-cache NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" "$POOT_CACHE"
B=poot-backend-cuda/bench
SUM=$OUT/tp_summary.txt
: >"$SUM"
row() { printf '%-64s | %s\n' "$1" "$2" >>"$SUM"; }
status() {  # NAME RC SECONDS
  local s="OK"
  if (($2 == 124 || $2 == 137)); then s="TIMEOUT"; elif (($2 != 0)); then s="FAILED (exit $2)"; fi
  row "PART $1" "$s, $3 s"
  echo "=== part $1: $s, $3 s"
}
collect() { grep -h '^SUMMARY ' "$@" 2>/dev/null | sed 's/^SUMMARY //' |
  awk -F' [|] ' '{printf "  %-62s | %s\n", $1, $2}' >>"$SUM"; }

# -- 1. setup ---------------------------------------------------------------------------
t=$SECONDS
rc=0
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >"$OUT/tp_setup.log" 2>&1 && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index \
  -e poot-core -e poot-quant -e poot-backend-cuda >>"$OUT/tp_setup.log" 2>&1 || rc=1
python3 - >>"$OUT/tp_setup.log" 2>&1 <<'EOF' || rc=1
from cupy.cuda import nccl
import poot_cuda
print("nccl", nccl.get_version(), "probe", poot_cuda.probe())
EOF
GPUS=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
GGUF=""
if [ -f .model/smol.part1 ] && [ -f .model/smol.part2 ]; then
  cat .model/smol.part1 .model/smol.part2 >/tmp/smol.gguf
  if [ "$(sha256sum /tmp/smol.gguf | cut -d' ' -f1)" = "$(cut -d' ' -f1 <.model/SHA256)" ]; then
    GGUF=/tmp/smol.gguf
  fi
fi
echo "GPUs: $GPUS, model: ${GGUF:-missing}" | tee -a "$OUT/tp_setup.log"
tail -3 "$OUT/tp_setup.log"
row "GPUs / SmolLM2 GGUF" "$GPUS / ${GGUF:-missing}"
status "1 setup" $rc $((SECONDS - t))

# -- 2. one rank: NCCL inside a recorded step -------------------------------------------
t=$SECONDS
timeout -k 10 240 python3 $B/tp_check.py collectives --ranks 1 >"$OUT/tp_collectives_1.log" 2>&1
rc=$?
grep -E 'FAILED|Error' "$OUT/tp_collectives_1.log" | head -8
collect "$OUT/tp_collectives_1.log"
status "2 collectives, 1 rank" $rc $((SECONDS - t))

if ((GPUS >= 2)); then
  # -- 3. every GPU ---------------------------------------------------------------------
  t=$SECONDS
  timeout -k 10 300 python3 $B/tp_check.py collectives >"$OUT/tp_collectives_n.log" 2>&1
  rc=$?
  grep -E 'FAILED|Error' "$OUT/tp_collectives_n.log" | head -8
  collect "$OUT/tp_collectives_n.log"
  status "3 collectives, $GPUS ranks" $rc $((SECONDS - t))

  # -- 4. SmolLM2 greedy, --tp 2 against one GPU ------------------------------------------
  t=$SECONDS
  rc=1
  if [ -n "$GGUF" ]; then
    P="The capital of France is"
    timeout -k 10 300 poot run "$GGUF" --backend cuda --prompt "$P" --max-tokens 32 \
      >"$OUT/tp_greedy_1.txt" 2>"$OUT/tp_greedy_1.log" &&
      timeout -k 10 300 poot run "$GGUF" --backend cuda --prompt "$P" --max-tokens 32 \
        --tp 2 >"$OUT/tp_greedy_2.txt" 2>"$OUT/tp_greedy_2.log"
    rc=$?
    if ((rc == 0)) && cmp -s "$OUT/tp_greedy_1.txt" "$OUT/tp_greedy_2.txt"; then
      row "SmolLM2 greedy 32 tokens, --tp 2 vs 1 GPU" "same text"
    else
      row "SmolLM2 greedy 32 tokens, --tp 2 vs 1 GPU" "DIFFERENT or failed (rc $rc)"
      rc=1
    fi
    for n in 1 2; do
      row "  poot run stats, $n GPU(s)" "$(grep -h 'decode:' "$OUT/tp_greedy_$n.log" | tail -1)"
    done
  fi
  status "4 SmolLM2 greedy --tp 2" $rc $((SECONDS - t))

  # -- 5. the 8B-shaped decode, 1 GPU and --tp 2 ---------------------------------------
  t=$SECONDS
  timeout -k 10 420 python3 $B/tp_check.py bench --shape 8b --ranks 1 >"$OUT/tp_bench_1.log" 2>&1
  rc1=$?
  timeout -k 10 420 python3 $B/tp_check.py bench --shape 8b --ranks 2 >"$OUT/tp_bench_2.log" 2>&1
  rc=$?
  ((rc1)) && rc=$rc1
  collect "$OUT/tp_bench_1.log" "$OUT/tp_bench_2.log"
  status "5 8B-shaped decode, 1 GPU and --tp 2" $rc $((SECONDS - t))
else
  row "parts 3-5 (2+ GPUs)" "not run: $GPUS GPU(s) here"
fi

echo
echo "=== summary"
cat "$SUM"
