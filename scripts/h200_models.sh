#!/bin/bash
# Gemma 3 270M beside SmolLM2-135M on the cuda backend: decode tok/s of both in one run.
# One command, from the repository root on the GPU machine, with the gguf wheel carried in
# .whl/ (the device image lacks it):
#
#   bash scripts/h200_models.sh
#
# The models are random-weight stand-ins of each file's exact shape and storage formats
# (poot-core/benchmarks/family_decode.py) unless the real GGUFs are in $POOT_CACHE: the
# Gemma 3 file (253 MB) is over the device's 64 MiB transfer. Then the Gemma 3 architecture
# tests on random weights run on cuda, every HF family and the GGUF Qwen3 / MoE files
# (tests/test_families.py, tests/test_gguf_families.py, cuda in place of reference).
set -u -o pipefail
export PYTHONUNBUFFERED=1 POOT_CACHE=${POOT_CACHE:-/tmp/poot-cache}
mkdir -p "$POOT_CACHE"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/gguf-*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-index \
  -e poot-core -e poot-quant -e poot-backend-cuda || echo "EDITABLE INSTALL FAILED"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 420 python3 poot-core/benchmarks/family_decode.py --backend cuda --tokens 128
POOT_FAMILY_BACKEND=cuda timeout 200 python3 -m pytest -q -p no:randomly -x \
  tests/test_families.py tests/test_gguf_families.py -k "matches_numpy or sliding_layers"
