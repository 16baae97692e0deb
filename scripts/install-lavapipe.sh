#!/usr/bin/env bash
# Install Mesa lavapipe (Vulkan on the CPU) and what poot-backend-wgpu needs at run time;
# the Khronos validation layer for poot-backend-vulkan's tests.
# Idempotent: apt and pip skip what is already there. CI calls it on every fresh clone.
set -euo pipefail

need_apt=0
for pkg in libvulkan1 mesa-vulkan-drivers vulkan-validationlayers; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt=1
done
if [ "$need_apt" = 1 ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends \
    libvulkan1 mesa-vulkan-drivers vulkan-validationlayers
fi

# wgpu-py ships wgpu-native inside its wheel; nothing else to build.
python3 -m pip install --quiet "wgpu>=0.32"

# The lavapipe ICD must be visible to the Vulkan loader.
ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null
