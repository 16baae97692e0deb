#!/usr/bin/env bash
# Install every poot package of this checkout (editable) and what they need, on a fresh
# Debian machine: Mesa lavapipe for the wgpu and Vulkan backends, gcc (with OpenMP) for the
# cpu backend, the CUDA compiler for the CUDA backend's compile checks, the HIP toolchain for
# the ROCm backend's, the test tools.
# Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

bash scripts/install-lavapipe.sh
bash scripts/install-hip.sh

# the cpu backend compiles its kernels with the system C compiler and OpenMP
if ! command -v gcc >/dev/null || ! echo 'int main(void){return 0;}' \
    | gcc -fopenmp -x c - -o /dev/null 2>/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends gcc libc6-dev libgomp1
fi

pkgs=(-e "poot-core[models,serve,test]")
for p in poot-quant poot-backend-cuda poot-backend-rocm poot-backend-wgpu poot-backend-vulkan \
         poot-backend-cpu tests/plugins/poot-backend-toy tests/plugins/poot-backend-stride; do
  [ -f "$p/pyproject.toml" ] && pkgs+=(-e "$p")
done
python3 -m pip install --quiet "${pkgs[@]}"
