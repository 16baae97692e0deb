#!/usr/bin/env bash
# Install every poot package of this checkout (editable) and what they need, on a fresh
# Debian machine: Mesa lavapipe for the wgpu backend, the CUDA compiler for the CUDA
# backend's compile checks, the test tools. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

bash scripts/install-lavapipe.sh

pkgs=(-e "poot-core[models,serve,test]")
for p in poot-quant poot-backend-cuda poot-backend-wgpu tests/plugins/poot-backend-toy; do
  [ -f "$p/pyproject.toml" ] && pkgs+=(-e "$p")
done
python3 -m pip install --quiet "${pkgs[@]}"
