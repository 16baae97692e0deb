#!/usr/bin/env bash
# Set up and run the whole test suite (what CI runs). The real models are fetched first
# so that the whole-model tests run rather than skip; then the backend conformance
# suite runs on every backend this machine has (reference, the third-party stride example,
# wgpu and Vulkan on Mesa lavapipe, cpu compiled by gcc; the toy example's suite runs in
# tests/test_toy_backend.py; CUDA and ROCm compile their kernels in their packages' tests
# and run them only on a GPU). The install matrix builds every package's wheel and sdist
# and runs `poot` from them in fresh venvs (scripts/install_matrix.py); it mostly waits on
# pip and disk, so it runs beside the conformance suite. Then pytest over every package's
# tests, in $POOT_TEST_WORKERS processes (pytest-xdist; default: one per CPU).
# Arguments go to that last pytest. The wall and CPU seconds of each phase are printed last.
set -euo pipefail
cd "$(dirname "$0")/.."

# -- phase times --------------------------------------------------------------------------------
HZ=$(getconf CLK_TCK)
TIMES=()                                   # "name wall cpu" of each phase done
CURRENT=""                                 # "name start-wall start-cpu" of the one running
cpu_now() {  # CPU seconds of every child process this script has waited for
  local f; read -r -a f </proc/$$/stat
  echo $(((f[15] + f[16]) / HZ))
}
phase() {  # phase NAME COMMAND...: run COMMAND, record its wall and CPU seconds
  local name=$1 t0=$SECONDS c0; c0=$(cpu_now); shift
  CURRENT="$name $t0 $c0"
  "$@"
  TIMES+=("$name $((SECONDS - t0)) $(($(cpu_now) - c0))")
  CURRENT=""
}
report() {
  local rc=$? name wall cpu t0 c0
  echo
  echo "== scripts/test.sh phase times (wall s, CPU s of the phase's processes) =="
  for row in "${TIMES[@]}"; do
    read -r name wall cpu <<<"$row"
    printf '  %-16s %6d s wall %7d s CPU\n' "$name" "$wall" "$cpu"
  done
  if [ -n "${CURRENT:-}" ]; then
    read -r name t0 c0 <<<"$CURRENT"
    printf '  %-16s %6d s wall (failed, exit %d)\n' "$name" $((SECONDS - t0)) "$rc"
  fi
  printf '  %-16s %6d s wall %7d s CPU\n' total "$SECONDS" $(($(cpu_now) + EXTRA_CPU))
}

# -- the phases ---------------------------------------------------------------------------------
pull() {
  poot pull smollm2
  poot pull gemma3-270m
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/poot-test.XXXXXX")
EXTRA_CPU=0                                # CPU seconds of work not run as this shell's child
cleanup() {
  report
  [ ! -e "$WORK/matrix.pid" ] || kill -- -"$(cat "$WORK/matrix.pid")" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# The install matrix runs in the background, in a process group and session of its own that
# is not this shell's child: it is stopped as a whole if a phase fails, and it measures its
# own wall and CPU seconds (they would otherwise land in whichever phase reaps it).
matrix_begin() {
  (setsid bash -c 'python3 scripts/install_matrix.py >"$1/matrix.log" 2>&1; rc=$?
     read -r -a f </proc/$$/stat
     echo "$rc $SECONDS $(((f[15] + f[16]) / $2))" >"$1/matrix.tmp"
     mv "$1/matrix.tmp" "$1/matrix.done"' install-matrix "$WORK" "$HZ" &
   echo $! >"$WORK/matrix.pid")
  MATRIX_T0=$SECONDS
}
matrix_end() {
  local rc wall cpu
  CURRENT="install-matrix $MATRIX_T0 $(cpu_now)"
  until [ -e "$WORK/matrix.done" ]; do sleep 1; done
  rm "$WORK/matrix.pid"
  read -r rc wall cpu <"$WORK/matrix.done"
  cat "$WORK/matrix.log"
  ((rc == 0)) || exit "$rc"
  TIMES+=("install-matrix $wall $cpu")
  EXTRA_CPU=$((EXTRA_CPU + cpu))
  CURRENT=""
}

conformance() {
  local backend
  for backend in vulkan cpu wgpu; do
    poot conformance "$backend" -- -q -n "$WORKERS"
  done
  # the numpy backends' suites take seconds: workers would cost more to start than they save
  for backend in stride reference; do
    poot conformance "$backend" -- -q -n 0
  done
}

WORKERS=${POOT_TEST_WORKERS:-$(nproc)}
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/poot-xdg}"; mkdir -p -m 0700 "$XDG_RUNTIME_DIR"

phase setup bash scripts/setup.sh
phase pull pull
poot backends
matrix_begin
phase conformance conformance
matrix_end
# whole files to each worker (a module's fixtures are built once), in the order of the root
# conftest.py (the files with whole-model tests first); the 20 slowest tests are listed
phase pytest python3 -m pytest -q -n "$WORKERS" --dist loadfile --no-loadscope-reorder \
  --durations=20 "$@"
