"""poot-backend-vulkan: GLSL compute shaders compiled to SPIR-V, run on raw Vulkan.

`poot_vulkan.probe()` lists the Vulkan devices poot would use (ranked discrete >
integrated > virtual > CPU), or says why there is none, without raising. The backend
registers itself through the `poot` entry point group (`poot_vulkan.plugin`).
"""
from __future__ import annotations

from poot_vulkan.probe import ProbeResult, probe

__all__ = ["ProbeResult", "probe"]
