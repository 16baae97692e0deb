"""Values of a region's body graph as scalar expressions at given coordinates.

A fused region (Fused, FusedRow, a ContractionEpilogue's epilogue) becomes one
expression tree per element: `RegionEval.at(value, coords)` follows the body's
eqns back to its parameters, mapping coordinates through broadcasts, reshapes,
transposes, slices and concats, and emits one `Let` per distinct (value,
coordinates) so shared subexpressions are computed once. Coordinates are told
apart by structure, not identity: each visit builds its own index nodes (a
broadcast axis's 0, a reshape's div and mod), so a value used twice at the same
place would otherwise be emitted twice, and a chain of such values (the
sampler's hash rounds) would double at every link. Parameters and reductions
are supplied by the caller.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from poot.codegen import index as ix
from poot.codegen.builder import KernelBuilder
from poot.codegen.expr import Bin as BinE
from poot.codegen.expr import Const, Expr, Sel, Un
from poot.errors import UnsupportedOp
from poot.ir.graph import Eqn, Graph, Lit
from poot.ir.ops import (
    Binary,
    Broadcast,
    Cast,
    Concat,
    Iota,
    OpKind,
    Reshape,
    Select,
    Slice,
    Transpose,
    Unary,
)
from poot.ir.types import TensorType

Coords = Sequence[Expr]

POINTWISE = (Unary, Binary, Select, Cast)


def scalar_op(op: OpKind, args: Sequence[Expr]) -> Expr:
    """The scalar expression of one elementwise op applied to `args`."""
    if isinstance(op, Unary):
        return Un(op.op, args[0])
    if isinstance(op, Binary):
        return BinE(op.op, args[0], args[1])
    if isinstance(op, Select):
        return Sel(*args)
    if isinstance(op, Cast):
        return args[0].cast(op.to)
    raise UnsupportedOp(f"{op.name} is not an elementwise op", op=op.name)


def coords_key(e: Expr) -> tuple:
    """A hashable stand-in for an index expression, equal for equal structure (floats by
    repr, so 0.0 and -0.0 stay apart; a Var by its name, unique in its kernel)."""
    return (type(e).__name__, *(
        coords_key(v) if isinstance(v, Expr) else (repr(v) if isinstance(v, float) else v)
        for v in (getattr(e, f.name) for f in dataclasses.fields(e))))


def literal(x: Lit) -> Const:
    return Const(x.value, x.dtype)


class RegionEval:
    """Evaluate a body graph's values at coordinates, emitting Lets into `kb` (with no
    builder, one expression tree: a contraction's activation element).

    `params[i](coords)` gives parameter i at coordinates in its own shape;
    `reduce(eqn, coords)`, when given, gives a Reduce eqn's value.
    """

    def __init__(self, kb: KernelBuilder | None, body: Graph,
                 params: Sequence[Callable[[Coords], Expr]],
                 reduce: Callable[[Eqn, Coords], Expr] | None = None):
        self.kb, self.body, self.reduce = kb, body, reduce
        self.params = dict(zip(body.inputs(), params, strict=True))
        self.producers = {e.out: e for e in body.eqns()}
        self.scopes: list[dict] = [{}]

    def push(self):
        """Enter a block (a loop body): values computed inside are forgotten on pop."""
        self.scopes.append({})

    def pop(self):
        self.scopes.pop()

    def type_of(self, vid) -> TensorType:
        return self.body.type_of(vid)

    def result_at(self, coords: Coords) -> Expr:
        return self.at(self.body.result(), coords)

    def at(self, vid, coords: Coords) -> Expr:
        key = (vid, tuple(coords_key(c) for c in coords))
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        if vid in self.params:
            value = self.params[vid](coords)
        else:
            value = self._eqn_at(self.producers[vid], coords)
            if not isinstance(value, Const) and self.kb is not None:
                value = self.kb.let(f"v{vid.index}", value)
        self.scopes[-1][key] = value
        return value

    def operand(self, x, coords: Coords) -> Expr:
        """An operand of an eqn of shape len(coords), broadcast numpy-style."""
        if isinstance(x, Lit):
            return literal(x)
        return self.at(x.id, ix.broadcast_coords(coords, self.type_of(x.id).shape))

    def _eqn_at(self, e: Eqn, coords: Coords) -> Expr:
        op = e.op
        if isinstance(op, POINTWISE):
            return scalar_op(op, [self.operand(x, coords) for x in e.inputs])
        if isinstance(op, Iota):
            return coords[op.norm_axis(op.axis, len(op.shape))].cast(op.dtype)
        if isinstance(op, Broadcast):
            return self.operand(e.inputs[0], coords)
        (src, *_) = e.inputs
        if isinstance(src, Lit):
            return literal(src)
        shape = self.type_of(src.id).shape
        if isinstance(op, Reshape):
            flat = ix.ravel(coords, self.type_of(e.out).shape)
            return self.at(src.id, ix.unravel(flat, shape))
        if isinstance(op, Transpose):
            inner = [None] * len(shape)
            for i, p in enumerate(op.perm):
                inner[p] = coords[i]
            return self.at(src.id, inner)
        if isinstance(op, Slice):
            a = op.norm_axis(op.axis, len(shape))
            inner = list(coords)
            inner[a] = ix.add(coords[a], op.start)
            return self.at(src.id, inner)
        if isinstance(op, Concat):
            return self._concat_at(e, coords)
        if self.reduce is not None and op.name == "Reduce":
            return self.reduce(e, coords)
        raise UnsupportedOp(f"{op.name} cannot be fused into a pointwise region", op=op.name)

    def _concat_at(self, e: Eqn, coords: Coords) -> Expr:
        out_shape = self.type_of(e.out).shape
        a = e.op.norm_axis(e.op.axis, len(out_shape))
        picks, offset = [], 0
        for x in e.inputs:
            size = self.type_of(x.id).shape[a]
            inner = list(coords)
            # clamped so the branch not taken still reads inside its operand
            inner[a] = ix.clamp(ix.sub(coords[a], offset), 0, size - 1)
            picks.append((offset + size, self.at(x.id, inner)))
            offset += size
        value = picks[-1][1]
        for end, v in reversed(picks[:-1]):
            value = Sel(ix.lt(coords[a], ix.i32(end)), v, value)
        return value
