#!/usr/bin/env bash
# Set up and run the whole test suite (what CI runs). The real model is fetched first
# so that the whole-model tests run rather than skip; then the backend conformance
# suite runs on every backend this machine has (reference, the third-party toy and stride
# examples, wgpu and Vulkan on Mesa lavapipe, cpu compiled by gcc; CUDA and ROCm compile
# their kernels here and run them only on a GPU). The install matrix then builds every
# package's wheel and sdist and runs `poot` from them in fresh venvs (scripts/install_matrix.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
poot pull smollm2
poot pull gemma3-270m
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/poot-xdg}"; mkdir -p -m 0700 "$XDG_RUNTIME_DIR"
poot backends
for backend in reference toy stride wgpu vulkan cpu; do
  poot conformance "$backend" -- -q
done
python3 scripts/install_matrix.py
python3 -m pytest -q "$@"
