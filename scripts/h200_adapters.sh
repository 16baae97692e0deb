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
source scripts/h200_lib.sh
h200_wheels .whl/gguf-*.whl
h200_editable poot-core poot-quant poot-backend-cuda
POOT_FAMILY_BACKEND=cuda timeout 300 python3 -m pytest -q -p no:randomly \
  tests/test_lora.py tests/test_expert_pool.py \
  -k "merged_weights_one_batch or fully_resident_logits or shares_the_pool"
timeout 240 python3 poot-core/benchmarks/expert_pool_bench.py --backend cuda
