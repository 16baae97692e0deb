#!/bin/bash
# The real SmolLM2 on cuda in one device call, from the repository root, after an earlier
# call on the same warm machine left the GGUF's first part in /root/stash (the working tree
# travels with at most 64 MiB):
#
#   split -b 50M -d ~/.cache/poot/models/SmolLM2-135M-Instruct.Q4_1.gguf .stage/s
#   call 1 (carry .stage/s00 ...):  mkdir -p /root/stash && cp .stage/s00 /root/stash/; ...
#   call 2 (carry .whl .stage/s01): bash poot-core/benchmarks/smollm2_cuda_session.sh
#
# .whl holds gguf, starlette, uvicorn, h11, sniffio, anyio and idna wheels. Parts, each
# under its own timeout, SUMMARY-style lines collected last:
#   ttft      smollm2_gpu.py: greedy ids against the reference, decode with and without
#             graph replay, prefill of a 1,000-token prompt (time to first token)
#   peer      torch_peer.py at the SmolLM2 shape: eager prefill of 1,000 tokens, decode
#   speculate speculate.py --backend cuda (prompt lookup and self-speculation)
#   profile   step_profile.py --backends cuda: launches and kinds per decode step
#   serve     `poot serve smollm2 --backend cuda`: seconds to /health and /ready, then
#             serve_bench.py with 1 and 32 streaming clients
#   warmstart the same server again on the kernel cache serve left: seconds from launch to
#             /health and to the first completion's answer (the 15 s target)
#   prefix    two servers, with and without the prefix cache: serve_bench.py
#             --shared-prefix (a ~1,000-token system text) with 32 clients, then
#             serve_load.py (200 requests, Poisson arrivals at 16 a second, half of them
#             opening with one 400-word system text)
set -u -o pipefail
source scripts/h200_lib.sh
M=$POOT_CACHE/models
mkdir -p /root/stash
PARTS=${PARTS:-ttft peer speculate profile serve warmstart prefix}
START=$SECONDS
cp .stage/s01 /root/stash/ 2>/dev/null
cat /root/stash/s00 /root/stash/s01 >"$M/SmolLM2-135M-Instruct.Q4_1.gguf"
(cd "$M" && sha256sum -c - <<'SUMS') || { echo "SmolLM2 GGUF incomplete"; exit 1; }
b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  SmolLM2-135M-Instruct.Q4_1.gguf
SUMS
h200_wheels .whl/*.whl || exit 1
h200_editable poot-core poot-quant poot-backend-cuda
export POOT_SMOLLM2_GGUF=$M/SmolLM2-135M-Instruct.Q4_1.gguf
echo "set up in $((SECONDS - START)) s"

part() {   # part NAME SECONDS COMMAND...: run, log to $OUT/NAME.log, say how it ended
  local name=$1 lim=$2 t=$SECONDS
  shift 2
  timeout -k 5 "$lim" "$@" >"$OUT/$name.log" 2>&1
  echo "=== $name: exit $?, $((SECONDS - t)) s (call at $((SECONDS - START)) s)"
  if grep -q SUMMARY "$OUT/$name.log"; then
    grep -E "SUMMARY|Error|error:" "$OUT/$name.log" | cut -c1-220 | tail -30
  else
    tail -22 "$OUT/$name.log" | cut -c1-220
  fi
}
serve() {   # seconds to /health and to /ready, then serve_bench.py (h200_lib's server)
  local t=$SECONDS health="" ready=""
  serve_start cuda $SERVE_ARGS
  for _ in $(seq 400); do
    kill -0 "$SERVER" 2>/dev/null || { tail -20 "$OUT/server.log"; return 1; }
    [ -z "$health" ] && python3 -c "import urllib.request as u
u.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null && health=$((SECONDS - t))
    python3 -c "import urllib.request as u
u.urlopen('http://127.0.0.1:8000/ready', timeout=2)" 2>/dev/null && { ready=$((SECONDS - t)); break; }
    sleep 0.5
  done
  echo "SUMMARY serve startup on cuda: /health after ${health:-?} s, /ready after ${ready:-?} s"
  grep -m4 -iE "serving|planned|ready" "$OUT/server.log" | cut -c1-200
  timeout 150 python3 poot-core/benchmarks/serve_bench.py --url http://127.0.0.1:8000 \
    --clients 1,32 --max-tokens 128 --no-serial
  serve_down
}
SERVE_ARGS="--max-seq 2048"
first_answer() {   # seconds from launch ($1, in $SECONDS) until a completion comes back
  python3 - "$1" "$SECONDS" <<'PY'
import json, sys, time, urllib.request
body = json.dumps({"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 8,
                   "temperature": 0}).encode()
t0 = time.time() - (int(sys.argv[2]) - int(sys.argv[1]))
for _ in range(1200):
    try:
        req = urllib.request.Request("http://127.0.0.1:8000/v1/completions", body,
                                     {"content-type": "application/json"})
        text = json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]["text"]
        break
    except OSError:
        time.sleep(0.25)
print(f"SUMMARY serve warm start on cuda: first completion {time.time() - t0:.1f} s after "
      f"launch: {text!r}")
PY
}
warmstart() {
  local t=$SECONDS
  serve_start cuda $SERVE_ARGS
  first_answer $t
  grep -m4 -iE "serving|planned|ready" "$OUT/server.log" | cut -c1-200
  serve_down
}
prefix() {   # port 8000 caches prefixes, 8001 does not
  serve_start cuda $SERVE_ARGS
  python3 -m poot serve smollm2 --backend cuda --host 127.0.0.1 --port 8001 --max-batch 32 \
    --max-queue 64 $SERVE_ARGS --no-prefix-cache >"$OUT/server2.log" 2>&1 &
  local other=$!
  for port in 8000 8001; do
    for _ in $(seq 300); do
      python3 -c "import urllib.request as u
u.urlopen('http://127.0.0.1:$port/ready', timeout=2)" 2>/dev/null && break
      sleep 1
    done
  done
  timeout 200 python3 poot-core/benchmarks/serve_bench.py \
    --url http://127.0.0.1:8000,http://127.0.0.1:8001 --shared-prefix ${PREFIX_WORDS:-950} --clients 32 \
    --max-tokens 16
  timeout 120 python3 poot-core/benchmarks/serve_load.py \
    --url http://127.0.0.1:8000,http://127.0.0.1:8001 --requests 200 --rate 16 \
    --input-words 100 --output-tokens 64 --prefix-share 0.5 --prefix-words 400
  kill $other; wait $other 2>/dev/null
  serve_down
}
B=poot-backend-cuda/bench
for p in $PARTS; do
  case $p in
    ttft) part ttft 120 python3 $B/smollm2_gpu.py --long-prompt 1000 --max-seq 1536 ;;
    peer) part peer 90 python3 $B/torch_peer.py --prefill 1000 --steps 100 --no-compile ;;
    speculate) part speculate 150 python3 poot-core/benchmarks/speculate.py --backend cuda \
      --repeat 2 ;;
    profile) part profile 60 python3 poot-core/benchmarks/step_profile.py --backends cuda ;;
    serve | warmstart | prefix) t=$SECONDS; $p >"$OUT/$p.log" 2>&1
      echo "=== $p: $((SECONDS - t)) s"; grep -vE "^\s*$" "$OUT/$p.log" | tail -14 ;;
  esac
done
echo "call took $((SECONDS - START)) s"
