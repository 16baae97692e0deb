#!/bin/bash
# One device call that checks the precision rewrite on cuda, from the repository root,
# with .whl (the gguf wheel) carried:
#
#   bash poot-backend-cuda/bench/precision_session.sh
#
# the conformance suite on cuda (the QuantizeI8, q8-row and f16/q8_0 KV cases among the
# rest: pass or typed refusal), the teacher-forced fast and exact steps against the oracle
# (poot-core/tests/test_precision_models.py), then the backend's own GPU tests. Logs in $OUT.
set -u -o pipefail
export PYTHONUNBUFFERED=1 POOT_CACHE=/tmp/poot-cache
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" "$POOT_CACHE"
{
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/gguf-*.whl
  python3 -m pip install -q --no-deps --no-build-isolation --no-index \
    -e poot-core -e poot-quant -e poot-backend-cuda
} >"$OUT/setup.log" 2>&1 || { echo "SETUP FAILED"; tail -5 "$OUT/setup.log"; }
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import poot_cuda; print('probe', poot_cuda.probe())"
run() {  # name, seconds, command...
  local name=$1 lim=$2; shift 2
  local t=$SECONDS
  timeout -k 5 "$lim" "$@" >"$OUT/$name.log" 2>&1
  echo "=== $name: exit $?, $((SECONDS - t)) s: $(grep -E '[0-9]+ (passed|failed)' "$OUT/$name.log" | tail -1)"
  grep -E '^(FAILED|ERROR)' "$OUT/$name.log" | cut -c1-200 | head -12
}
run conformance "${T_conf:-300}" python3 -m pytest -q -p no:cacheprovider -n 8 --pyargs \
  poot.conformance --poot-backend cuda --poot-support "$OUT/support-cuda.md"
run precision "${T_precision:-200}" python3 -m pytest -q -p no:cacheprovider -rs \
  poot-core/tests/test_precision_models.py -k "not smollm2"
run gpu_tests "${T_gpu:-240}" python3 -m pytest -q -p no:cacheprovider -n 8 poot-backend-cuda/tests
