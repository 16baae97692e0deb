#!/bin/bash
# LoRA adapters and the expert pool on the cuda backend. One command, from the repository
# root on the GPU machine, with the gguf wheel carried in .whl/ as for h200_models.sh:
#
#   bash scripts/h200_adapters.sh
#
# Runs, with cuda in place of reference: several adapters in one batched paged decode
# against the merged weights in numpy (tests/test_lora.py), the pooled experts against full
# residency bit for bit and a batch sharing the pool (tests/test_expert_pool.py); then the
# expert pool's decode tok/s against full residency (poot-core/benchmarks/expert_pool_bench.py).
set -u -o pipefail
export PYTHONUNBUFFERED=1 POOT_CACHE=${POOT_CACHE:-/tmp/poot-cache}
mkdir -p "$POOT_CACHE"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/gguf-*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-index \
  -e poot-core -e poot-quant -e poot-backend-cuda || echo "EDITABLE INSTALL FAILED"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
POOT_FAMILY_BACKEND=cuda timeout 300 python3 -m pytest -q -p no:randomly \
  tests/test_lora.py tests/test_expert_pool.py \
  -k "merged_weights_one_batch or fully_resident_logits or shares_the_pool"
timeout 240 python3 poot-core/benchmarks/expert_pool_bench.py --backend cuda
