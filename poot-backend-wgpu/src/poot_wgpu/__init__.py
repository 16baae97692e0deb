"""poot-backend-wgpu: WGSL kernels run through wgpu-py.

`poot_wgpu.probe()` says which adapter it would use, or why there is none, without raising.
The backend registers itself through the `poot` entry point group (`poot_wgpu.plugin`).
"""
from __future__ import annotations

from poot_wgpu.probe import ProbeResult, probe

__all__ = ["ProbeResult", "probe"]
