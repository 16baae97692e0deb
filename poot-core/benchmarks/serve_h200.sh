#!/bin/bash
# `poot serve` on the H200 (issue 18): SmolLM2 on the CUDA backend with 32 batch rows, then
# serve_bench.py with 1 and 32 concurrent streaming clients (128 tokens each, and the same
# requests one at a time). Run from the repository root, in one device call:
#
#   bash poot-core/benchmarks/serve_h200.sh
#
# carrying .whl (wheels the device lacks: gguf, starlette, uvicorn, h11, click, anyio,
# sniffio) and .model (smol.part1, smol.part2: the SmolLM2 GGUF split, as for
# poot-backend-cuda/bench/h200_session.sh; /tmp/smol.gguf is used if an earlier call left it).
# Prints the server's startup line, the benchmark table and the SUMMARY rows (the target:
# aggregate tok/s with 32 clients >= 8x the single client's); logs land in $OUT.
set -u -o pipefail
export PYTHONUNBUFFERED=1 POOT_CACHE=/tmp/poot-cache
OUT=${OUT:-/tmp/out}
PORT=${PORT:-8000}
mkdir -p "$OUT" "$POOT_CACHE"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >"$OUT/setup.log" 2>&1 && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-index \
  -e poot-core -e poot-quant -e poot-backend-cuda >>"$OUT/setup.log" 2>&1
python3 -c "import gguf, starlette, uvicorn, poot_cuda; print('probe', poot_cuda.probe())" ||
  { tail -20 "$OUT/setup.log"; exit 1; }
model=/tmp/smol.gguf
[ -s "$model" ] || cat .model/smol.part1 .model/smol.part2 >"$model" || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

python3 -m poot serve "$model" --name smollm2 --backend cuda --host 127.0.0.1 --port "$PORT" \
  --max-batch 32 --max-seq 512 --max-queue 64 >"$OUT/server.log" 2>&1 &
server=$!
python3 - "$PORT" "$server" <<'PY' || { tail -30 "$OUT/server.log"; kill $server; exit 1; }
import os, sys, time, urllib.request
port, pid = sys.argv[1], int(sys.argv[2])
deadline = time.time() + 360
while time.time() < deadline:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).read()
        sys.exit(0)
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            sys.exit("the server exited")
        time.sleep(1)
sys.exit("the server did not answer in 360 s")
PY
grep -E "planned|serving" "$OUT/server.log"
timeout 200 python3 poot-core/benchmarks/serve_bench.py --url "http://127.0.0.1:$PORT" \
  --clients 1,32 --max-tokens 128 2>&1 | tee "$OUT/bench.log"
kill $server
wait $server 2>/dev/null
grep -iE "error|traceback" "$OUT/server.log" | head -5
