"""GLSL compute (4.50): the C-style printer's dialect for SPIR-V through glslang.

What differs from C: buffers are `std430` storage blocks at global scope (binding i
for the kernel's buffer i), shared arrays are global `shared` arrays, conversions are
constructor calls (`int(x)`, never `(int)x`), 8/16-bit types come from
GL_EXT_shader_explicit_arithmetic_types with 8/16-bit storage, and BF16 is held as
its 16 bits in a `uint16_t` (widened exactly to float, rounded to nearest even on the
way back) because GLSL has no bfloat type. Program names are prefixed (`v_`, `b_`)
so that none collides with a GLSL keyword or builtin function (`out`, `dot`).

CoopReduce uses the subgroup: a shuffle-xor butterfly within groups of up to one
subgroup (subgroupAdd/subgroupMax when the group is exactly one subgroup), then
shared memory across subgroups; without subgroup shuffles, or when the workgroup is
not whole subgroups, every thread publishes to shared memory and folds its group.
Subgroups are taken to be consecutive runs of gl_LocalInvocationIndex, which every
Vulkan driver poot runs on does for one-dimensional workgroups.

Device limits (workgroup size and invocations, shared memory, storage buffers per
stage, binding range) are checked here: a kernel that does not fit is refused with
LimitExceeded when it is printed, before anything runs.
"""
from __future__ import annotations

import re

from poot.codegen.cstyle import C_BINARY, CPrinter
from poot.codegen.expr import Load
from poot.codegen.program import CoopReduce, For, Kernel, Store
from poot.dtypes import DType
from poot.errors import LimitExceeded
from poot.ir.ops import BinaryOp, ReduceOp

from poot_vulkan.device import BACKEND, DeviceFacts

F32, F16, BF16, I32, U32 = DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32
I16, U16, I8, U8 = DType.I16, DType.U16, DType.I8, DType.U8

GLSL_TYPES = {F32: "float", I32: "int", U32: "uint", F16: "float16_t", BF16: "uint16_t",
              I16: "int16_t", U16: "uint16_t", I8: "int8_t", U8: "uint8_t"}

EXTENSIONS = ("GL_EXT_shader_explicit_arithmetic_types", "GL_EXT_shader_16bit_storage",
              "GL_EXT_shader_8bit_storage", "GL_EXT_control_flow_attributes",
              "GL_KHR_shader_subgroup_basic", "GL_KHR_shader_subgroup_arithmetic",
              "GL_KHR_shader_subgroup_shuffle")

# The IR's scalar rules where GLSL leaves them open (NaN through max, division by zero,
# INT_MIN / -1, shifts of 32 or more, float-to-int overflow), and the math GLSL lacks.
PRELUDE = """\
bool poot_isnan(float x) { return (floatBitsToUint(x) & 0x7fffffffu) > 0x7f800000u; }
float poot_fmax(float a, float b) { return (a > b || poot_isnan(a)) ? a : b; }
float poot_fmin(float a, float b) { return (a < b || poot_isnan(a)) ? a : b; }
int poot_imax(int a, int b) { return max(a, b); }
int poot_imin(int a, int b) { return min(a, b); }
int poot_iadd(int a, int b) { return a + b; }
int poot_isub(int a, int b) { return a - b; }
int poot_imul(int a, int b) { return a * b; }
int poot_idiv(int a, int b) {
  return b == 0 ? 0 : (a == (-2147483647 - 1) && b == -1) ? a : a / b; }
uint poot_udiv(uint a, uint b) { return b == 0u ? 0u : a / b; }
int poot_ishl(int a, int b) { return uint(b) >= 32u ? 0 : a << b; }
int poot_ishr(int a, int b) { return uint(b) >= 32u ? (a < 0 ? -1 : 0) : a >> b; }
uint poot_ushl(uint a, uint b) { return b >= 32u ? 0u : a << b; }
uint poot_ushr(uint a, uint b) { return b >= 32u ? 0u : a >> b; }
int poot_f2i(float x, float lo, float hi) {
  return poot_isnan(x) ? 0 : x <= lo ? int(lo) : x >= hi ? (x >= 2147483648.0 ? 2147483647
       : int(hi)) : int(x); }
uint poot_f2u(float x) {
  return poot_isnan(x) || x <= 0.0 ? 0u : x >= 4294967296.0 ? 4294967295u : uint(x); }
float expf(float x) { return exp(x); }
float logf(float x) { return log(x); }
float sqrtf(float x) { return sqrt(x); }
float tanhf(float x) { return poot_isnan(x) ? x : abs(x) > 15.0 ? sign(x) : tanh(x); }
float erff(float x) {
  // |x| < 0.5: Taylor series; else Abramowitz-Stegun 7.1.26 (abs error < 1.5e-7)
  float a = abs(x);
  if (poot_isnan(x)) return x;
  if (a < 0.5) {
    float z = x * x;
    float s = 1.0 + z * (-1.0 / 3.0 + z * (0.1 + z * (-1.0 / 42.0 + z * (1.0 / 216.0
              + z * (-1.0 / 1320.0)))));
    return 1.1283791670955126 * x * s;
  }
  float t = 1.0 / (1.0 + 0.3275911 * a);
  float p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741
            + t * (-1.453152027 + t * 1.061405429))));
  float r = 1.0 - p * exp(-a * a);
  return x < 0.0 ? -r : r;
}
"""

BF16_PRELUDE = """\
float poot_bf2f(uint16_t x) { return uintBitsToFloat(uint(x) << 16); }
uint16_t poot_f2bf(float f) {
  uint u = floatBitsToUint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
"""


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


#: C_BINARY with conversions as constructors (GLSL has no C casts)
GLSL_BINARY = {op: dict(rows) for op, rows in C_BINARY.items()}
for _op, _sym in ((BinaryOp.Add, "+"), (BinaryOp.Sub, "-"), (BinaryOp.Mul, "*")):
    GLSL_BINARY[_op]["small"] = f"{{t}}(int({{a}}) {_sym} int({{b}}))"
GLSL_BINARY[BinaryOp.Div]["small"] = "{t}(poot_idiv(int({a}), int({b})))"
for _cls in ("i32", "u32", "small"):
    GLSL_BINARY[BinaryOp.GeU][_cls] = "(uint({a}) >= uint({b}) ? 1 : 0)"


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


def _ident(prefix: str, name: str) -> str:
    return prefix + re.sub(r"[^0-9A-Za-z]", "_", name).replace("__", "_x")


class GlslPrinter(CPrinter):
    backend = BACKEND
    qualifier = ""

    def __init__(self, facts: DeviceFacts):
        self.facts = facts
        self.device = facts.name
        self.supported = supported_dtypes(facts)
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

    def convert(self, dtype: DType, text: str) -> str:
        return f"{self.type_name(dtype)}({text})"

    def binary_rules(self):
        return GLSL_BINARY

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
        lines.append(PRELUDE + (BF16_PRELUDE if BF16 in self.supported else ""))
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
        return [f"{pad}[[unroll]]" if x.endswith("#pragma unroll") else x
                for x in super().loop_pragma(s, pad)]

    # -- scalars ----------------------------------------------------------------------------
    def to_f32(self, dtype: DType, text: str) -> str:
        return f"float({text})" if dtype is F16 else f"poot_bf2f({text})"

    def from_f32(self, dtype: DType, text: str) -> str:
        return f"float16_t({text})" if dtype is F16 else f"poot_f2bf({text})"

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


__all__ = ["GlslPrinter", "dispatch_groups", "supported_dtypes"]
