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
set -u -o pipefail
source scripts/h200_lib.sh
M=$POOT_CACHE/models
mkdir -p /root/stash
PARTS=${PARTS:-ttft peer speculate profile serve}
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
  serve_start cuda
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
B=poot-backend-cuda/bench
for p in $PARTS; do
  case $p in
    ttft) part ttft 120 python3 $B/smollm2_gpu.py --long-prompt 1000 --max-seq 1536 ;;
    peer) part peer 90 python3 $B/torch_peer.py --prefill 1000 --steps 100 --no-compile ;;
    speculate) part speculate 150 python3 poot-core/benchmarks/speculate.py --backend cuda \
      --repeat 2 ;;
    profile) part profile 60 python3 poot-core/benchmarks/step_profile.py --backends cuda ;;
    serve) t=$SECONDS; serve >"$OUT/serve.log" 2>&1
      echo "=== serve: $((SECONDS - t)) s"; grep -vE "^\s*$" "$OUT/serve.log" | tail -14 ;;
  esac
done
echo "call took $((SECONDS - START)) s"
