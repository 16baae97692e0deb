"""GLSL compute (4.50): the C-style printer's dialect for SPIR-V through glslang.

What differs from C: buffers are `std430` storage blocks at global scope (binding i
for the kernel's buffer i), shared arrays are global `shared` arrays, conversions are
constructor calls (`int(x)`, never `(int)x`), 8/16-bit types come from
GL_EXT_shader_explicit_arithmetic_types with 8/16-bit storage, and BF16 is held as
its 16 bits in a `uint16_t` (widened exactly to float, rounded to nearest even on the
way back) because GLSL has no bfloat type. The scalar helpers are
poot.codegen.scalar's, in their GLSL spelling (NaN is tested on its bits: `poot_isnan`).
Program names are prefixed (`v_`, `b_`) so that none collides with a GLSL keyword or
builtin function (`out`, `dot`).

CoopReduce uses the subgroup: a shuffle-xor butterfly within groups of up to one
subgroup (subgroupAdd/subgroupMax when the group is exactly one subgroup), then
shared memory across subgroups; without subgroup shuffles, or when the workgroup is
not whole subgroups, every thread publishes to shared memory and folds its group.
Subgroups are taken to be consecutive runs of gl_LocalInvocationIndex, which every
Vulkan driver poot runs on does for one-dimensional workgroups.

Dot4 (target.DOT4, where the device has shaderIntegerDotProduct) is SPIR-V's OpSUDot,
declared through GL_EXT_spirv_intrinsics in the kernels that use it.

Where the device lets a pipeline require its subgroup size, a kernel with subgroup
reductions asks for the size it was printed for (`required_subgroup`).

Device limits (workgroup size and invocations, shared memory, storage buffers per
stage, binding range) are checked here: a kernel that does not fit is refused with
LimitExceeded when it is printed, before anything runs.
"""
from __future__ import annotations

import re

from poot.codegen.cstyle import CPrinter
from poot.codegen.expr import Dot4, Load
from poot.codegen.program import Barrier, CoopReduce, For, Kernel, Store, statements_in
from poot.codegen.target import DOT4, WIDE_WORKGROUPS
from poot.dtypes import DType
from poot.errors import LimitExceeded
from poot.ir.ops import ReduceOp

from poot_vulkan.device import BACKEND, DeviceFacts, level_cuts

F32, F16, BF16, I32, U32 = DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32
I16, U16, I8, U8 = DType.I16, DType.U16, DType.I8, DType.U8

GLSL_TYPES = {F32: "float", I32: "int", U32: "uint", F16: "float16_t", BF16: "uint16_t",
              I16: "int16_t", U16: "uint16_t", I8: "int8_t", U8: "uint8_t"}

EXTENSIONS = ("GL_EXT_shader_explicit_arithmetic_types", "GL_EXT_shader_16bit_storage",
              "GL_EXT_shader_8bit_storage", "GL_EXT_control_flow_attributes",
              "GL_KHR_shader_subgroup_basic", "GL_KHR_shader_subgroup_arithmetic",
              "GL_KHR_shader_subgroup_shuffle")

#: Dot4 as SPIR-V's OpSUDot over packed 4 x 8-bit words (signed a, unsigned b): glslang
#: 13 has no GL_EXT_integer_dot_product, so the instruction is declared through
#: GL_EXT_spirv_intrinsics (opcode 4452; capabilities DotProduct 6019 and
#: DotProductInput4x8BitPacked 6018; the last operand PackedVectorFormat4x8Bit = 0)
SUDOT = "poot_sudot"
SUDOT_EXTENSION = "#extension GL_EXT_spirv_intrinsics : require"
SUDOT_DECLARATION = (
    'spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], '
    "capabilities = [6019, 6018], id = 4452)",
    f"int {SUDOT}(int a, uint b, spirv_literal int packed_format);")


def supported_dtypes(facts: DeviceFacts) -> frozenset[DType]:
    """Dtypes the device can both store in buffers and compute with in a shader."""
    out = {F32, I32, U32}
    s16 = facts.has("storageBuffer16BitAccess")
    if s16 and facts.has("shaderFloat16"):
        out.add(F16)
    if s16 and facts.has("shaderInt16"):
        out |= {I16, U16, BF16}
    if facts.has("storageBuffer8BitAccess") and facts.has("shaderInt8"):
        out |= {I8, U8}
    return frozenset(out)


def target_features(facts: DeviceFacts) -> frozenset[str]:
    """The optional statement families (poot.codegen.target) printed for the device:
    DOT4 where it has shaderIntegerDotProduct (VK_KHR_shader_integer_dot_product);
    WIDE_WORKGROUPS where a GPU launches 1024 invocations (`wide_workgroups`)."""
    dot4 = {DOT4} if facts.has("shaderIntegerDotProduct") else set()
    wide = {WIDE_WORKGROUPS} if wide_workgroups(facts) else set()
    return frozenset(dot4 | wide)


def wide_workgroups(facts: DeviceFacts) -> bool:
    """A GPU whose workgroups take 1024 invocations: decode attention then walks a cache of
    up to 1024 keys in one kernel, where narrow workgroups split it and merge the splits
    in a second kernel, one dependent batch more a layer. Not on a software device, whose
    workgroup barriers cost by the invocation (docs/performance.md), nor with
    POOT_LEVEL_CUTS=off (the A/B of issue 56's level cuts, `level_cuts`)."""
    return (not facts.is_software and level_cuts()
            and facts.limit("maxComputeWorkGroupInvocations") >= 1024
            and facts.limit("maxComputeWorkGroupSize.x") >= 1024)


def dispatch_groups(kernel: Kernel, facts: DeviceFacts) -> tuple[int, int, int]:
    """The vkCmdDispatch group counts: the grid, or its groups folded into x and y when a
    dimension is over maxComputeWorkGroupCount (the kernel unfolds its linear id)."""
    grid = kernel.grid3()
    caps = [facts.limit(f"maxComputeWorkGroupCount.{a}") for a in "xyz"]
    if all(g <= c for g, c in zip(grid, caps, strict=True)):
        return grid
    n = kernel.groups
    y = -(-n // caps[0])
    if y > caps[1]:
        raise LimitExceeded(f"kernel {kernel.name}: {n} workgroups exceed {caps[0]} x "
                            f"{caps[1]}", op=kernel.name, backend=BACKEND, device=facts.name)
    return (-(-n // y), y, 1)


def required_subgroup(kernel: Kernel, facts: DeviceFacts) -> tuple[int, bool]:
    """(subgroup size, whole subgroups only) that `kernel`'s pipeline asks for, or (0,
    False) for none. Its cooperative reductions are printed for the device's reported
    subgroup size, in consecutive runs of gl_LocalInvocationIndex; a device whose compiler
    picks among sizes (8 to 32 on Intel, 32 or 64 on AMD) keeps that only when the pipeline
    requires it, which VK_EXT_subgroup_size_control lets it do."""
    size, lim = facts.subgroup_size, facts.limits
    if not (kernel.reductions() and facts.has("subgroupSizeControl")
            and GlslPrinter(facts)._subgroups(kernel)
            and lim["minSubgroupSize"] <= size <= lim["maxSubgroupSize"]
            and kernel.threads_per_group // size <= lim["maxComputeWorkgroupSubgroups"]):
        return 0, False
    return size, facts.has("computeFullSubgroups") and kernel.workgroup3()[0] % size == 0


def _ident(prefix: str, name: str) -> str:
    return prefix + re.sub(r"[^0-9A-Za-z]", "_", name).replace("__", "_x")


class GlslPrinter(CPrinter):
    backend = BACKEND
    qualifier = ""
    languages = ("glsl", "c")
    truth_type = "bool"

    def __init__(self, facts: DeviceFacts):
        self.facts = facts
        self.device = facts.name
        self.supported = supported_dtypes(facts)
        self.holds_bf16_bits = BF16 in self.supported
        self.subgroup = facts.subgroup_size
        self.shuffle = {"basic", "shuffle"} <= facts.subgroup_ops
        self.arithmetic = {"basic", "arithmetic"} <= facts.subgroup_ops

    # -- names and types -----------------------------------------------------------------
    def type_name(self, dtype: DType) -> str:
        return GLSL_TYPES[dtype]

    def array(self, name: str) -> str:
        return _ident("b_", name)

    def name(self, var: str) -> str:
        return _ident("v_", var)

    def load(self, e: Load) -> str:
        return f"{self.array(e.buffer)}[{self.expr(e.index)}]"

    def store(self, s: Store, depth: int) -> list[str]:
        return [f"{self.pad(depth)}{self.array(s.array)}[{self.expr(s.index)}] = "
                f"{self.expr(s.value)};"]

    @property
    def native_dot4(self) -> bool:
        return DOT4 in target_features(self.facts)

    def dot4(self, e: Dot4) -> str:
        return f"({SUDOT}({self.expr(e.a)}, {self.expr(e.b)}, 0) + {self.expr(e.c)})"

    def convert(self, dtype: DType, text: str) -> str:
        return f"{self.type_name(dtype)}({text})"

    def conversion(self, dtype: DType) -> str:
        return self.type_name(dtype)

    # -- the translation unit ------------------------------------------------------------
    def unit(self, kernel: Kernel) -> str:
        self.check_limits(kernel)
        self.groups = dispatch_groups(kernel, self.facts)
        body = []
        for a in kernel.locals:
            body.append(f"  {self.type_name(a.dtype)} {self.array(a.name)}[{a.count}];")
        body += ["  " + x for x in self.entry()]
        body += self.block(kernel.body, 1)
        wx, wy, wz = kernel.workgroup3()
        lines = ["#version 450", *(f"#extension {e} : enable" for e in EXTENSIONS),
                 f"// poot kernel {kernel.name}: grid {kernel.grid}, workgroup "
                 f"{kernel.workgroup}",
                 f"layout(local_size_x = {wx}, local_size_y = {wy}, local_size_z = {wz}) in;"]
        for i, b in enumerate(kernel.buffers):
            # restrict, as the CUDA dialect's __restrict__ (the same kernel programs run
            # under it there, in-place steps included)
            ro = "restrict readonly " if not b.access.writable else "restrict "
            lines.append(f"layout(std430, set = 0, binding = {i}) {ro}buffer poot_b{i} "
                         f"{{ {self.type_name(b.dtype)} {self.array(b.name)}[]; }};"
                         f"  // {b.dtype}[{b.count}] {b.access.value}")
        for a in kernel.shared:
            lines.append(f"shared {self.type_name(a.dtype)} {self.array(a.name)}[{a.count}];")
        for i, s in enumerate(kernel.reductions()):
            if self.needs_scratch(s, kernel):
                lines.append(self.reduction_scratch_decl(s, i))
        lines.append(self.scalar_helpers())
        if any(f"{SUDOT}(" in line for line in body):
            lines.insert(1, SUDOT_EXTENSION)
            lines += SUDOT_DECLARATION
        lines += ["void main() {", *body, "}"]
        return "\n".join(lines) + "\n"

    def check_limits(self, kernel: Kernel) -> None:
        """Refuse what the device cannot launch."""
        lim = self.facts.limits

        def refuse(msg: str):
            raise LimitExceeded(f"kernel {kernel.name}: {msg}", op=kernel.name,
                                backend=BACKEND, device=self.device)

        for axis, size in zip("xyz", kernel.workgroup3(), strict=True):
            if size > lim[f"maxComputeWorkGroupSize.{axis}"]:
                refuse(f"workgroup {kernel.workgroup} is over maxComputeWorkGroupSize.{axis} "
                       f"{lim[f'maxComputeWorkGroupSize.{axis}']}")
        if kernel.threads_per_group > lim["maxComputeWorkGroupInvocations"]:
            refuse(f"{kernel.threads_per_group} invocations per workgroup, over "
                   f"maxComputeWorkGroupInvocations {lim['maxComputeWorkGroupInvocations']}")
        for b in kernel.buffers:
            if b.nbytes > lim["maxStorageBufferRange"]:
                refuse(f"buffer {b.name!r} is {b.nbytes} bytes, over maxStorageBufferRange "
                       f"{lim['maxStorageBufferRange']}")
        if len(kernel.buffers) > lim["maxPerStageDescriptorStorageBuffers"]:
            refuse(f"{len(kernel.buffers)} storage buffers, over "
                   f"maxPerStageDescriptorStorageBuffers "
                   f"{lim['maxPerStageDescriptorStorageBuffers']}")
        shared = sum(a.count * a.dtype.itemsize for a in kernel.shared)
        shared += sum(4 * self.scratch_count(kernel) for s in kernel.reductions()
                      if self.needs_scratch(s, kernel))
        if shared > lim["maxComputeSharedMemorySize"]:
            refuse(f"{shared} bytes of shared memory, over maxComputeSharedMemorySize "
                   f"{lim['maxComputeSharedMemorySize']}")

    def entry(self) -> list[str]:
        k = self.kernel
        if self.groups == k.grid3():
            return [f"const int poot_group_{a} = int(gl_WorkGroupID.{a});" for a in "xyz"]
        gx, gy, _ = k.grid3()
        # the linear id is uniform over the workgroup: this early return keeps barriers legal
        return ["const uint poot_lin = gl_WorkGroupID.x + gl_NumWorkGroups.x * "
                "gl_WorkGroupID.y;",
                f"if (poot_lin >= {k.groups}u) return;",
                f"const int poot_group_x = int(poot_lin % {gx}u);",
                f"const int poot_group_y = int((poot_lin / {gx}u) % {gy}u);",
                f"const int poot_group_z = int(poot_lin / {gx * gy}u);"]

    def builtin(self, kind: str, axis: int, kernel: Kernel) -> str:
        a = "xyz"[axis]
        if kind == "local":
            return f"int(gl_LocalInvocationID.{a})"
        if kind == "group":
            return f"poot_group_{a}"
        if kind == "global":
            return (f"(poot_group_{a} * {kernel.workgroup3()[axis]} + "
                    f"int(gl_LocalInvocationID.{a}))")
        return "int(gl_LocalInvocationIndex)"

    def barrier(self) -> str:
        # Barrier's visibility is the workgroup's (shared and buffer memory, as CUDA's
        # __syncthreads): a workgroup-scoped memory barrier, not memoryBarrierBuffer's
        # device scope, which waits for every store to reach the whole device
        return "groupMemoryBarrier(); barrier();"

    def loop_pragma(self, s: For, pad: str) -> list[str]:
        # On a software device a loop with a barrier in it stays rolled: each trip's copy
        # is a whole phase of the workgroup (the tiled GEMM's K loop, its operands'
        # decoding staged), which Mesa's LLVM takes minutes to compile and a CPU core
        # runs no faster unrolled (docs/performance.md)
        if self.facts.is_software and any(isinstance(x, Barrier)
                                          for x in statements_in(s.body)):
            return []
        return [f"{pad}[[unroll]]" if x.endswith("#pragma unroll") else x
                for x in super().loop_pragma(s, pad)]

    # -- scalars ----------------------------------------------------------------------------
    def bitcast(self, src: DType, dst: DType, text: str) -> str:
        fn = {(I32, F32): "intBitsToFloat", (U32, F32): "uintBitsToFloat",
              (F32, I32): "floatBitsToInt", (F32, U32): "floatBitsToUint",
              (I32, U32): "uint", (U32, I32): "int"}.get((src, dst))
        if fn is None:
            raise self.refuse(src, f"bitcast to {dst}")
        return f"{fn}({text})"

    def clz(self, text: str) -> str:
        return f"(31 - findMSB(uint({text})))"

    # -- cooperative reductions ------------------------------------------------------------
    def _combine(self, op: ReduceOp, dtype: DType, a: str, b: str) -> str:
        if op is ReduceOp.Sum:
            return f"({a} + {b})"
        return f"poot_fmax({a}, {b})" if dtype is F32 else f"max({a}, {b})"

    def _subgroups(self, kernel: Kernel) -> bool:
        return self.shuffle and kernel.threads_per_group % self.subgroup == 0

    def needs_scratch(self, s: CoopReduce, kernel: Kernel) -> bool:
        width = s.width or kernel.threads_per_group
        return not self._subgroups(kernel) or width > self.subgroup

    def scratch_count(self, kernel: Kernel) -> int:
        tpg = kernel.threads_per_group
        return max(1, tpg // self.subgroup) if self._subgroups(kernel) else tpg

    def reduction_scratch_decl(self, s: CoopReduce, i: int) -> str:
        return (f"shared {self.type_name(s.value.dtype)} poot_red_{self.name(s.name)}"
                f"[{self.scratch_count(self.kernel)}];")

    def coop_reduce(self, s: CoopReduce, depth: int) -> list[str]:
        pad, kernel = self.pad(depth), self.kernel
        t = self.type_name(s.value.dtype)
        width = s.width or kernel.threads_per_group
        lane = self.builtin("index", 0, kernel)
        name = self.name(s.name)
        v, scratch = f"{name}_r", f"poot_red_{name}"

        def fold(other: str) -> str:
            return f"{pad}{v} = {self._combine(s.op, s.value.dtype, v, other)};"

        out = [f"{pad}{t} {v} = {self.expr(s.value)};"]
        if not self._subgroups(kernel):
            first = f"({lane} / {width}) * {width}"
            return out + [f"{pad}{scratch}[{lane}] = {v};", f"{pad}{self.barrier()}",
                          f"{pad}{v} = {scratch}[{first}];",
                          f"{pad}for (int o = 1; o < {width}; ++o)",
                          self.indent_unit + fold(f"{scratch}[{first} + o]"),
                          f"{pad}{self.barrier()}", f"{pad}const {t} {name} = {v};"]
        sg = self.subgroup
        # subgroupMax may drop NaN, so a float Max keeps the butterfly (poot_fmax)
        whole = min(width, sg) == sg and self.arithmetic and not (
            s.op is ReduceOp.Max and s.value.dtype is F32)
        if whole:
            fn = "subgroupAdd" if s.op is ReduceOp.Sum else "subgroupMax"
            out.append(f"{pad}{v} = {fn}({v});")
        else:
            off = min(width, sg) // 2
            while off >= 1:
                out.append(fold(f"subgroupShuffleXor({v}, {off}u)"))
                off //= 2
        if width <= sg:
            return out + [f"{pad}const {t} {name} = {v};"]
        per_group = width // sg
        first = f"({lane} / {width}) * {per_group}"
        return out + [f"{pad}if (({lane} % {sg}) == 0) {scratch}[{lane} / {sg}] = {v};",
                      f"{pad}{self.barrier()}", f"{pad}{v} = {scratch}[{first}];",
                      f"{pad}for (int o = 1; o < {per_group}; ++o)",
                      self.indent_unit + fold(f"{scratch}[{first} + o]"),
                      f"{pad}{self.barrier()}", f"{pad}const {t} {name} = {v};"]


__all__ = ["GlslPrinter", "dispatch_groups", "required_subgroup", "supported_dtypes"]
