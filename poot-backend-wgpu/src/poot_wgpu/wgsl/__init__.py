"""The WGSL printer of poot's backend-neutral kernel programs (`poot.codegen.program`)."""
from __future__ import annotations

from poot_wgpu.wgsl.kernel import WgslPrinter, print_kernel

__all__ = ["WgslPrinter", "print_kernel"]
