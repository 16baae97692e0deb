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
source scripts/h200_lib.sh
h200_wheels .whl/gguf-*.whl
h200_editable poot-core poot-quant poot-backend-cuda
timeout 420 python3 poot-core/benchmarks/family_decode.py --backend cuda --tokens 128
POOT_FAMILY_BACKEND=cuda timeout 200 python3 -m pytest -q -p no:randomly -x \
  tests/test_families.py tests/test_gguf_families.py -k "matches_numpy or sliding_layers"
