"""The C-style dialect family over the printer core (poot.codegen.printer).

CUDA prints with it today; HIP, GLSL and plain C are dialects of it the same way.
`CPrinter.unit(kernel)` gives one translation unit: a prelude of helpers that pin down
the IR's scalar semantics where C leaves them open (integer division by zero, shifts of
32 or more, signed overflow, NaN-propagating max, saturating float-to-int), then the
kernel. Scalar rules are tables (`C_BINARY`, `F32_UNARY`): a new Binary sub-op is one
row. A dialect is a small subclass that names its language (see `CPrinter`):

    class HipPrinter(CPrinter):
        backend, qualifier = "rocm", "static __device__ inline"
        def signature(self, k): return f'extern "C" __global__ void {k.name}(...)'
        def builtin(self, kind, axis, k): ...   # threadIdx / blockIdx / their sums
        def barrier(self): return "__syncthreads();"
        def coop_reduce(self, s, depth): ...     # wavefront shuffles

A dtype the printer's device cannot do is refused with `DtypeLowering`
(`supported`): arithmetic is never moved into another type behind the user's
back. 16-bit floats compute in F32 and round once per op, which is the IR's
own rule for them (poot.reference.scalar), not an emulation.
"""
from __future__ import annotations

import math

import numpy as np

from poot.codegen.expr import Bin, Const, Expr, Sel, Un
from poot.codegen.printer import Printer
from poot.codegen.program import Barrier, CoopReduce, For, Kernel, Let, Store
from poot.dtypes import DType
from poot.ir.ops import BinaryOp, UnaryOp

F32, F16, BF16, I32, U32 = DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32
NARROW_FLOATS = (F16, BF16)

C_TYPES = {F32: "float", I32: "int", U32: "unsigned int", DType.I16: "short",
           DType.U16: "unsigned short", DType.I8: "signed char", DType.U8: "unsigned char"}

#: float Unary sub-ops on float text (16-bit floats widen first and round after)
F32_UNARY = {UnaryOp.Neg: "(-{})", UnaryOp.Recip: "(1.0f / {})", UnaryOp.Exp: "expf({})",
             UnaryOp.Log: "logf({})", UnaryOp.Sqrt: "sqrtf({})", UnaryOp.Tanh: "tanhf({})",
             UnaryOp.Erf: "erff({})"}

# Helpers shared by every C-like language; `{q}` is the function qualifier.
PRELUDE = """\
{q} float poot_fmax(float a, float b) {{ return (a > b || a != a) ? a : b; }}
{q} float poot_fmin(float a, float b) {{ return (a < b || a != a) ? a : b; }}
{q} int poot_imax(int a, int b) {{ return a > b ? a : b; }}
{q} int poot_imin(int a, int b) {{ return a < b ? a : b; }}
{q} int poot_iadd(int a, int b) {{ return (int)((unsigned int)a + (unsigned int)b); }}
{q} int poot_isub(int a, int b) {{ return (int)((unsigned int)a - (unsigned int)b); }}
{q} int poot_imul(int a, int b) {{ return (int)((unsigned int)a * (unsigned int)b); }}
{q} int poot_idiv(int a, int b) {{
  return b == 0 ? 0 : (a == (-2147483647 - 1) && b == -1) ? a : a / b; }}
{q} unsigned int poot_udiv(unsigned int a, unsigned int b) {{ return b == 0u ? 0u : a / b; }}
{q} int poot_ishl(int a, int b) {{
  return (unsigned int)b >= 32u ? 0 : (int)((unsigned int)a << (unsigned int)b); }}
{q} int poot_ishr(int a, int b) {{
  return (unsigned int)b >= 32u ? (a < 0 ? -1 : 0) : (a >> (unsigned int)b); }}
{q} unsigned int poot_ushl(unsigned int a, unsigned int b) {{ return b >= 32u ? 0u : a << b; }}
{q} unsigned int poot_ushr(unsigned int a, unsigned int b) {{ return b >= 32u ? 0u : a >> b; }}
{q} int poot_f2i(float x, float lo, float hi) {{
  return x != x ? 0 : x <= lo ? (int)lo : x >= hi ? (x >= 2147483648.0f ? 2147483647 : (int)hi)
       : (int)x; }}
{q} unsigned int poot_f2u(float x) {{
  return x != x || x <= 0.0f ? 0u : x >= 4294967296.0f ? 4294967295u : (unsigned int)x; }}
"""

INT_RANGES = {I32: (-2147483648.0, 2147483648.0), DType.I16: (-32768.0, 32767.0),
              DType.U16: (0.0, 65535.0), DType.I8: (-128.0, 127.0), DType.U8: (0.0, 255.0)}


class CPrinter(Printer):
    """The C family over the printer core. A dialect (CUDA, HIP, GLSL, C) subclasses it and
    fills in the language hooks below; everything else (statements, scalar rules, casts,
    16-bit float widening) is shared. The hooks:

    - `type_name(dtype)`: scalar type names (default: C's)
    - `header(kernel)`: includes and helpers before the prelude
    - `signature(kernel)`: the entry point's declaration, up to its opening brace
    - `builtin(kind, axis, kernel)`: thread, workgroup and global indices
    - `barrier()`: the workgroup barrier statement
    - `shared_decl(name, dtype, count)`: a workgroup-shared array
    - `to_f32` / `from_f32`: 16-bit float widening and nearest-even rounding
    - `bitcast(src, dst, text)`, `clz(text)`
    - `coop_reduce(s, depth)`: the cooperative reduction (subgroup/warp primitives)
    - optional: `entry()` (statements every kernel starts with), `needs_scratch` and
      `reduction_scratch_decl` (shared arrays of the reductions), `matrix` (matrix-unit
      statements, for targets that declare them), `loop_pragma`, `qualifier`.
    """

    backend = "c"
    supported: frozenset = frozenset({F32, I32, U32})
    qualifier = "static inline"

    # -- language hooks ------------------------------------------------------------
    def type_name(self, dtype: DType) -> str:
        return C_TYPES[dtype]

    def header(self, kernel: Kernel) -> str:
        return ""

    def signature(self, kernel: Kernel) -> str:
        raise NotImplementedError

    def barrier(self) -> str:
        raise NotImplementedError

    def shared_decl(self, name: str, dtype: DType, count: int) -> str:
        raise NotImplementedError

    def to_f32(self, dtype: DType, text: str) -> str:
        """Widen a 16-bit float value to float (exact)."""
        raise self.refuse(dtype, "16-bit float arithmetic")

    def from_f32(self, dtype: DType, text: str) -> str:
        """Round a float to a 16-bit float (nearest even)."""
        raise self.refuse(dtype, "16-bit float arithmetic")

    def clz(self, text: str) -> str:
        raise NotImplementedError

    def entry(self) -> list[str]:
        """Statements every kernel starts with (the language's launch protocol)."""
        return []

    def needs_scratch(self, s: CoopReduce, kernel: Kernel) -> bool:
        return False

    def reduction_scratch_decl(self, s: CoopReduce, i: int) -> str:
        return ""

    # -- the translation unit ----------------------------------------------------------
    def unit(self, kernel: Kernel) -> str:
        ind = self.indent_unit
        lines = [self.header(kernel), PRELUDE.format(q=self.qualifier), self.signature(kernel)
                 + " {"]
        for a in kernel.shared:
            lines.append(ind + self.shared_decl(a.name, a.dtype, a.count))
        lines += [f"{ind}{self.reduction_scratch_decl(s, i)}"
                  for i, s in enumerate(kernel.reductions()) if self.needs_scratch(s, kernel)]
        for a in kernel.locals:
            lines.append(f"{ind}{self.type_name(a.dtype)} {a.name}[{a.count}];")
        lines += [ind + x for x in self.entry()]
        lines += self.block(kernel.body, 1)
        lines.append("}")
        return "\n".join(x for x in lines if x is not None) + "\n"

    # -- statements -----------------------------------------------------------------------
    def let(self, s: Let, depth: int) -> list[str]:
        const = "" if s.mutable else "const "
        return [f"{self.pad(depth)}{const}{self.type_name(s.value.dtype)} {s.name} = "
                f"{self.expr(s.value)};"]

    def store(self, s: Store, depth: int) -> list[str]:
        return [f"{self.pad(depth)}{s.array}[{self.expr(s.index)}] = {self.expr(s.value)};"]

    def loop(self, s: For, depth: int) -> list[str]:
        pad = self.pad(depth)
        head = (f"{pad}for (int {s.var} = {self.expr(s.start)}; {s.var} < "
                f"{self.expr(s.stop)}; {s.var} += {self.expr(s.step)}) {{")
        return [*self.loop_pragma(s, pad), head, *self.block(s.body, depth + 1), pad + "}"]

    def condition(self, e: Expr) -> str:
        return f"({self.expr(e)} != 0)"

    def barrier_stmt(self, s: Barrier, depth: int) -> list[str]:
        return [self.pad(depth) + self.barrier()]

    def loop_pragma(self, s: For, pad: str) -> list[str]:
        """Unroll short constant loops (they index per-thread arrays)."""
        if all(isinstance(e, Const) for e in (s.start, s.stop, s.step)):
            trips = math.ceil((s.stop.value - s.start.value) / s.step.value)
            if 0 < trips <= 16:
                return [f"{pad}#pragma unroll"]
        return []

    # -- expressions ----------------------------------------------------------------------
    def select(self, e: Sel) -> str:
        return f"({self.expr(e.cond)} != 0 ? {self.expr(e.t)} : {self.expr(e.f)})"

    def const(self, value, dtype: DType) -> str:
        if dtype is F32 or dtype in NARROW_FLOATS:
            text = self.f32_literal(float(np.float32(value)))
            return text if dtype is F32 else self.from_f32(dtype, text)
        v = int(value)
        if dtype is I32:
            v = (v + 2 ** 31) % 2 ** 32 - 2 ** 31
            return "(-2147483647 - 1)" if v == -2 ** 31 else (f"({v})" if v < 0 else str(v))
        if dtype is U32:
            return f"{v % 2 ** 32}u"
        return f"(({self.type_name(dtype)}){v})"

    def f32_literal(self, v: float) -> str:
        if math.isnan(v):
            return self.bitcast(U32, F32, "0x7fc00000u")
        if math.isinf(v):
            return self.bitcast(U32, F32, "0x7f800000u" if v > 0 else "0xff800000u")
        return f"{v!r}f" if "e" in repr(v) or "." in repr(v) else f"{v!r}.0f"

    def wide(self, e: Expr) -> str:
        """An operand as F32 text when it is a 16-bit float, else as itself."""
        text = self.expr(e)
        return self.to_f32(e.dtype, text) if e.dtype in NARROW_FLOATS else text

    def unary(self, e: Un) -> str:
        d, op = e.x.dtype, e.op
        if op is UnaryOp.Not:
            return f"(~{self.expr(e.x)})"
        if op is UnaryOp.Clz:
            return self.clz(self.expr(e.x)) if d is I32 else \
                f"((unsigned int){self.clz('(int)' + self.expr(e.x))})"
        if d.is_int:  # Neg of I32 (wrapping)
            return f"poot_isub(0, {self.expr(e.x)})"
        r = F32_UNARY[op].format(self.wide(e.x))
        return self.from_f32(d, r) if d in NARROW_FLOATS else r

    def binary(self, e: Bin) -> str:
        """One row of C_BINARY by the operands' class; 16-bit floats compute in float and
        round the result once."""
        d = e.a.dtype
        cls = "f32" if d.is_float else "i32" if d is I32 else "u32" if d is U32 else "small"
        template = C_BINARY[e.op].get(cls)
        if template is None:
            raise self.refuse(d, f"Binary.{e.op.name}", op=f"Binary.{e.op.name}")
        a, b = (self.wide(e.a), self.wide(e.b)) if d.is_float else (self.expr(e.a),
                                                                    self.expr(e.b))
        r = template.format(a=a, b=b, t=self.type_name(d) if cls == "small" else "")
        return self.from_f32(d, r) if e.dtype in NARROW_FLOATS else r

    def cast(self, src: DType, dst: DType, text: str) -> str:
        if src is dst:
            return text
        if src.is_float and dst.is_float:
            wide = self.to_f32(src, text) if src in NARROW_FLOATS else text
            return self.from_f32(dst, wide) if dst in NARROW_FLOATS else wide
        if src.is_float:
            wide = self.to_f32(src, text) if src in NARROW_FLOATS else text
            if dst is U32:
                return f"poot_f2u({wide})"
            lo, hi = INT_RANGES[dst]
            r = f"poot_f2i({wide}, {self.f32_literal(lo)}, {self.f32_literal(hi)})"
            return r if dst is I32 else f"(({self.type_name(dst)}){r})"
        if dst.is_float:
            wide = f"((float)({text}))"
            return self.from_f32(dst, wide) if dst in NARROW_FLOATS else wide
        return f"(({self.type_name(dst)})({text}))"


#: Binary sub-ops by operand class: "f32" (every float; 16-bit ones widen to float and
#: round the result), "i32", "u32", "small" (8/16-bit integers computed in int; {t} is
#: their type). A missing class is refused. A new Binary sub-op adds one row here.
C_BINARY: dict[BinaryOp, dict[str, str]] = {
    BinaryOp.Add: {"f32": "({a} + {b})", "i32": "poot_iadd({a}, {b})", "u32": "({a} + {b})",
                   "small": "(({t})((int){a} + (int){b}))"},
    BinaryOp.Sub: {"f32": "({a} - {b})", "i32": "poot_isub({a}, {b})", "u32": "({a} - {b})",
                   "small": "(({t})((int){a} - (int){b}))"},
    BinaryOp.Mul: {"f32": "({a} * {b})", "i32": "poot_imul({a}, {b})", "u32": "({a} * {b})",
                   "small": "(({t})((int){a} * (int){b}))"},
    BinaryOp.Div: {"f32": "({a} / {b})", "i32": "poot_idiv({a}, {b})",
                   "u32": "poot_udiv({a}, {b})", "small": "(({t})poot_idiv((int){a}, (int){b}))"},
    BinaryOp.Max: {"f32": "poot_fmax({a}, {b})", "i32": "poot_imax({a}, {b})",
                   "u32": "({a} > {b} ? {a} : {b})", "small": "({a} > {b} ? {a} : {b})"},
    BinaryOp.Min: {"f32": "poot_fmin({a}, {b})", "i32": "poot_imin({a}, {b})",
                   "u32": "({a} < {b} ? {a} : {b})", "small": "({a} < {b} ? {a} : {b})"},
    BinaryOp.Ge: dict.fromkeys(("f32", "i32", "u32", "small"), "({a} >= {b} ? 1 : 0)"),
    BinaryOp.GeU: dict.fromkeys(("i32", "u32", "small"),
                                "((unsigned int)({a}) >= (unsigned int)({b}) ? 1 : 0)"),
    BinaryOp.And: dict.fromkeys(("i32", "u32", "small"), "({a} & {b})"),
    BinaryOp.Or: dict.fromkeys(("i32", "u32", "small"), "({a} | {b})"),
    BinaryOp.Xor: dict.fromkeys(("i32", "u32", "small"), "({a} ^ {b})"),
    BinaryOp.Shl: {"i32": "poot_ishl({a}, {b})", "u32": "poot_ushl({a}, {b})"},
    BinaryOp.Shr: {"i32": "poot_ishr({a}, {b})", "u32": "poot_ushr({a}, {b})"},
}

__all__ = ["C_BINARY", "CPrinter", "F32_UNARY", "NARROW_FLOATS", "PRELUDE"]
