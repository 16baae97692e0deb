"""WGSL, a dialect of poot.codegen.printer: the pattern pass that closes WGSL's gaps in
the kernel program (`rewrite`), the printer (`printer`), dtype layouts (`types`) and the
helper functions that spell out poot's scalar rules (`helpers`)."""
from __future__ import annotations

from poot_wgpu.wgsl.printer import WgslPrinter, print_kernel

__all__ = ["WgslPrinter", "print_kernel"]
