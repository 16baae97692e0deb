"""WGSL's gaps, closed by rewriting the kernel program before it is printed.

Each pattern is written in the program's own vocabulary, so the printer never sees
the construct it stands for:

* F16 arithmetic computes in F32 and rounds back once per op (the oracle's rule for
  floats narrower than F32): `op(a, b)` on F16 becomes `f16(op(f32(a), f32(b)))`, and
  an F16 comparison compares the widened values. Negation stays in F16 (it is exact).
* 8/16-bit integer arithmetic computes in the 32-bit word its register is (I32 for the
  signed ones, U32 for the unsigned) and is cast back, which wraps it, once per op; a
  comparison compares the words. What is left for the printer is the 32-bit classes of
  the shared Unary/Binary tables (poot.codegen.scalar).
* Subtrees that depend on no variable and no load fold to constants with the oracle's
  rules: naga evaluates constant expressions itself and refuses those that overflow
  (1.0f / 0.0f, -INT_MIN) where code that runs would not.

Shared subtrees stay shared (the rewrite maps each node once), so the printer's
names for them (`let t1 = ...`) still cover every use.
"""
from __future__ import annotations

from dataclasses import replace

from poot.codegen.expr import Bin, Cast, Const, Dot4, Expr, Load, Un, Var, children, evaluate
from poot.codegen.program import (
    Assign,
    CoopReduce,
    For,
    If,
    Kernel,
    Let,
    Stmt,
    Store,
)
from poot.dtypes import DType
from poot.ir.ops.elementwise import UnaryOp

F16, F32 = DType.F16, DType.F32
#: the register word each 8/16-bit integer computes in
WORDS = {DType.I8: DType.I32, DType.I16: DType.I32, DType.U8: DType.U32, DType.U16: DType.U32}


def rewrite_kernel(kernel: Kernel) -> Kernel:
    return replace(kernel, body=_block(kernel.body))


def _block(body) -> tuple[Stmt, ...]:
    return tuple(_stmt(s) for s in body)


def _stmt(s: Stmt) -> Stmt:
    if isinstance(s, (Let, Assign, CoopReduce)):
        return replace(s, value=rewrite_expr(s.value))
    if isinstance(s, Store):
        return replace(s, index=rewrite_expr(s.index), value=rewrite_expr(s.value))
    if isinstance(s, For):
        return replace(s, start=rewrite_expr(s.start), stop=rewrite_expr(s.stop),
                       step=rewrite_expr(s.step), body=_block(s.body))
    if isinstance(s, If):
        return replace(s, cond=rewrite_expr(s.cond), then=_block(s.then),
                       orelse=_block(s.orelse))
    return s


def rewrite_expr(e: Expr) -> Expr:
    memo: dict[int, Expr] = {}
    live: set[int] = set()   # nodes whose value depends on a Var or a Load

    def go(n: Expr) -> Expr:
        if id(n) in memo:
            return memo[id(n)]
        kids = [go(c) for c in children(n)]
        if isinstance(n, (Var, Load)) or any(id(c) in live for c in children(n)):
            live.add(id(n))
        out = _rebuild(n, kids)
        if id(n) not in live and not isinstance(n, Const):
            out = Const(evaluate(n, {}, {}).item(), n.dtype)
        else:
            out = _widen(out)
        memo[id(n)] = out
        return out

    return go(e)


def _rebuild(n: Expr, kids: list[Expr]) -> Expr:
    if not kids or all(k is c for k, c in zip(kids, children(n), strict=True)):
        return n
    fields = {Un: ("x",), Cast: ("x",), Bin: ("a", "b"), Load: ("index",),
              Dot4: ("a", "b", "c")}
    names = fields.get(type(n)) or (("cond", "t", "f") if len(kids) == 3 else ("x",))
    return replace(n, **dict(zip(names, kids, strict=True)))


def _widen(n: Expr) -> Expr:
    if isinstance(n, Un) and n.x.dtype is F16 and n.op not in (UnaryOp.Neg,):
        return Cast(F16, Un(n.op, Cast(F32, n.x)))
    if isinstance(n, Bin) and (n.a.dtype is F16 or n.a.dtype in WORDS):
        d = n.a.dtype
        word = F32 if d is F16 else WORDS[d]
        wide = Bin(n.op, Cast(word, n.a), Cast(word, n.b))
        return wide if n.op.compare else Cast(d, wide)
    return n
