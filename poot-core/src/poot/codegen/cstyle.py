"""The C-style dialect family over the printer core (poot.codegen.printer).

CUDA prints with it today; HIP, GLSL and plain C are dialects of it the same way.
`CPrinter.unit(kernel)` gives one translation unit: the named scalar helpers that pin down
the IR's scalar semantics where C leaves them open (integer division by zero, shifts of
32 or more, signed overflow, NaN-propagating max, saturating float-to-int), rendered from
poot.codegen.scalar's table in the dialect's language, then the kernel. Unary and Binary
print through that module's tables (`UNARY`, `BINARY`): a new sub-op is one row there.
A dialect is a small subclass that names its language (see `CPrinter`):

    class HipPrinter(CPrinter):
        backend, qualifier = "rocm", "static __device__ inline"
        def signature(self, k): return f'extern "C" __global__ void {k.name}(...)'
        def builtin(self, kind, axis, k): ...   # threadIdx / blockIdx / their sums
        def barrier(self): return "__syncthreads();"
        def coop_reduce(self, s, depth): ...     # wavefront shuffles

A dtype the printer's device cannot do is refused with `DtypeLowering`
(`supported`): arithmetic is never moved into another type behind the user's
back. 16-bit floats compute in F32 and round once per op, which is the IR's
own rule for them (poot.oracle.scalar), not an emulation.
"""
from __future__ import annotations

import math

import numpy as np

from poot.codegen.expr import Bin, Const, Expr, Sel, Un
from poot.codegen.printer import Printer
from poot.codegen.program import Barrier, CoopReduce, For, Kernel, Let, Store
from poot.codegen.scalar import (
    BINARY,
    HELPERS,
    INT_RANGES,
    UNARY,
    Helper,
    apply,
    in_order,
    shared_lets,
    word_class,
)
from poot.dtypes import DType
from poot.ir.ops import UnaryOp

F32, F16, BF16, I32, U32 = DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32
NARROW_FLOATS = (F16, BF16)

C_TYPES = {F32: "float", I32: "int", U32: "unsigned int", DType.I16: "short",
           DType.U16: "unsigned short", DType.I8: "signed char", DType.U8: "unsigned char"}

class CPrinter(Printer):
    """The C family over the printer core. A dialect (CUDA, HIP, GLSL, C) subclasses it and
    fills in the language hooks below; everything else (statements, scalar rules, casts,
    16-bit float widening) is shared. The hooks:

    - `type_name(dtype)`: scalar type names (default: C's, and `f16_type`/`bf16_type`)
    - `header(kernel)`: includes and helpers before the prelude
    - `signature(kernel)`: the entry point's declaration, up to its opening brace
    - `builtin(kind, axis, kernel)`: thread, workgroup and global indices
    - `barrier()`: the workgroup barrier statement
    - `shared_decl(name, dtype, count)`: a workgroup-shared array
    - `to_f32` / `from_f32`: 16-bit float widening and nearest-even rounding (default:
      conversions for F16, the shared bf16 helpers for BF16 held as its bits)
    - `languages`, `conversion(dtype)`, `truth_type`, `holds_bf16_bits`: how the
      scalar helpers (poot.codegen.scalar) are spelled and which ones the unit holds
    - `bitcast(src, dst, text)`, `clz(text)`, `convert(dtype, text)` (a value conversion)
    - `coop_reduce(s, depth)`: the cooperative reduction (subgroup/warp primitives)
    - optional: `entry()` (statements every kernel starts with), `needs_scratch` and
      `reduction_scratch_decl` (shared arrays of the reductions), `matrix` (matrix-unit
      statements, for targets that declare them), `loop_pragma`, `qualifier`.
    """

    backend = "c"
    supported: frozenset = frozenset({F32, I32, U32})
    qualifier = "static inline"
    #: the helper spellings this dialect prints, most specific first (poot.codegen.scalar)
    languages: tuple[str, ...] = ("c",)
    #: the type of a helper's truth value
    truth_type = "int"
    #: BF16 is held as its 16 bits (the bf16 helpers are printed), not a native type
    holds_bf16_bits = False
    #: the 16-bit float type names, where the device supports them
    f16_type = bf16_type = ""

    # -- language hooks ------------------------------------------------------------
    def type_name(self, dtype: DType) -> str:
        return {F16: self.f16_type, BF16: self.bf16_type}.get(dtype) or C_TYPES[dtype]

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
        if dtype not in self.supported:
            raise self.refuse(dtype, "16-bit float arithmetic")
        if dtype is BF16:
            return f"poot_bf16_to_f32({self.convert(U32, text)})"
        return self.convert(F32, f"({text})")

    def from_f32(self, dtype: DType, text: str) -> str:
        """Round a float to a 16-bit float (nearest even)."""
        if dtype not in self.supported:
            raise self.refuse(dtype, "16-bit float arithmetic")
        if dtype is BF16:
            return self.convert(BF16, f"poot_f32_to_bf16({text})")
        return self.convert(F16, f"({text})")

    def clz(self, text: str) -> str:
        raise NotImplementedError

    def convert(self, dtype: DType, text: str) -> str:
        """A value conversion to `dtype` (C's cast; constructor-style languages differ)."""
        return f"(({self.type_name(dtype)}){text})"

    def conversion(self, dtype: DType) -> str:
        """What a helper text's `{i32}(...)` (a value conversion) is spelled as."""
        return f"({self.type_name(dtype)})"

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
        lines = [self.header(kernel), self.scalar_helpers(), self.signature(kernel) + " {"]
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

    # -- the scalar helpers -----------------------------------------------------------------
    def scalar_helpers(self) -> str:
        """Every helper function of the table this dialect spells as a function, each after
        the ones it calls."""
        if "_scalar_helpers" not in self.__dict__:    # the same for every kernel
            names = [h.name for h in HELPERS.values() if self.holds_bf16_bits or not h.bits16]
            self._scalar_helpers = "".join(
                self.helper_source(h) for h in in_order(names, self.languages)
                if h.spelling(self.languages)[0] != "inline")
        return self._scalar_helpers

    def helper_source(self, h: Helper) -> str:
        """One helper as a function of this dialect: its text (conversions spelled), or its
        shared body printed by this printer."""
        kind, spelled = h.spelling(self.languages)
        if kind == "body":
            params = [(self.name(p), d) for p, d in h.params]
            lets, result = shared_lets(spelled)
            body = "\n".join([*(f"const {self.type_name(e.dtype)} {self.name(n)} = "
                                 f"{self.expr(e)};" for n, e in lets),
                               f"return {self.expr(result)};"])
        else:
            params = list(h.params)
            body = spelled.format(**{d.value: self.conversion(d) for d in (I32, U32, F32)})
        ret = self.truth_type if h.result is None else self.type_name(h.result)
        args = ", ".join(f"{self.type_name(d)} {p}" for p, d in params)
        head = f"{self.qualifier} {ret} {h.name}({args})".strip()
        return f"{head} {{\n  " + body.replace("\n", "\n  ") + "\n}\n"

    def indicator(self, truth: str) -> str:
        """The I32 indicator (0 or 1) of a truth value."""
        return f"({truth} ? 1 : 0)"

    # -- statements -----------------------------------------------------------------------
    def let(self, s: Let, depth: int) -> list[str]:
        const = "" if s.mutable else "const "
        return [f"{self.pad(depth)}{const}{self.type_name(s.value.dtype)} "
                f"{self.name(s.name)} = {self.expr(s.value)};"]

    def store(self, s: Store, depth: int) -> list[str]:
        return [f"{self.pad(depth)}{s.array}[{self.expr(s.index)}] = {self.expr(s.value)};"]

    def loop(self, s: For, depth: int) -> list[str]:
        pad = self.pad(depth)
        v = self.name(s.var)
        head = (f"{pad}for (int {v} = {self.expr(s.start)}; {v} < "
                f"{self.expr(s.stop)}; {v} += {self.expr(s.step)}) {{")
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
        return self.convert(dtype, str(v))

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
        """One row of poot.codegen.scalar.UNARY (Clz: the dialect's builtin); 16-bit floats
        compute in float and round the result once."""
        d, op = e.x.dtype, e.op
        if op is UnaryOp.Clz:
            return self.clz(self.expr(e.x)) if d is I32 else \
                self.convert(U32, self.clz(self.convert(I32, self.expr(e.x))))
        rule = UNARY[op].get(word_class(d))
        if rule is None:
            raise self.refuse(d, f"Unary.{op.name}", op=f"Unary.{op.name}")
        r = apply(rule, self.languages, x=self.wide(e.x))
        return self.from_f32(d, r) if d in NARROW_FLOATS else r

    def binary(self, e: Bin) -> str:
        """One row of poot.codegen.scalar.BINARY by the operands' class: 16-bit floats
        compute in float and round the result once; 8/16-bit integers compute in int and
        are converted back; a comparison is its indicator."""
        d = e.a.dtype
        rule = BINARY[e.op].get(word_class(d))
        if rule is None:
            raise self.refuse(d, f"Binary.{e.op.name}", op=f"Binary.{e.op.name}")
        if d.is_float:
            a, b = self.wide(e.a), self.wide(e.b)
        elif d in (I32, U32):
            a, b = self.expr(e.a), self.expr(e.b)
        else:
            a, b = self.convert(I32, self.expr(e.a)), self.convert(I32, self.expr(e.b))
        r = apply(rule, self.languages, a=a, b=b)
        if e.op.compare:
            return self.indicator(r)
        if d in NARROW_FLOATS:
            return self.from_f32(d, r)
        return r if d.is_float or d in (I32, U32) else self.convert(d, r)

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
            return r if dst is I32 else self.convert(dst, r)
        if dst.is_float:
            wide = self.convert(F32, f"({text})")
            return self.from_f32(dst, wide) if dst in NARROW_FLOATS else wide
        return self.convert(dst, f"({text})")


__all__ = ["CPrinter", "NARROW_FLOATS"]
