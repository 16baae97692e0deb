"""HIP C++: the CUDA-style dialect (poot.codegen.simt) with HIP's types, LDS and
wavefront shuffles, for one target (an AMD architecture at one wavefront width).

Every printed translation unit stands alone (hiprtc or `hipcc --genco`) and several
may be concatenated into one (poot_rocm.compiler batches kernels that way): the
helpers sit behind an include guard. A unit also refuses, at compile time, to be
built for a wavefront width other than the one it was printed for, since its
cross-lane reductions are written for that width.
"""
from __future__ import annotations

from poot.codegen.program import Kernel
from poot.codegen.simt import SimtPrinter
from poot.dtypes import DType
from poot.errors import LimitExceeded

from poot_rocm.archs import Target, target

F32, F16, BF16, I32, U32 = DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32

# BF16 has no HIP type that both hiprtc and hipcc know without headers: it is held as
# its bits, converted by the shared scalar helpers (poot.codegen.scalar).
HEADER = """\
#if !defined(__HIPCC_RTC__)
#include <hip/hip_runtime.h>
#endif
#ifndef POOT_HIP_PRELUDE
#define POOT_HIP_PRELUDE
typedef unsigned short poot_bf16;
"""


class HipPrinter(SimtPrinter):
    backend = "rocm"
    qualifier = "static __device__ __forceinline__"
    holds_bf16_bits = True
    f16_type, bf16_type = "_Float16", "poot_bf16"

    def __init__(self, target_: Target | str = "gfx90a", supported=None):
        self.target = target(target_) if isinstance(target_, str) else target_
        self.device = self.target.name
        self.warp = self.target.wave
        base = {F32, I32, U32, DType.I16, DType.U16, DType.I8, DType.U8, F16, BF16}
        self.supported = frozenset(supported if supported is not None else base)

    def header(self, kernel: Kernel) -> str:
        return HEADER

    def signature(self, kernel: Kernel) -> str:
        # closes the prelude's guard, then pins the wavefront width the reductions assume
        return ("#endif  // POOT_HIP_PRELUDE\n"
                f"#if defined(__AMDGCN_WAVEFRONT_SIZE) && __AMDGCN_WAVEFRONT_SIZE != {self.warp}\n"
                f'#error "{kernel.name} was printed for wave{self.warp} ({self.device})"\n'
                "#endif\n" + super().signature(kernel))

    def shuffle_xor(self, value: str, offset: int, lanes: int) -> str:
        return f"__shfl_xor({value}, {offset}, {lanes})"

    def unit(self, kernel: Kernel) -> str:
        self.check_lds(kernel)
        return super().unit(kernel)

    def lds_bytes(self, kernel: Kernel) -> int:
        """LDS one workgroup of `kernel` allocates: its shared arrays and the reductions'
        scratch, each rounded to 4 bytes."""
        total = sum(-(-a.count * a.dtype.itemsize // 4) * 4 for a in kernel.shared)
        return total + sum(4 * self.scratch_count(kernel) for s in kernel.reductions()
                           if self.needs_scratch(s, kernel))

    def check_lds(self, kernel: Kernel) -> None:
        used, limit = self.lds_bytes(kernel), self.target.arch.lds_bytes
        if used > limit:
            raise LimitExceeded(f"kernel {kernel.name} needs {used} bytes of LDS; "
                                f"{self.target.arch.name} gives a workgroup {limit}",
                                op=kernel.name, backend=self.backend, device=self.device)

    def shared_decl(self, name: str, dtype: DType, count: int) -> str:
        return f"__shared__ {self.type_name(dtype)} {name}[{count}];"
