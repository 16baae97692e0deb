#!/usr/bin/env bash
# The main job: set up, fetch SmolLM2-135M, and generate from a prompt on the best
# backend this machine has (the compiled cpu backend where there is no GPU); it ends with
# a line giving the prefill and decode tokens/s and the backend that ran them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
poot backends
poot pull smollm2
poot run smollm2 --prompt "${POOT_PROMPT:-The capital of France is}" --max-tokens "${POOT_MAX_TOKENS:-24}"
