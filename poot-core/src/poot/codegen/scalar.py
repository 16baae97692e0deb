"""Named scalar helpers and the Unary/Binary tables every dialect prints with.

A language leaves some of the IR's scalar rules (poot.oracle.scalar) open or different:
integer x / 0, shifts of 32 or more, signed overflow, NaN through max, float-to-int
overflow, bf16 rounding, functions it lacks (erf). Each rule is one `Helper` here: a
name every dialect calls, what it computes, and its body, given once as

* `body`: a shared codegen expression over the parameters (`Var`s), which each dialect
  prints with its own expression printer (and `poot.codegen.expr.evaluate` checks against
  the oracle); or
* `text`: the function body in a language family ("c": C, CUDA C, HIP C++ and GLSL, with
  value conversions written `{i32}(...)`, `{u32}(...)`, `{f32}(...)`; "glsl"; "wgsl"),
  where the body is itself the rule a language's operator lacks (integer division,
  shifts, NaN max, float to int);

and `inline`, per language, where a builtin of the language already is the rule: it is
spelled at the call site (`{x}`, `{a}`, `{b}` are the operands), no function is printed.

`UNARY` and `BINARY` give, per sub-op and operand class ("f32": every float, computed in
F32; "i32"; "u32"), an operator template shared by every language or a helper's name.
8/16-bit integers compute with the I32 row and are wrapped back; a comparison's text is a
truth value each dialect turns into its I32 indicator. A new sub-op is one row; a new
rule one `Helper`.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from poot.codegen.expr import Bin, Const, Expr, Sel, Un, Var, children, f32, ge, u32, walk
from poot.dtypes import DType
from poot.ir.ops import BinaryOp, UnaryOp

F32, I32, U32 = DType.F32, DType.I32, DType.U32


@dataclass(frozen=True)
class Helper:
    """One named scalar rule (see the module docstring). `result` None: a truth value (the
    language's bool; int in C). `needs`: the helpers its texts call (a body's are found
    in it). `bits16`: only dialects that hold BF16 as its 16 bits print it."""

    name: str
    doc: str
    params: tuple[tuple[str, DType], ...]
    result: DType | None
    body: Expr | None = None
    text: Mapping[str, str] = field(default_factory=dict)
    inline: Mapping[str, str] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    bits16: bool = False

    def spelling(self, languages: Iterable[str]) -> tuple[str, str | Expr]:
        """("inline", template), ("text", function body) or ("body", expression) in a
        dialect whose `languages` are its own first, then the families it borrows from:
        its own spelling, else the shared body, else a borrowed spelling."""
        own, *borrowed = languages
        for lang, body in ((own, None), (None, self.body), *((b, None) for b in borrowed)):
            if body is not None:
                return "body", body
            if lang in self.inline:
                return "inline", self.inline[lang]
            if lang in self.text:
                return "text", self.text[lang]
        raise KeyError(f"helper {self.name} has no spelling for {list(languages)}")

    def call(self, languages: Iterable[str], *args: str) -> str:
        """The call of this helper on argument texts, inline where the language has it."""
        kind, spelled = self.spelling(languages)
        if kind == "inline":
            return spelled.format(**dict(zip((p for p, _ in self.params), args, strict=True)))
        return f"{self.name}({', '.join(args)})"

    def calls(self, languages: Iterable[str]) -> list[str]:
        """The helpers this one's spelling in `languages` calls."""
        kind, spelled = self.spelling(languages)
        if kind == "body":
            return [n for n in map(helper_of, walk(spelled)) if n is not None]
        return [] if kind == "inline" else list(self.needs)


# -- bodies given once, as shared expressions ------------------------------------------------
def _p(name: str, dtype: DType) -> Var:
    return Var(name, dtype)


def _is_nan(x: Expr) -> Expr:
    """1 where F32 `x` is a NaN, tested on its bits (no float compare a compiler may fold)."""
    return ge(x.bitcast(U32) & u32(0x7FFFFFFF), u32(0x7F800001))


def _wrapping(op: BinaryOp) -> Expr:
    a, b = _p("a", I32), _p("b", I32)
    return Bin(op, a.bitcast(U32), b.bitcast(U32)).bitcast(I32)


def _f32_to_bf16() -> Expr:
    u = _p("x", F32).bitcast(U32)
    high = u >> u32(16)
    quiet = high | u32(0x40)
    nearest_even = (u + u32(0x7FFF) + (high & u32(1))) >> u32(16)
    return Sel(ge(u & u32(0x7FFFFFFF), u32(0x7F800001)), quiet, nearest_even)


def _erf() -> Expr:
    """|x| < 0.5: Taylor series; else Abramowitz-Stegun 7.1.26 (absolute error < 1.5e-7);
    a NaN is returned as it came."""
    x = _p("x", F32)
    zero = f32(0.0)
    a = Sel(ge(x, zero), x, -x)
    z = x * x
    s = 1.0 + z * (-1.0 / 3.0 + z * (0.1 + z * (-1.0 / 42.0 + z * (1.0 / 216.0
                                                                     + z * (-1.0 / 1320.0)))))
    taylor = f32(1.1283791670955126) * x * s
    t = f32(1.0) / (1.0 + f32(0.3275911) * a)
    p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
                                                                        + t * 1.061405429))))
    r = 1.0 - p * Un(UnaryOp.Exp, -(a * a))
    tail = Sel(ge(x, zero), f32(1.0), f32(-1.0)) * r          # exact: r's sign only
    return Sel(_is_nan(x), x, Sel(ge(a, f32(0.5)), tail, taylor))


_X = (("x", F32),)
_AB_F32 = (("a", F32), ("b", F32))
_AB_I32 = (("a", I32), ("b", I32))
_AB_U32 = (("a", U32), ("b", U32))
_WGSL_INT_MIN = "(-2147483647i - 1i)"


def _builtin(c: str, other: str) -> dict[str, str]:
    """A math builtin: C's float function, GLSL's and WGSL's generic one."""
    return {"c": f"{c}({{x}})", "glsl": f"{other}({{x}})", "wgsl": f"{other}({{x}})"}


_HELPERS = [
    Helper("poot_isnan", "x is a NaN", _X, None,
           text={"c": "return x != x;",
                 "glsl": "return (floatBitsToUint(x) & 0x7fffffffu) > 0x7f800000u;",
                 "wgsl": "return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;"}),
    Helper("poot_fmax", "the larger of a and b; a NaN operand is the result (a's first)",
           _AB_F32, F32, needs=("poot_isnan",),
           text={"c": "return (a > b || poot_isnan(a)) ? a : b;",
                 # WGSL may assume finite math: no float arithmetic or compare reaches a NaN
                 "wgsl": "return select(max(a, b), select(b, a, poot_isnan(a)), "
                         "poot_isnan(a) || poot_isnan(b));"}),
    Helper("poot_fmin", "the smaller of a and b; a NaN operand is the result (a's first)",
           _AB_F32, F32, needs=("poot_isnan",),
           text={"c": "return (a < b || poot_isnan(a)) ? a : b;",
                 "wgsl": "return select(min(a, b), select(b, a, poot_isnan(a)), "
                         "poot_isnan(a) || poot_isnan(b));"}),
    Helper("poot_imax", "the larger of two I32", _AB_I32, I32,
           text={"c": "return a > b ? a : b;"}, inline={"wgsl": "max({a}, {b})"}),
    Helper("poot_imin", "the smaller of two I32", _AB_I32, I32,
           text={"c": "return a < b ? a : b;"}, inline={"wgsl": "min({a}, {b})"}),
    Helper("poot_umax", "the larger of two U32", _AB_U32, U32,
           inline={"c": "({a} > {b} ? {a} : {b})", "wgsl": "max({a}, {b})"}),
    Helper("poot_umin", "the smaller of two U32", _AB_U32, U32,
           inline={"c": "({a} < {b} ? {a} : {b})", "wgsl": "min({a}, {b})"}),
    # C's signed overflow is undefined: these go through U32; GLSL's and WGSL's wrap
    *(Helper(f"poot_i{op.name.lower()}", f"a {op.name} b on I32, wrapping on overflow",
             _AB_I32, I32, body=_wrapping(op),
             inline=dict.fromkeys(("glsl", "wgsl"), f"({{a}} {sym} {{b}})"))
      for op, sym in ((BinaryOp.Add, "+"), (BinaryOp.Sub, "-"), (BinaryOp.Mul, "*"))),
    Helper("poot_ineg", "-x on I32 (the minimum stays the minimum)", (("x", I32),), I32,
           body=(u32(0) - _p("x", I32).bitcast(U32)).bitcast(I32),
           inline=dict.fromkeys(("glsl", "wgsl"), "(-{x})")),
    Helper("poot_idiv", "a / b on I32 toward zero; x / 0 = 0; INT_MIN / -1 = INT_MIN",
           _AB_I32, I32,
           text={"c": "return b == 0 ? 0 : (a == (-2147483647 - 1) && b == -1) ? a : a / b;",
                 "wgsl": f"let safe = select(b, 1i, b == 0i || (a == {_WGSL_INT_MIN} && "
                         f"b == -1i));\nreturn select(a / safe, 0i, b == 0i);"}),
    Helper("poot_udiv", "a / b on U32; x / 0 = 0", _AB_U32, U32,
           text={"c": "return b == 0u ? 0u : a / b;",
                 "wgsl": "return select(a / select(b, 1u, b == 0u), 0u, b == 0u);"}),
    Helper("poot_ishl", "a << b on I32, b an unsigned word: 0 from 32 on", _AB_I32, I32,
           text={"c": "return {u32}(b) >= 32u ? 0 : {i32}({u32}(a) << {u32}(b));",
                 "wgsl": "let n = bitcast<u32>(b);\nreturn select(a << (n & 31u), 0i, "
                         "n >= 32u);"}),
    Helper("poot_ishr", "a >> b on I32, arithmetic; from 32 on the sign fills the word",
           _AB_I32, I32,
           text={"c": "return {u32}(b) >= 32u ? (a < 0 ? -1 : 0) : (a >> {u32}(b));",
                 "wgsl": "return a >> min(bitcast<u32>(b), 31u);"}),
    Helper("poot_ushl", "a << b on U32: 0 from 32 on", _AB_U32, U32,
           text={"c": "return b >= 32u ? 0u : a << b;",
                 "wgsl": "return select(a << (b & 31u), 0u, b >= 32u);"}),
    Helper("poot_ushr", "a >> b on U32: 0 from 32 on", _AB_U32, U32,
           text={"c": "return b >= 32u ? 0u : a >> b;",
                 "wgsl": "return select(a >> (b & 31u), 0u, b >= 32u);"}),
    Helper("poot_geu", "a >= b with both read as unsigned 32-bit words", _AB_I32, None,
           inline={"c": "((unsigned int)({a}) >= (unsigned int)({b}))",
                   "glsl": "(uint({a}) >= uint({b}))",
                   "wgsl": "(bitcast<u32>({a}) >= bitcast<u32>({b}))"}),
    Helper("poot_f2i", "F32 to an integer range [lo, hi] (I32's hi is 2^31): toward zero, "
           "saturated, NaN to 0", (("x", F32), ("lo", F32), ("hi", F32)), I32,
           needs=("poot_isnan",),
           # I32's hi, 2^31, is no I32: there the top is 2^31 - 1
           text={"c": "return poot_isnan(x) ? 0 : x <= lo ? {i32}(lo) : x >= hi ? "
                      "(hi >= 2147483648.0f ? 2147483647 : {i32}(hi)) : {i32}(x);",
                 "wgsl": "if (poot_isnan(x)) { return 0i; }\n"
                         "if (x <= lo) { return i32(lo); }\n"
                         "if (x >= hi) { return select(i32(hi), 2147483647i, "
                         "hi >= 2147483648.0f); }\nreturn i32(x);"}),
    Helper("poot_f2u", "F32 to U32: toward zero, saturated, NaN to 0", _X, U32,
           needs=("poot_isnan",),
           text={"c": "return poot_isnan(x) || x <= 0.0f ? 0u : x >= 4294967296.0f ? "
                      "4294967295u : {u32}(x);",
                 "wgsl": "if (poot_isnan(x) || x <= 0.0f) { return 0u; }\n"
                         "if (x >= 4294967296.0f) { return 4294967295u; }\nreturn u32(x);"}),
    Helper("poot_f32_to_bf16", "the BF16 bits (low half) of x rounded to nearest even; a "
           "NaN stays a quiet NaN", _X, U32, body=_f32_to_bf16(), bits16=True),
    Helper("poot_bf16_to_f32", "the F32 value of BF16 bits h (exact)", (("h", U32),), F32,
           body=(_p("h", U32) << u32(16)).bitcast(F32), bits16=True),
    Helper("poot_exp", "e^x", _X, F32, inline=_builtin("expf", "exp")),
    Helper("poot_log", "the natural logarithm", _X, F32, inline=_builtin("logf", "log")),
    Helper("poot_sqrt", "the square root", _X, F32, inline=_builtin("sqrtf", "sqrt")),
    Helper("poot_tanh", "the hyperbolic tangent", _X, F32, needs=("poot_isnan",),
           inline={"c": "tanhf({x})", "wgsl": "tanh({x})"},
           # GLSL's tanh may be exp-based and overflow to NaN for large |x|
           text={"glsl": "return poot_isnan(x) ? x : abs(x) > 15.0f ? sign(x) : tanh(x);"}),
    Helper("poot_erf", "the error function", _X, F32, body=_erf(), inline={"c": "erff({x})"}),
]

HELPERS: dict[str, Helper] = {h.name: h for h in _HELPERS}

#: Unary sub-ops by operand class. Clz is each dialect's own (`clz`): its builtin.
UNARY: dict[UnaryOp, dict[str, str]] = {
    UnaryOp.Neg: {"f32": "(-{x})", "i32": "poot_ineg"},
    UnaryOp.Exp: {"f32": "poot_exp"},
    UnaryOp.Log: {"f32": "poot_log"},
    UnaryOp.Sqrt: {"f32": "poot_sqrt"},
    UnaryOp.Recip: {"f32": "(1.0f / {x})"},
    UnaryOp.Tanh: {"f32": "poot_tanh"},
    UnaryOp.Erf: {"f32": "poot_erf"},
    UnaryOp.Not: dict.fromkeys(("i32", "u32"), "(~{x})"),
}

#: Binary sub-ops by operand class; a missing class is refused
BINARY: dict[BinaryOp, dict[str, str]] = {
    BinaryOp.Add: {"f32": "({a} + {b})", "i32": "poot_iadd", "u32": "({a} + {b})"},
    BinaryOp.Sub: {"f32": "({a} - {b})", "i32": "poot_isub", "u32": "({a} - {b})"},
    BinaryOp.Mul: {"f32": "({a} * {b})", "i32": "poot_imul", "u32": "({a} * {b})"},
    BinaryOp.Div: {"f32": "({a} / {b})", "i32": "poot_idiv", "u32": "poot_udiv"},
    BinaryOp.Max: {"f32": "poot_fmax", "i32": "poot_imax", "u32": "poot_umax"},
    BinaryOp.Min: {"f32": "poot_fmin", "i32": "poot_imin", "u32": "poot_umin"},
    BinaryOp.Ge: dict.fromkeys(("f32", "i32", "u32"), "({a} >= {b})"),
    BinaryOp.GeU: dict.fromkeys(("i32", "u32"), "poot_geu"),
    BinaryOp.And: dict.fromkeys(("i32", "u32"), "({a} & {b})"),
    BinaryOp.Or: dict.fromkeys(("i32", "u32"), "({a} | {b})"),
    BinaryOp.Xor: dict.fromkeys(("i32", "u32"), "({a} ^ {b})"),
    BinaryOp.Shl: {"i32": "poot_ishl", "u32": "poot_ushl"},
    BinaryOp.Shr: {"i32": "poot_ishr", "u32": "poot_ushr"},
}

#: the F32 bounds a float-to-integer cast saturates at (exact in F32)
INT_RANGES = {I32: (-2147483648.0, 2147483648.0), DType.I16: (-32768.0, 32767.0),
              DType.U16: (0.0, 65535.0), DType.I8: (-128.0, 127.0), DType.U8: (0.0, 255.0)}


def word_class(dtype: DType) -> str:
    """The class a dtype computes in: "f32" (floats), "i32" (I32 and the 8/16-bit
    integers, wrapped back after), "u32"."""
    return "f32" if dtype.is_float else "u32" if dtype is U32 else "i32"


def helper_of(e: Expr) -> str | None:
    """The helper the tables print node `e` with, or None (an operator, or not a node the
    tables spell)."""
    if isinstance(e, Un) and e.op in UNARY:
        rule = UNARY[e.op].get(word_class(e.x.dtype))
    elif isinstance(e, Bin):
        rule = BINARY[e.op].get(word_class(e.a.dtype))
    else:
        return None
    return rule if rule in HELPERS else None


def apply(rule: str, languages: Iterable[str], **operands: str) -> str:
    """A table entry on operand texts: an operator template, or a helper's call."""
    helper = HELPERS.get(rule)
    if helper is None:
        return rule.format(**operands)
    return helper.call(tuple(languages), *operands.values())


def shared_lets(e: Expr) -> tuple[list[tuple[str, Expr]], Expr]:
    """(lets, result): `e` with every subtree it uses more than once (not a constant or a
    variable) bound once to a name t1, t2, ... (each let's expression may name earlier
    ones), so that a dialect printing a helper's body as text prints each node once."""
    uses: Counter[int] = Counter()

    def count(n: Expr) -> None:
        uses[id(n)] += 1
        if uses[id(n)] == 1:
            for c in children(n):
                count(c)

    count(e)
    lets: list[tuple[str, Expr]] = []
    memo: dict[int, Expr] = {}

    def bind(n: Expr) -> Expr:
        if id(n) not in memo:
            kids = iter([bind(c) for c in children(n)])
            out = dataclasses.replace(n, **{f.name: next(kids) for f in dataclasses.fields(n)
                                            if isinstance(getattr(n, f.name), Expr)})
            if uses[id(n)] > 1 and not isinstance(n, (Const, Var)):
                lets.append((f"t{len(lets) + 1}", out))
                out = Var(lets[-1][0], n.dtype)
            memo[id(n)] = out
        return memo[id(n)]

    return lets, bind(e)


def in_order(names: Iterable[str], languages: Iterable[str]) -> list[Helper]:
    """The helpers `names` with every helper they call, each after those it calls."""
    languages, out, seen = tuple(languages), [], set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        helper = HELPERS[name]
        for dep in helper.calls(languages):
            visit(dep)
        out.append(helper)

    for n in names:
        visit(n)
    return out


__all__ = ["BINARY", "HELPERS", "INT_RANGES", "UNARY", "Helper", "apply", "helper_of",
           "in_order", "shared_lets", "word_class"]
