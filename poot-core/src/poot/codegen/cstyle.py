"""The C-like printer of kernel programs: CUDA and HIP share it; GLSL is close to it.

`CPrinter.source(kernel)` gives one translation unit: a prelude of helpers that
pin down the IR's scalar semantics where C leaves them open (integer division
by zero, shifts of 32 or more, signed overflow, NaN-propagating max,
saturating float-to-int), then the kernel. A subclass supplies the language:
type names, the kernel signature, builtin indices, the barrier, 16-bit float
conversions and the cooperative reduction (`coop_reduce`).

A dtype the printer's device cannot do is refused with `DtypeLowering`
(`supported`): arithmetic is never moved into another type behind the user's
back. 16-bit floats compute in F32 and round once per op, which is the IR's
own rule for them (poot.oracle.scalar), not an emulation.
"""
from __future__ import annotations

import math

import numpy as np

from poot.codegen.expr import Bin, Bitcast, Cast, Const, Expr, Load, Sel, Un, Var
from poot.codegen.program import (
    BUILTINS,
    Assign,
    Barrier,
    CoopReduce,
    CopyAsync,
    CopyCommit,
    CopyWait,
    For,
    If,
    Kernel,
    Let,
    MmaTile,
    Stmt,
    Store,
)
from poot.dtypes import DType
from poot.errors import DtypeLowering, UnsupportedOp
from poot.ir.ops import BinaryOp, UnaryOp

F32, F16, BF16, I32, U32 = DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32
NARROW_FLOATS = (F16, BF16)

C_TYPES = {F32: "float", I32: "int", U32: "unsigned int", DType.I16: "short",
           DType.U16: "unsigned short", DType.I8: "signed char", DType.U8: "unsigned char"}

F32_UNARY = {UnaryOp.Exp: "expf", UnaryOp.Log: "logf", UnaryOp.Sqrt: "sqrtf",
             UnaryOp.Tanh: "tanhf", UnaryOp.Erf: "erff"}

# Helpers shared by every C-like language; `{q}` is the function qualifier.
PRELUDE = """\
{q} float poot_fmax(float a, float b) {{ return (a > b || a != a) ? a : b; }}
{q} int poot_imax(int a, int b) {{ return a > b ? a : b; }}
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


class CPrinter:
    """Prints kernel programs as C-like source. Subclasses fill in the language hooks."""

    #: the backend and device named in refusals
    backend = "c"
    device = ""
    #: dtypes this printer's device can hold and compute with
    supported: frozenset = frozenset({F32, I32, U32})
    qualifier = "static inline"
    indent_unit = "  "

    # -- language hooks ------------------------------------------------------------
    def type_name(self, dtype: DType) -> str:
        return C_TYPES[dtype]

    def header(self, kernel: Kernel) -> str:
        return ""

    def signature(self, kernel: Kernel) -> str:
        raise NotImplementedError

    def builtin(self, kind: str, axis: int, kernel: Kernel) -> str:
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

    def bitcast(self, src: DType, dst: DType, text: str) -> str:
        raise NotImplementedError

    def clz(self, text: str) -> str:
        raise NotImplementedError

    def coop_reduce(self, s: CoopReduce, kernel: Kernel, depth: int) -> list[str]:
        raise NotImplementedError

    def matrix_stmt(self, s: Stmt, depth: int) -> list[str]:
        """CopyAsync / CopyCommit / CopyWait / MmaTile: only printers of targets that
        declare those features print them."""
        raise UnsupportedOp(f"{self.backend} prints no {type(s).__name__} statement",
                            op=self._kernel.name, backend=self.backend, device=self.device)

    # -- refusals --------------------------------------------------------------------
    def refuse(self, dtype: DType, what: str, op: str = "") -> DtypeLowering:
        return DtypeLowering(f"{self.backend} cannot do {what} on {dtype}", op=op,
                             dtype=str(dtype), backend=self.backend, device=self.device)

    def check_dtypes(self, kernel: Kernel) -> None:
        for d in sorted(kernel.dtypes(), key=lambda d: d.value):
            if d not in self.supported:
                raise self.refuse(d, f"kernel {kernel.name}", op=kernel.name)

    # -- the translation unit ----------------------------------------------------------
    def source(self, kernel: Kernel) -> str:
        kernel.validate()
        self.check_dtypes(kernel)
        self._kernel = kernel
        self._reductions = 0
        lines = [self.header(kernel), PRELUDE.format(q=self.qualifier), self.signature(kernel)
                 + " {"]
        for a in kernel.shared:
            lines.append(self.indent_unit + self.shared_decl(a.name, a.dtype, a.count))
        lines += [f"{self.indent_unit}{self.reduction_scratch_decl(s, i)}"
                  for i, s in enumerate(kernel.reductions()) if self.needs_scratch(s, kernel)]
        for a in kernel.locals:
            lines.append(f"{self.indent_unit}{self.type_name(a.dtype)} {a.name}[{a.count}];")
        lines += [self.indent_unit + x for x in self.entry()]
        lines += self.block(kernel.body, 1)
        lines.append("}")
        return "\n".join(x for x in lines if x is not None) + "\n"

    def entry(self) -> list[str]:
        """Statements every kernel starts with (the language's launch protocol)."""
        return []

    def needs_scratch(self, s: CoopReduce, kernel: Kernel) -> bool:
        return False

    def reduction_scratch_decl(self, s: CoopReduce, i: int) -> str:
        return ""

    # -- statements -----------------------------------------------------------------------
    def block(self, body, depth: int) -> list[str]:
        out = []
        for s in body:
            out += self.stmt(s, depth)
        return out

    def stmt(self, s: Stmt, depth: int) -> list[str]:
        pad = self.indent_unit * depth
        if isinstance(s, Let):
            const = "" if s.mutable else "const "
            return [f"{pad}{const}{self.type_name(s.value.dtype)} {s.name} = "
                    f"{self.expr(s.value)};"]
        if isinstance(s, Assign):
            return [f"{pad}{s.name} = {self.expr(s.value)};"]
        if isinstance(s, Store):
            return [f"{pad}{s.array}[{self.expr(s.index)}] = {self.expr(s.value)};"]
        if isinstance(s, For):
            head = (f"{pad}for (int {s.var} = {self.expr(s.start)}; {s.var} < "
                    f"{self.expr(s.stop)}; {s.var} += {self.expr(s.step)}) {{")
            return [*self.loop_pragma(s, pad), head, *self.block(s.body, depth + 1), pad + "}"]
        if isinstance(s, If):
            out = [f"{pad}if ({self.expr(s.cond)} != 0) {{", *self.block(s.then, depth + 1)]
            if s.orelse:
                out += [pad + "} else {", *self.block(s.orelse, depth + 1)]
            return out + [pad + "}"]
        if isinstance(s, Barrier):
            return [pad + self.barrier()]
        if isinstance(s, CoopReduce):
            return self.coop_reduce(s, self._kernel, depth)
        if isinstance(s, (CopyAsync, CopyCommit, CopyWait, MmaTile)):
            return self.matrix_stmt(s, depth)
        raise TypeError(f"unknown statement {s!r}")

    def loop_pragma(self, s: For, pad: str) -> list[str]:
        """Unroll short constant loops (they index per-thread arrays)."""
        if all(isinstance(e, Const) for e in (s.start, s.stop, s.step)):
            trips = math.ceil((s.stop.value - s.start.value) / s.step.value)
            if 0 < trips <= 16:
                return [f"{pad}#pragma unroll"]
        return []

    # -- expressions ----------------------------------------------------------------------
    def expr(self, e: Expr) -> str:
        if isinstance(e, Const):
            return self.const(e.value, e.dtype)
        if isinstance(e, Var):
            if e.name in BUILTINS:
                kind, axis = BUILTINS[e.name]
                return self.builtin(kind, axis, self._kernel)
            return e.name
        if isinstance(e, Load):
            return f"{e.buffer}[{self.expr(e.index)}]"
        if isinstance(e, Un):
            return self.unary(e)
        if isinstance(e, Bin):
            return self.binary(e)
        if isinstance(e, Sel):
            return f"({self.expr(e.cond)} != 0 ? {self.expr(e.t)} : {self.expr(e.f)})"
        if isinstance(e, Cast):
            return self.cast(e.x.dtype, e.dtype, self.expr(e.x))
        if isinstance(e, Bitcast):
            if e.x.dtype is e.dtype:
                return self.expr(e.x)
            return self.bitcast(e.x.dtype, e.dtype, self.expr(e.x))
        raise TypeError(f"unknown expression {e!r}")

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
        x = self.wide(e.x)
        if op is UnaryOp.Neg:
            r = f"(-{x})"
        elif op is UnaryOp.Recip:
            r = f"(1.0f / {x})"
        else:
            r = f"{F32_UNARY[op]}({x})"
        return self.from_f32(d, r) if d in NARROW_FLOATS else r

    def binary(self, e: Bin) -> str:
        d, op = e.a.dtype, e.op
        if d.is_float:
            a, b = self.wide(e.a), self.wide(e.b)
            if op is BinaryOp.Ge:
                return f"({a} >= {b} ? 1 : 0)"
            if op is BinaryOp.Max:
                r = f"poot_fmax({a}, {b})"
            else:
                r = f"({a} {_C_OPS[op]} {b})"
            return self.from_f32(d, r) if d in NARROW_FLOATS else r
        a, b = self.expr(e.a), self.expr(e.b)
        if op is BinaryOp.Ge:
            return f"({a} >= {b} ? 1 : 0)"
        if op is BinaryOp.GeU:
            return f"((unsigned int)({a}) >= (unsigned int)({b}) ? 1 : 0)"
        if op in (BinaryOp.And, BinaryOp.Or, BinaryOp.Xor):
            return f"({a} {_C_OPS[op]} {b})"
        if d is I32:
            fn = {BinaryOp.Add: "poot_iadd", BinaryOp.Sub: "poot_isub", BinaryOp.Mul: "poot_imul",
                  BinaryOp.Div: "poot_idiv", BinaryOp.Max: "poot_imax",
                  BinaryOp.Shl: "poot_ishl", BinaryOp.Shr: "poot_ishr"}[op]
            return f"{fn}({a}, {b})"
        if d is U32:
            if op is BinaryOp.Div:
                return f"poot_udiv({a}, {b})"
            if op is BinaryOp.Max:
                return f"({a} > {b} ? {a} : {b})"
            if op in (BinaryOp.Shl, BinaryOp.Shr):
                return f"poot_u{'shl' if op is BinaryOp.Shl else 'shr'}({a}, {b})"
            return f"({a} {_C_OPS[op]} {b})"
        # 8- and 16-bit integers: compute in int, wrap back to the type
        t = self.type_name(d)
        if op is BinaryOp.Div:
            return f"(({t})poot_idiv((int){a}, (int){b}))"
        if op is BinaryOp.Max:
            return f"({a} > {b} ? {a} : {b})"
        return f"(({t})((int){a} {_C_OPS[op]} (int){b}))"

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


_C_OPS = {BinaryOp.Add: "+", BinaryOp.Sub: "-", BinaryOp.Mul: "*", BinaryOp.Div: "/",
          BinaryOp.And: "&", BinaryOp.Or: "|", BinaryOp.Xor: "^"}

__all__ = ["CPrinter", "PRELUDE", "NARROW_FLOATS"]
