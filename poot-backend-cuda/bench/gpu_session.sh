#!/bin/bash
# One device session: install the packages offline, run the CUDA tests on the GPU, benchmark.
set -o pipefail
export PYTHONUNBUFFERED=1 POOT_CACHE=/tmp/poot-cache
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# packages the device image lacks travel as wheels in .whl (importlib-metadata, gguf, zipp)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-index \
  -e poot-core -e poot-quant -e poot-backend-cuda 2>&1 | grep -v WARNING | tail -3
nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv
python3 -c "import poot_cuda; print(poot_cuda.probe())"
timeout 240 python3 -m pytest -q -p no:cacheprovider -n 8 --maxfail=30 poot-backend-cuda/tests \
  2>&1 | tee "$OUT/tests.log" | grep -v "^\(PASSED\|\.\)" | tail -40
timeout 150 python3 poot-backend-cuda/bench/bench_gpu.py 2>&1 | tee "$OUT/bench.log" | tail -25
