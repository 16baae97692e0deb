#!/usr/bin/env bash
# Install the HIP toolchain poot-backend-rocm compiles with on a machine without an AMD
# GPU: Debian's `hipcc` (ROCm 5.2.3: hipcc, the HIP runtime with hiprtc, the device
# libraries; ~490 MB) and hip-python (pinned in poot-backend-rocm's pyproject).
# Idempotent. Never install hip-python-interop: its top-level `cuda` package breaks
# cuda-bindings.
set -euo pipefail

if ! dpkg-query -W -f='${Status}' hipcc 2>/dev/null | grep -q "install ok installed"; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends hipcc
fi
HIP_PLATFORM=amd hipcc --version >/dev/null 2>&1 || { echo "hipcc is installed but does not run" >&2; exit 1; }
