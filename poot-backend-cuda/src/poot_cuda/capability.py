"""The CUDA capability table of one device, from its compute capability."""
from __future__ import annotations

from poot.capability import CapabilityTable, Use
from poot.codegen.coverage import NARROW_INTS, device_uses, kernel_table
from poot.dtypes import DType

F32, F16, BF16, I32, U32 = DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32


def kernel_features(major: int, minor: int, arch: str = "") -> frozenset:
    """cp.async and mma.sync m16n8k16 (BF16/F16 -> F32) exist from sm_80 on, dp2a from
    sm_61; blocks of 1024 threads, warp shuffles and 16-byte vector loads
    everywhere. Warpgroup products
    (wgmma) and the bulk tensor copies feeding them, when the kernels are built for sm_90a
    (`arch`): wgmma and setmaxnreg exist in sm_90a code only, which runs on 9.0 devices
    only."""
    from poot.codegen.target import (
        COPY_ASYNC,
        DOT2,
        MMA_M16N8K16,
        REDUCE_SCATTER,
        TMA,
        WGMMA,
        WIDE_LOADS,
        WIDE_WORKGROUPS,
    )

    sm80 = {MMA_M16N8K16.feature, COPY_ASYNC} if (major, minor) >= (8, 0) else set()
    dot2 = {DOT2} if (major, minor) >= (6, 1) else set()
    sm90a = {WGMMA, TMA} if (major, minor) == (9, 0) and arch == "sm_90a" else set()
    return frozenset({*sm80, *dot2, *sm90a, WIDE_WORKGROUPS, REDUCE_SCATTER, WIDE_LOADS})


def arch_of(major: int, minor: int) -> str:
    """The architecture a device's kernels are built for: sm_90a on 9.0 (its own
    instructions), else the plain one."""
    return f"sm_{major}{minor}{'a' if (major, minor) == (9, 0) else ''}"


def parse_arch(arch: str) -> tuple[int, int]:
    """(major, minor) of an NVRTC arch name: sm_90 -> (9, 0), sm_90a -> (9, 0), sm_120 ->
    (12, 0)."""
    digits = arch.removeprefix("sm_").rstrip("af")
    return int(digits[:-1]), int(digits[-1])


def table(device: str, major: int, minor: int, formats) -> CapabilityTable:
    """sm_80+ computes with F32, F16 and BF16 (16-bit floats compute in F32 and round
    per op, the IR's rule); sm_70/75 lack BF16 arithmetic. FP8 is storage only (packed
    FP8 formats decode with integer ops), on sm_89+. MXFP4's E8M0 scales and E2M1 codes
    are storage only on every device: their decode is integer ops and a bitcast."""
    floats = (F32, F16, BF16) if (major, minor) >= (8, 0) else (F32, F16)
    fp8 = (DType.F8E4M3, DType.F8E5M2) if (major, minor) >= (8, 9) else ()
    dtypes = device_uses(full=floats + (I32, U32), narrow=NARROW_INTS,
                         packed=fp8 + (DType.F8E8M0, DType.F4E2M1))
    if (major, minor) < (8, 0):
        dtypes[BF16] = Use.STORAGE
    # GatedContraction's decode GEMV (lower.dot) is measured here. The other offered
    # fusions (NormedPackedContraction, NormedDenseContraction, ContractionPrologue)
    # made their GEMVs slower than the norm's or the SwiGLU's own small kernel at the 8B
    # shape (docs/performance.md), so compile keeps those. The contraction of int8 rows
    # is the backend's own (poot.codegen.lower.q8: the integer GEMV over QuantizeI8's codes)
    from poot.codegen.lower.q8 import q8_formats

    own = {"Q8PackedContraction": q8_formats(formats)}
    # RopeUpdateSlice writes the rotated keys straight to the dense cache: a step of several
    # tokens loses k's Rope and its Transpose into the cache's order (two kernels a layer),
    # TransposedUpdateSlice v's Transpose and TokenMajorAttention the two of q and the
    # attention's result; a decode step keeps its count (q's Rope, k's write, v's)
    return kernel_table("cuda", device, dtypes, formats, own=own,
                        elect=("GatedContraction", "RopeUpdateSlice", "TransposedUpdateSlice",
                               "TokenMajorAttention"))
