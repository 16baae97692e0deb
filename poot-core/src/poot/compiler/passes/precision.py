"""The precision rewrite (docs/ir.md section 15): `fast` rounds the activations of weight
contractions with ordinary ops, so the oracle still defines what every backend computes.

    MatMul(x, ...W)  W bf16 / f16 [N, K]         -> MatMul(Cast(f32, Cast(w, x)), ...W)
    MatMul(x, ...PackedDequant(w))  integer codes -> MatMul(q8_round(x), ...PackedDequant(w))
    IndexedMatMul(x, ...W, idx)                   -> the same on x

`W` is read back as the contraction passes read it (poot.compiler.passes.contraction_match:
a checkpoint weight through movement and casts). `exact` changes nothing. One rounding of an
activation serves every contraction reading it.

`q8_run` then forms Q8PackedContraction(x, sources) from PackedContraction(q8_round(x),
sources) where the target declares it; the chain stays for any other reader.
"""
from __future__ import annotations

from poot.compiler.match import match_definition
from poot.compiler.passes.contraction_match import checkpoint_rows, weight_path
from poot.compiler.rewrite import Rewriter
from poot.compiler.view import GraphView, NoMatch
from poot.dtypes import DType
from poot.ir.builder import Ref
from poot.ir.graph import Eqn, Graph, Lit, Value
from poot.ir.ops import (
    Q8_BLOCK,
    Binary,
    Cast,
    IndexedMatMul,
    MatMul,
    PackedContraction,
    Q8PackedContraction,
    QuantizeI8,
    Reshape,
)
from poot.ir.ops.quantize import q8_round

F32, BF16, F16 = DType.F32, DType.BF16, DType.F16
WORDS = "dense:f16words"


def integer_codes(fmt: str) -> bool:
    """Whether a packed format decodes every value as scale * integer (+ offset)."""
    from poot.formats import get_format

    return bool(getattr(get_format(fmt), "integer_codes", False))


def rounding(view: GraphView, e: Eqn) -> str:
    """How `fast` rounds the activation of contraction `e`: "bf16" or "f16" (its 16-bit
    weight's dtype), or "q8" (a packed weight of integer codes); NoMatch says why not."""
    x = view.type_of(view.value(e, 0))
    if x.dtype is not F32:
        raise NoMatch(f"the activation is {x.dtype}, not f32")
    path = weight_path(view, view.value(e, 1))
    if path.dequant is not None:
        fmt = path.dequant.op.weight.format
        if fmt == WORDS:
            return "f16"
        if not integer_codes(fmt):
            raise NoMatch(f"{fmt} has no integer codes: its activations stay f32")
        if x.shape[-1] % Q8_BLOCK:
            raise NoMatch(f"K = {x.shape[-1]} is not a multiple of the q8 block {Q8_BLOCK}")
        return "q8"
    if not checkpoint_rows(view, path.source):
        raise NoMatch("the weight operand is not a checkpoint weight")
    w = view.type_of(path.source).dtype
    if w not in (BF16, F16):
        raise NoMatch(f"the weight is {w}: its activations stay f32")
    return str(w)


class _Emitter:
    """Emits eqns into a draft with the Builder interface the IR's chain helpers use."""

    def __init__(self, draft, out: list[Eqn]):
        self.draft, self.out = draft, out

    def lit(self, value, dtype) -> Lit:
        return Lit(value, dtype)

    def eqn(self, op, *xs) -> Ref:
        e = self.draft.new_eqn(op, [x if isinstance(x, Lit) else Value(x.id) for x in xs])
        self.out.append(e)
        return Ref(0, e.out, self.draft.type_of(e.out))


def round_activation(b, x: Ref, how: str) -> Ref:
    """x as the contraction reads it under `fast`."""
    if how == "q8":
        return q8_round(b, x)
    return b.eqn(Cast(F32), b.eqn(Cast(DType.parse(how)), x))


def run(graph: Graph, ctx) -> Graph:
    if ctx.policy.precision == "exact":
        return graph
    view = GraphView(graph)
    draft = graph.edit()
    eqns: list[Eqn] = []
    emit = _Emitter(draft, eqns)
    done: dict[tuple, Ref] = {}
    for e in draft.eqns:
        if isinstance(e.op, (MatMul, IndexedMatMul)):
            try:
                how = rounding(view, e)
            except NoMatch as why:
                ctx.record.kept("precision", e.out, str(why))
            else:
                x = view.value(e, 0)
                key = (x, how)
                if key not in done:
                    done[key] = round_activation(emit, Ref(0, x, view.type_of(x)), how)
                    ctx.record.rewrote("precision", e.out, f"activation {x!r} rounded to "
                                       f"{how}")
                e = Eqn(e.op, (Value(done[key].id), *e.inputs[1:]), e.out)
        eqns.append(e)
    if not done:
        return graph
    draft.eqns[:] = eqns
    return draft.commit()


def q8_source(view: GraphView, a: Value):
    """The x of a q8_round(x) chain ending at `a`, or NoMatch (the definition match then
    proves the whole chain, eqn for eqn)."""
    mul = view.defined_by(view.defined_by(a, Reshape, "the rounded activation").inputs[0],
                          Binary, "f32(q) * d")
    q = view.defined_by(mul.inputs[0], Cast, "f32(q)")
    quant = view.defined_by(q.inputs[0], QuantizeI8, "the codes")
    return view.value(view.defined_by(quant.inputs[0], Reshape, "the blocks of x"), 0)


def q8_run(graph: Graph, ctx) -> Graph:
    """PackedContraction(q8_round(x), sources) -> Q8PackedContraction(x, sources)."""
    if ctx.policy.precision == "exact":
        return graph
    view, rw = GraphView(graph), Rewriter(graph)
    for e in view.eqns:
        if not isinstance(e.op, PackedContraction):
            continue
        try:
            x = q8_source(view, e.inputs[0])
            op = Q8PackedContraction(e.op.weight)
            args = [x, *(view.value(e, i) for i in range(1, len(e.inputs)))]
            match_definition(view, op, args, e, exclusive=False)
        except NoMatch as why:
            ctx.record.kept("Q8PackedContraction", e.out, str(why))
            continue
        refused = ctx.refusal(op, args, e, view)
        if refused:
            ctx.record.kept("Q8PackedContraction", e.out, f"target refuses: {refused}")
            continue
        rw.replace(e, op, args)
        ctx.record.rewrote("Q8PackedContraction", e.out, f"q8 rows of {x!r} into "
                           f"{e.op.weight!r}")
    return rw.commit()
