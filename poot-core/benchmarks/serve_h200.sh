#!/bin/bash
# `poot serve` on the H200 (issue 18), in one device call after scripts/h200_stage.sh's chunks
# (wheels, Vulkan debs, the real SmolLM2 GGUF) are in /root/stash. Run from the root of a
# checkout that has scripts/h200_lib.sh; SRC names the tree whose packages are tested
# (default: the same root):
#
#   SRC=.dev-serve18 bash .dev-serve18/poot-core/benchmarks/serve_h200.sh
#
# 1. while the server plans its steps in the background: batch_step.py's b=1, 8, 32 decode
#    steps (random weights; b=32 profiled by kernel kind), the
#    conformance suite on cuda and the cuda Llama steps against the
#    oracle (test_model.py); then until every plan is made (/stats plans_waiting 0);
# 2. SmolLM2 on cuda, 32 batch rows, max_seq 512: serve_bench.py with 1 and 32 concurrent
#    streaming clients x 128 tokens and the same requests one at a time (greedy texts
#    compared), then 1 and 32 again (the spread between two runs of one version);
# 3. two prompts' greedy 16 tokens from the server against the reference backend's;
# 4. with SERVE_B="ARGS": a second server with those arguments (--no-overlap: every greedy
#    step waited for before the next; --prefill-batch 4: no wide prefill plans),
#    serve_bench.py 1 and 32 clients on it twice, for a before/after in one call.
# The SUMMARY rows are printed last; logs land in $OUT.
set -u -o pipefail
source scripts/h200_lib.sh
SRC=${SRC:-.}
START=$SECONDS
h200_unstage >"$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }
cd "$SRC" || exit 1
h200_editable poot-core poot-quant poot-backend-cuda
python3 -c "import poot_cuda; print('probe', poot_cuda.probe())" || exit 1
echo "set up in $((SECONDS - START)) s"

serve_start cuda
serve_wait || exit 1
echo "server answering at $((SECONDS - START)) s"
python3 - <<'PY'
import json, time, urllib.request
body = json.dumps({"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 8,
                   "temperature": 0}).encode()
t0 = time.perf_counter()
req = urllib.request.Request("http://127.0.0.1:8000/v1/completions", body,
                             {"content-type": "application/json"})
text = json.load(urllib.request.urlopen(req, timeout=300))["choices"][0]["text"]
print(f"SUMMARY first request after startup (its plans made on demand) | "
      f"{time.perf_counter() - t0:.1f} s: {text!r}")
PY
(cd poot-backend-cuda/bench && timeout -k 5 120 python3 batch_step.py --batches 1,8,32 \
  --old-batches "" --rows "" --profile 32 --greedy 0 --sample argmax >"$OUT/batch_step.log" 2>&1)
grep SUMMARY "$OUT/batch_step.log" | cut -c9-150
timeout -k 5 240 python3 -m pytest -q -p no:cacheprovider -n 6 --pyargs poot.conformance \
  --poot-backend cuda -W ignore::pytest.PytestAssertRewriteWarning \
  >"$OUT/conformance.log" 2>&1
echo "cuda conformance: $(grep -E 'declared cases' "$OUT/conformance.log" | tail -1); $(tail -1 "$OUT/conformance.log")"
grep -E '^(FAILED|ERROR)' "$OUT/conformance.log" | head -5
timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider poot-backend-cuda/tests/test_model.py \
  >"$OUT/test_model.log" 2>&1
echo "cuda test_model.py: $(tail -1 "$OUT/test_model.log")"
for _ in $(seq 240); do
  python3 -c "import json, sys, urllib.request as u
s = json.load(u.urlopen('http://127.0.0.1:8000/stats', timeout=5))
sys.exit(s['plans_waiting'] > 0)" 2>/dev/null && break
  sleep 1
done
echo "every plan made at $((SECONDS - START)) s"
grep -E "planned and ran" "$OUT/server.log" | tail -2
timeout 200 python3 poot-core/benchmarks/serve_bench.py --url http://127.0.0.1:8000 \
  --clients 1,32 --max-tokens 128 >"$OUT/bench.log" 2>&1
timeout 100 python3 poot-core/benchmarks/serve_bench.py --url http://127.0.0.1:8000 \
  --clients 1,32 --max-tokens 128 --no-serial >"$OUT/bench2.log" 2>&1
cat "$OUT/bench.log"
grep -v SUMMARY "$OUT/bench2.log" | tail -6
timeout 120 python3 - >"$OUT/reference.log" 2>&1 <<'PY'
import json, urllib.request
from poot.models.runner import load
ref = load("smollm2", "reference", kv="dense", max_seq=64)
for prompt in ("The capital of France is", "def fibonacci(n):"):
    want = "".join(ref.generate(prompt, max_tokens=16))
    body = json.dumps({"model": "smollm2", "prompt": prompt, "max_tokens": 16,
                       "temperature": 0}).encode()
    req = urllib.request.Request("http://127.0.0.1:8000/v1/completions", body,
                                 {"content-type": "application/json"})
    got = json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["text"]
    print(f"SUMMARY serve cuda vs reference, greedy 16 tokens of {prompt!r} | "
          f"{'equal' if got == want else f'DIFFER: {got!r} vs {want!r}'}")
PY
serve_down
grep -iE "error|traceback" "$OUT/server.log" | head -5
if [ -n "${SERVE_B:-}" ]; then
  mv "$OUT/server.log" "$OUT/server_a.log"
  # shellcheck disable=SC2086 # SERVE_B is a list of arguments
  serve_start cuda $SERVE_B
  serve_wait && python3 -c "import json, time, urllib.request as u
for _ in range(240):
    if json.load(u.urlopen('http://127.0.0.1:8000/stats', timeout=5))['plans_waiting'] == 0:
        break
    time.sleep(1)"
  echo "server [$SERVE_B] planned at $((SECONDS - START)) s"
  for r in 1 2; do
    timeout 100 python3 poot-core/benchmarks/serve_bench.py --url http://127.0.0.1:8000 \
      --clients 1,32 --max-tokens 128 --no-serial 2>&1 \
      | sed "s/SUMMARY serve/SUMMARY [$SERVE_B] serve/" >"$OUT/bench_b$r.log"
    grep -v SUMMARY "$OUT/bench_b$r.log" | tail -6
  done
  serve_down
fi
echo "=== summary ($(date -u +%FT%TZ), $((SECONDS - START)) s)"
grep -h SUMMARY "$OUT/bench.log" "$OUT/bench2.log" "$OUT/reference.log" \
  "$OUT"/bench_b?.log 2>/dev/null
tail -3 "$OUT/reference.log" | grep -v SUMMARY
