"""What each AMD GPU architecture offers poot's kernels, by its gfx name.

One record per architecture the backend knows: its family, wavefront widths, LDS
(workgroup-shared memory) per workgroup, and which 16-bit float and packed-integer
dot instructions and matrix units it has. A device reports its architecture
(hipDeviceProp_t.gcnArchName, e.g. "gfx90a:sramecc+:xnack-"); compile-only targets
name it ("gfx90a", or "gfx1030:w64" for an RDNA part run in wave64 mode).

Facts from AMD's ISA documents and LLVM's AMDGPU target descriptions.
"""
from __future__ import annotations

from dataclasses import dataclass

from poot.errors import DeviceUnavailable

KIB = 1024


@dataclass(frozen=True)
class Arch:
    name: str                   # gfx name without target features
    family: str                 # GCN5, CDNA1..3, RDNA2, RDNA3
    product: str                # an example part
    waves: tuple[int, ...]      # supported wavefront widths, the default first
    lds_bytes: int              # LDS one workgroup may allocate
    f16_dot: bool               # v_dot2_f32_f16
    bf16_dot: bool              # v_dot2_f32_bf16 (or bf16 MFMA/WMMA inputs)
    int8_dot: bool              # v_dot4_i32_i8 (integer dot of packed weights)
    matrix: str = ""            # "mfma" (CDNA) or "wmma" (RDNA3): not used by poot yet
    fp8: bool = False           # hardware FP8 conversions

    @property
    def rdna(self) -> bool:
        return self.family.startswith("RDNA")


ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("gfx906", "GCN5", "MI50/MI60", (64,), 64 * KIB, True, False, True),
    Arch("gfx908", "CDNA1", "MI100", (64,), 64 * KIB, True, True, True, "mfma"),
    Arch("gfx90a", "CDNA2", "MI210/MI250X", (64,), 64 * KIB, True, True, True, "mfma"),
    Arch("gfx940", "CDNA3", "MI300 (early)", (64,), 64 * KIB, True, True, True, "mfma", True),
    Arch("gfx941", "CDNA3", "MI300X (early)", (64,), 64 * KIB, True, True, True, "mfma", True),
    Arch("gfx942", "CDNA3", "MI300X/MI300A/MI325X", (64,), 64 * KIB, True, True, True,
         "mfma", True),
    Arch("gfx950", "CDNA4", "MI350X/MI355X", (64,), 160 * KIB, True, True, True, "mfma",
         True),
    Arch("gfx1030", "RDNA2", "Radeon RX 6800/6900, PRO W6800", (32, 64), 64 * KIB, True,
         False, True),
    Arch("gfx1100", "RDNA3", "Radeon RX 7900 XTX, PRO W7900", (32, 64), 64 * KIB, True, True,
         True, "wmma"),
    Arch("gfx1101", "RDNA3", "Radeon RX 7800 XT", (32, 64), 64 * KIB, True, True, True,
         "wmma"),
    Arch("gfx1102", "RDNA3", "Radeon RX 7600", (32, 64), 64 * KIB, True, True, True, "wmma"),
)}


@dataclass(frozen=True)
class Target:
    """One architecture at one wavefront width: what a code object is built for."""

    arch: Arch
    wave: int

    @property
    def name(self) -> str:
        """gfx1030 (its default width) or gfx1030:w64."""
        return self.arch.name if self.wave == self.arch.waves[0] else \
            f"{self.arch.name}:w{self.wave}"

    def __str__(self) -> str:
        return self.name


def target(name: str, wave: int | None = None) -> Target:
    """The Target of a gfx name: "gfx90a", "gfx90a:sramecc+:xnack-" (a device's
    gcnArchName; target features are dropped), or "gfx1030:w64" for wave64 on RDNA."""
    parts = name.strip().split(":")
    gfx = parts[0]
    for p in parts[1:]:
        if p in ("w32", "w64"):
            wave = int(p[1:]) if wave is None else wave
    arch = ARCHS.get(gfx)
    if arch is None:
        raise DeviceUnavailable(f"unknown AMD GPU architecture {name!r}; the rocm backend "
                                f"knows {', '.join(ARCHS)}")
    wave = arch.waves[0] if wave is None else wave
    if wave not in arch.waves:
        raise DeviceUnavailable(f"{gfx} runs wavefronts of {' or '.join(map(str, arch.waves))}"
                                f" lanes, not {wave}")
    return Target(arch, wave)
