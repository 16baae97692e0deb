"""The CUDA-style C dialects (CUDA C, HIP C++): what they share over the C family.

Both index threads with threadIdx/blockIdx, synchronize with __syncthreads(),
declare `extern "C" __global__` entry points with launch bounds, and reduce across
lanes with xor shuffles. What differs is the target's warp (wavefront) width, 32 on
NVIDIA, 64 on CDNA and 32 or 64 on RDNA, and the shuffle's spelling
(`SimtPrinter.warp`, `shuffle_xor`), besides types and headers. A cooperative
reduction is an xor butterfly within aligned runs of min(width, warp) lanes; wider
groups then fold their warps' partials through shared memory, in order; a workgroup
that is not whole warps folds every thread's value through shared memory. The
kernel interpreter (poot.codegen.interp, `subgroup=`) folds in the same order.
"""
from __future__ import annotations

from poot.codegen.cstyle import CPrinter
from poot.codegen.program import CoopReduce, CoopReduceScatter, Kernel, scatter_order
from poot.dtypes import DType
from poot.ir.ops import ReduceOp

F32, I32, U32 = DType.F32, DType.I32, DType.U32


class SimtPrinter(CPrinter):
    """CUDA C and HIP C++ over the C family; a dialect sets `warp` and `shuffle_xor`."""

    #: lanes of one warp (wavefront) on the target
    warp = 32

    def shuffle_xor(self, value: str, offset: int, lanes: int) -> str:
        """`value` of the lane whose index differs from this one's in bit `offset`, within
        aligned runs of `lanes` lanes."""
        raise NotImplementedError

    def signature(self, kernel: Kernel) -> str:
        params = []
        for b in kernel.buffers:
            const = "const " if not b.access.writable else ""
            params.append(f"{const}{self.type_name(b.dtype)}* __restrict__ {b.name}")
        params += self.value_params(kernel)
        return (f'extern "C" __global__ void __launch_bounds__({self.launch_bounds(kernel)}) '
                f"{kernel.name}({', '.join(params)})")

    def value_params(self, kernel: Kernel) -> list[str]:
        """Parameters passed by value after the buffers (a dialect's tensor maps)."""
        return []

    def launch_bounds(self, kernel: Kernel) -> str:
        return str(kernel.threads_per_group)

    def builtin(self, kind: str, axis: int, kernel: Kernel) -> str:
        a = "xyz"[axis]
        if kind == "local":
            return f"((int)threadIdx.{a})"
        if kind == "group":
            return f"((int)blockIdx.{a})"
        if kind == "global":
            return f"((int)(blockIdx.{a} * {kernel.workgroup3()[axis]}u + threadIdx.{a}))"
        wx, wy, wz = kernel.workgroup3()
        if wy == wz == 1:
            return "((int)threadIdx.x)"
        return f"((int)(threadIdx.x + {wx}u * (threadIdx.y + {wy}u * threadIdx.z)))"

    def barrier(self) -> str:
        return "__syncthreads();"

    def bitcast(self, src: DType, dst: DType, text: str) -> str:
        fn = {(I32, F32): "__int_as_float", (U32, F32): "__uint_as_float",
              (F32, I32): "__float_as_int", (F32, U32): "__float_as_uint"}.get((src, dst))
        if fn is not None:
            return f"{fn}({text})"
        if {src, dst} == {I32, U32}:
            return f"(({self.type_name(dst)})({text}))"
        raise self.refuse(src, f"bitcast to {dst}")

    def clz(self, text: str) -> str:
        return f"__clz({text})"

    # -- cooperative reductions ---------------------------------------------------------
    def combine(self, op: ReduceOp, dtype: DType, a: str, b: str) -> str:
        if op is ReduceOp.Sum:
            return f"({a} + {b})" if dtype is F32 else f"poot_iadd({a}, {b})"
        return f"poot_fmax({a}, {b})" if dtype is F32 else f"poot_imax({a}, {b})"

    def needs_scratch(self, s: CoopReduce, kernel: Kernel) -> bool:
        width = s.width or kernel.threads_per_group
        return width > self.warp or kernel.threads_per_group % self.warp != 0

    def scratch_count(self, kernel: Kernel) -> int:
        """Elements of one reduction's shared scratch: a partial per warp, or a value per
        thread when the workgroup is not whole warps."""
        tpg = kernel.threads_per_group
        return max(1, tpg // self.warp) if tpg % self.warp == 0 else tpg

    def reduction_scratch_decl(self, s: CoopReduce, i: int) -> str:
        return self.shared_decl(f"poot_red_{s.name}", s.value.dtype,
                                self.scratch_count(self.kernel))

    def coop_reduce(self, s: CoopReduce, depth: int) -> list[str]:
        pad, kernel, warp = self.pad(depth), self.kernel, self.warp
        t = self.type_name(s.value.dtype)
        tpg = kernel.threads_per_group
        width = s.width or tpg
        lane = self.builtin("index", 0, kernel)
        v, scratch = f"{s.name}_v", f"poot_red_{s.name}"

        def fold(other: str) -> str:
            return f"{pad}{v} = {self.combine(s.op, s.value.dtype, v, other)};"

        def fold_scratch(first: str, count: int) -> list[str]:
            return [f"{pad}__syncthreads();", f"{pad}{v} = {scratch}[{first}];",
                    f"{pad}for (int o = 1; o < {count}; ++o)",
                    self.indent_unit + fold(f"{scratch}[{first} + o]"),
                    f"{pad}__syncthreads();", f"{pad}const {t} {s.name} = {v};"]

        out = [f"{pad}{t} {v} = {self.expr(s.value)};"]
        if tpg % warp != 0:
            return out + [f"{pad}{scratch}[{lane}] = {v};",
                          *fold_scratch(f"({lane} / {width}) * {width}", width)]
        lanes = min(width, warp)
        off = lanes // 2
        while off >= 1:
            out.append(fold(self.shuffle_xor(v, off, lanes)))
            off //= 2
        if width <= warp:
            return out + [f"{pad}const {t} {s.name} = {v};"]
        per_group = width // warp      # lane 0 of each warp publishes its partial
        return out + [f"{pad}if (({lane} & {warp - 1}) == 0) {scratch}[{lane} / {warp}] = {v};",
                      *fold_scratch(f"({lane} / {width}) * {per_group}", per_group)]

    def reduce_scatter(self, s: CoopReduceScatter, depth: int) -> list[str]:
        pad, kernel = self.pad(depth), self.kernel
        if s.width > self.warp or kernel.threads_per_group % self.warp:
            raise self.unsupported(f"CoopReduceScatter over {s.width} of "
                                   f"{kernel.threads_per_group} threads")
        dtype = s.values[0].dtype
        t = self.type_name(dtype)
        lane = self.builtin("index", 0, kernel)
        r = [f"{s.name}_r{i}" for i in range(len(s.values))]
        out = [f"{pad}{t} {x} = {self.expr(v)};" for x, v in zip(r, s.values, strict=True)]
        count = len(r)
        for off, keep in scatter_order(count, s.width):
            if keep == count:          # one value left: the butterfly
                other = self.shuffle_xor(r[0], off, s.width)
                out.append(f"{pad}{r[0]} = {self.combine(s.op, dtype, r[0], other)};")
                continue
            up = f"{s.name}_u{off}"
            out.append(f"{pad}const bool {up} = ({lane} & {off}) != 0;")
            for lo, hi in zip(r[:keep], r[keep:count], strict=True):
                sent = self.shuffle_xor(f"({up} ? {lo} : {hi})", off, s.width)
                kept = f"({up} ? {hi} : {lo})"
                out.append(f"{pad}{lo} = {self.combine(s.op, dtype, kept, sent)};")
            count = keep
        return out + [f"{pad}const {t} {s.name} = {r[0]};"]


__all__ = ["SimtPrinter"]
