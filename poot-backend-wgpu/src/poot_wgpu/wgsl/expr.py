"""Print `poot.codegen.expr` trees as WGSL expressions.

Every node prints as a value of its dtype's register type (`types.LAYOUTS`).
F16 arithmetic is widened to f32 and rounded back once per op, which is the
oracle's rule for floats narrower than F32. A node that a tree uses more than
once is bound to a `let` before the statement, so shared decode subtrees are
computed once and the text stays linear in the tree's size.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from poot.codegen.expr import (
    Bin,
    Bitcast,
    Cast,
    Const,
    Expr,
    Load,
    Sel,
    Un,
    Var,
    children,
    evaluate,
    walk,
)
from poot.dtypes import DType
from poot.errors import DtypeLowering, UnsupportedOp
from poot.ir.ops.elementwise import BinaryOp, UnaryOp

from poot_wgpu.wgsl.helpers import Helpers
from poot_wgpu.wgsl.types import ARITHMETIC, BACKEND, Layout, layout

F32, F16, BF16, I32, U32 = DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32
_NARROW_BITS = {DType.I8: 8, DType.U8: 8, DType.I16: 16, DType.U16: 16}

_FLOAT_UNARY = {UnaryOp.Exp: "exp({})", UnaryOp.Log: "log({})", UnaryOp.Sqrt: "sqrt({})",
                UnaryOp.Recip: "(1.0f / {})", UnaryOp.Tanh: "tanh({})"}
_ARITH_OPS = {BinaryOp.Add: "+", BinaryOp.Sub: "-", BinaryOp.Mul: "*", BinaryOp.Div: "/"}
_BIT_OPS = {BinaryOp.And: "&", BinaryOp.Or: "|", BinaryOp.Xor: "^"}


@dataclass(frozen=True)
class ArrayInfo:
    """What the printer needs to know about an array a Load or Store names."""

    wgsl_name: str
    dtype: DType
    atomic: bool = False  # packed fields that threads write: array<atomic<u32>>


@dataclass
class Context:
    """Names and facts the expression printer resolves against (one kernel)."""

    device: str
    features: frozenset[str]
    arrays: dict[str, ArrayInfo]
    variables: dict[str, str]                 # program name -> WGSL text (builtins, lets)
    helpers: Helpers = field(default_factory=Helpers)
    kernel: str = ""
    uses_f16: bool = False
    _temps: int = 0

    def layout(self, dtype: DType, op: str = "") -> Layout:
        lay = layout(dtype, self.features, self.device, op)
        if dtype is F16:
            self.uses_f16 = True
        return lay

    def refuse(self, msg: str, dtype: DType, op: str, cls=DtypeLowering):
        raise cls(f"kernel {self.kernel}: {msg}", op=op, dtype=str(dtype), backend=BACKEND,
                  device=self.device)

    def temp(self) -> str:
        self._temps += 1
        return f"t{self._temps}"


def _runtime_nodes(e: Expr) -> set[int]:
    """Ids of the nodes whose value depends on a Var or a Load."""
    out: set[int] = set()
    for n in walk(e):  # children before parents
        if isinstance(n, (Var, Load)) or any(id(c) in out for c in children(n)):
            out.add(id(n))
    return out


def _small_constant(e: Expr, bound: int) -> int | None:
    """The value of an integer constant in [0, bound), else None."""
    if isinstance(e, Const) and e.dtype.is_int and 0 <= int(e.value) < bound:
        return int(e.value)
    return None


def f32_literal(value: float) -> str:
    v = np.float32(value)
    bits = int(v.view(np.uint32))
    if not np.isfinite(v) or (v != 0 and abs(v) < np.finfo(np.float32).tiny):
        return f"bitcast<f32>(0x{bits:08x}u)"  # WGSL has no NaN/Inf literals; keep subnormals
    text = repr(float(v))
    return f"({text}f)" if text.startswith("-") else f"{text}f"


def _wrap_int(value: int, bits: int, signed: bool) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if signed and value >> (bits - 1) else value


def int_literal(value: int, dtype: DType) -> str:
    if dtype in (I32, DType.I16, DType.I8):
        v = _wrap_int(int(value), 32 if dtype is I32 else _NARROW_BITS[dtype], True)
        if v == -2**31:
            return "(-2147483647i - 1i)"
        return f"({v}i)" if v < 0 else f"{v}i"
    v = _wrap_int(int(value), 32 if dtype is U32 else _NARROW_BITS[dtype], False)
    return f"{v}u"


class ExprPrinter:
    def __init__(self, ctx: Context):
        self.ctx = ctx

    # -- entry point ---------------------------------------------------------------
    def print(self, e: Expr, as_bool: bool = False) -> tuple[list[str], str]:
        """(let lines to emit before the statement, the expression's text); with `as_bool`,
        the text is a WGSL bool that is true where the I32 value is nonzero."""
        uses: Counter[int] = Counter()
        seen: set[int] = set()

        def count(n: Expr):
            uses[id(n)] += 1
            if id(n) in seen:
                return
            seen.add(id(n))
            for c in children(n):
                count(c)

        count(e)
        lines: list[str] = []
        memo: dict[int, str] = {}
        runtime = _runtime_nodes(e)
        self.bools = {}  # id of an indicator node (0 or 1) -> its WGSL bool text

        def go(n: Expr) -> str:
            if id(n) in memo:
                return memo[id(n)]
            text = self.node(n, [go(c) for c in children(n)])  # also checks dtypes
            if not isinstance(n, Const) and id(n) not in runtime:
                # fold with the oracle's rules: naga const-evaluates literal arithmetic and
                # refuses what overflows (1.0f / 0.0f, -INT_MIN) where runtime code would not
                text = self.const(Const(evaluate(n, {}, {}).item(), n.dtype))
            if uses[id(n)] > 1 and not isinstance(n, (Const, Var)):
                name = self.ctx.temp()
                lines.append(f"let {name} = {text};")
                text = name
            memo[id(n)] = text
            return text

        text = go(e)
        return lines, (self.cond(e, text) if as_bool else text)

    def cond(self, n: Expr, text: str) -> str:
        """The bool `n != 0` for an I32 node already printed as `text`."""
        return self.bools.get(id(n)) or f"({text} != 0i)"

    # -- nodes ---------------------------------------------------------------------
    def node(self, n: Expr, args: list[str]) -> str:
        ctx = self.ctx
        if isinstance(n, Const):
            return self.const(n)
        if isinstance(n, Var):
            ctx.layout(n.dtype)
            try:
                return ctx.variables[n.name]
            except KeyError:
                raise UnsupportedOp(f"kernel {ctx.kernel}: variable {n.name!r} is not in scope",
                                    backend=BACKEND, device=ctx.device) from None
        if isinstance(n, Load):
            return self.load(n, args[0])
        if isinstance(n, Un):
            return self.unary(n, args[0])
        if isinstance(n, Bin):
            return self.binary(n, *args)
        if isinstance(n, Sel):
            if n.dtype in (F16, BF16):  # the spec's rule for SPIR-V targets
                ctx.refuse(f"Select on {n.dtype} is not lowered on SPIR-V targets (wgpu); "
                           f"select in f32 or i32", n.dtype, "Select")
            ctx.layout(n.dtype, "Select")
            return f"select({args[2]}, {args[1]}, {self.cond(n.cond, args[0])})"
        if isinstance(n, Cast):
            return self.cast(n.x.dtype, n.dtype, args[0])
        if isinstance(n, Bitcast):
            for d in (n.x.dtype, n.dtype):
                if d not in (F32, I32, U32):
                    ctx.refuse(f"Bitcast {n.x.dtype} -> {n.dtype}: only 32-bit words", d,
                               "Bitcast")
            return args[0] if n.x.dtype is n.dtype else f"bitcast<{n.dtype.value}>({args[0]})"
        raise UnsupportedOp(f"kernel {ctx.kernel}: no WGSL for expression {type(n).__name__}",
                            backend=BACKEND, device=ctx.device)

    def const(self, n: Const) -> str:
        d = n.dtype
        self.ctx.layout(d, "Const")
        if d is F32:
            return f32_literal(n.value)
        if d is BF16:
            return f32_literal(float(np.float32(n.value).astype(d.numpy)))
        if d is F16:
            v = float(np.float16(n.value))
            if math.isfinite(v) and (v == 0 or abs(v) >= float(np.finfo(np.float16).tiny)):
                text = repr(v)
                return f"({text}h)" if text.startswith("-") else f"{text}h"
            return f"f16({f32_literal(v)})"
        return int_literal(int(n.value), d)

    def load(self, n: Load, index: str) -> str:
        info = self.ctx.arrays[n.buffer]
        lay = self.ctx.layout(info.dtype, "Load")
        if not lay.packed_bits:
            return f"{info.wgsl_name}[{index}]"
        word = f"{info.wgsl_name}[u32({index}) / {lay.per_word}u]"
        if info.atomic:
            word = f"atomicLoad(&{word})"
        offset = f"(u32({index}) % {lay.per_word}u) * {lay.packed_bits}u"
        if info.dtype is BF16:
            return f"bitcast<f32>(extractBits({word}, {offset}, 16u) << 16u)"
        if info.dtype.is_signed:  # extractBits on i32 sign-extends the field
            return f"extractBits(bitcast<i32>({word}), {offset}, {lay.packed_bits}u)"
        return f"extractBits({word}, {offset}, {lay.packed_bits}u)"

    def _arith_dtype(self, d: DType, op: str):
        self.ctx.layout(d, op)
        if d not in ARITHMETIC:
            self.ctx.refuse(f"{op} on {d}: {d} is storage-and-conversion only on wgpu; cast "
                            f"to f32 first", d, op)

    def unary(self, n: Un, x: str) -> str:
        d, op = n.x.dtype, n.op
        self._arith_dtype(d, f"Unary.{op.name}")
        if op is UnaryOp.Not:
            return f"(~{x})"
        if op is UnaryOp.Clz:
            return f"countLeadingZeros({x})"
        if op is UnaryOp.Neg:
            return self.wrap(f"(-{x})", d)
        if d is F16:
            return f"f16({self.float_unary(op, f'f32({x})')})"
        return self.float_unary(op, x)

    def float_unary(self, op: UnaryOp, x: str) -> str:
        if op is UnaryOp.Erf:
            return self.ctx.helpers.call("poot_erf", x)
        return _FLOAT_UNARY[op].format(x)

    def binary(self, n: Bin, a: str, b: str) -> str:
        d, op = n.a.dtype, n.op
        self._arith_dtype(d, f"Binary.{op.name}")
        h = self.ctx.helpers
        if op.compare:
            if d is F16:
                a, b = f"f32({a})", f"f32({b})"
            elif op is BinaryOp.GeU and d is I32:
                a, b = f"bitcast<u32>({a})", f"bitcast<u32>({b})"
            return self.indicator(n, f"({a} >= {b})")
        if op in _BIT_OPS:
            logical = self.logical(n)
            return self.indicator(n, logical) if logical else f"({a} {_BIT_OPS[op]} {b})"
        amount = _small_constant(n.b, 32)
        if op in (BinaryOp.Shl, BinaryOp.Shr) and amount is not None:
            return f"({a} {'<<' if op is BinaryOp.Shl else '>>'} {amount}u)"  # in range
        if op in (BinaryOp.Shl, BinaryOp.Shr):
            return h.call(f"poot_{op.name.lower()}_{d.value}", a, b)
        if d.is_float:
            if d is F16:
                return f"f16({self.float_binary(op, f'f32({a})', f'f32({b})')})"
            return self.float_binary(op, a, b)
        wide = "i32" if d.is_signed else "u32"
        if op is BinaryOp.Div and _small_constant(n.b, 2**31) not in (None, 0):
            return self.wrap(f"({a} / {b})", d)  # a positive divisor: WGSL's rule is ours
        if op is BinaryOp.Div:
            return self.wrap(h.call(f"poot_div_{wide}", a, b), d)
        if op is BinaryOp.Max:
            return f"max({a}, {b})"
        return self.wrap(f"({a} {_ARITH_OPS[op]} {b})", d)

    def indicator(self, n: Expr, boolean: str) -> str:
        self.bools[id(n)] = boolean
        return f"select(0i, 1i, {boolean})"

    def logical(self, n: Bin) -> str | None:
        """And/Or of two indicators, or Xor of one with 1, as a bool (None otherwise)."""
        a, b = self.bools.get(id(n.a)), self.bools.get(id(n.b))
        if a and b and n.op in (BinaryOp.And, BinaryOp.Or):
            return f"({a} {'&&' if n.op is BinaryOp.And else '||'} {b})"
        if n.op is BinaryOp.Xor and a and _small_constant(n.b, 2) == 1:
            return f"(!{a})"
        return None

    def float_binary(self, op: BinaryOp, a: str, b: str) -> str:
        if op is BinaryOp.Max:
            return self.ctx.helpers.call("poot_max_f32", a, b)
        return f"({a} {_ARITH_OPS[op]} {b})"

    def wrap(self, text: str, d: DType) -> str:
        """Wrap an i32/u32 result back to an 8/16-bit integer dtype (a no-op for others)."""
        bits = _NARROW_BITS.get(d)
        if bits is None:
            return text
        if d.is_signed:
            return f"extractBits({text}, 0u, {bits}u)"
        return f"({text} & {(1 << bits) - 1}u)"

    # -- casts -------------------------------------------------------------------------
    def cast(self, src: DType, to: DType, x: str) -> str:
        self.ctx.layout(src, "Cast")
        self.ctx.layout(to, "Cast")
        if src is to:
            return x
        if src.is_float:
            wide = x if src is not F16 else f"f32({x})"
            return self.from_f32(wide, to)
        if to.is_float:
            return self.from_f32(f"f32({x})", to)
        return self.int_to_int(src, to, x)

    def from_f32(self, x: str, to: DType) -> str:
        h = self.ctx.helpers
        if to is F32:
            return x
        if to is F16:
            return f"f16({x})"
        if to is BF16:
            return h.call("poot_round_bf16", x)
        if to is I32:
            return h.call("poot_f32_to_i32", x)
        if to is U32:
            return h.call("poot_f32_to_u32", x)
        info = np.iinfo(to.numpy)
        clamped = h.call("poot_f32_to_narrow", x, f32_literal(info.min), f32_literal(info.max))
        return f"{'i32' if to.is_signed else 'u32'}({clamped})"

    def int_to_int(self, src: DType, to: DType, x: str) -> str:
        src_wide = "i32" if src.is_signed else "u32"
        to_wide = "i32" if to.is_signed else "u32"
        if src_wide != to_wide:
            x = f"bitcast<{to_wide}>({x})"  # 32-bit two's complement reinterpretation
        return self.wrap(x, to)
