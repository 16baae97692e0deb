#!/usr/bin/env bash
# Set up and run the whole test suite (what CI runs). The real model is fetched first
# so that the whole-model tests run rather than skip.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
poot pull smollm2
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/poot-xdg}"; mkdir -p -m 0700 "$XDG_RUNTIME_DIR"
python3 -m pytest -q "$@"
