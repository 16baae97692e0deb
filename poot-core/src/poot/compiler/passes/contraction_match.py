"""Shared pieces of the contraction passes (contraction_dense, contraction_packed): reading
a weight operand back to its binder, absorbing linear()'s reshapes, and deciding which
matched eqns can go; and of the passes that move a producer into the contractions reading
it (norm_contraction, prologue): who reads it."""
from __future__ import annotations

import math
from dataclasses import dataclass

from poot.compiler.view import GraphView, NoMatch
from poot.ir.graph import Eqn, Graph, Value
from poot.ir.ops import Cast, ContractionEpilogue, PackedDequant, Reshape, Slice, Transpose
from poot.ir.types import StorageClass, ValueId

MOVES = (Transpose, Reshape, Cast)


@dataclass
class WeightPath:
    """A weight operand read back from the contraction: `source` is the binder it starts
    at, or the result of `dequant` where a PackedDequant decodes it; `steps` are the
    movement/cast eqns from there to the use, in graph order."""

    source: ValueId
    dequant: Eqn | None
    steps: list[Eqn]

    @property
    def casts(self) -> list[Eqn]:
        return [e for e in self.steps if isinstance(e.op, Cast)]

    @property
    def moves(self) -> list:
        return [e.op for e in self.steps if not isinstance(e.op, Cast)]


def weight_path(view: GraphView, v: ValueId) -> WeightPath:
    steps = []
    e = view.producer(v)
    while e is not None and isinstance(e.op, MOVES):
        steps.append(e)
        v = view.value(e, 0)
        e = view.producer(v)
    steps.reverse()
    if e is not None and isinstance(e.op, PackedDequant):
        return WeightPath(v, e, steps)
    if e is not None and not checkpoint_rows(view, v):
        raise NoMatch(f"the weight operand comes from {e.op.name} at {e.out!r}, not a binder")
    return WeightPath(v, None, steps)


def checkpoint_rows(view: GraphView, v: ValueId) -> bool:
    """Whether v is a checkpoint weight (Const) or a range of its leading rows (a Slice on
    axis 0, which the planner makes a view of the weight's bytes): one weight stacked by
    rows read as its parts."""
    e = view.producer(v)
    while e is not None and isinstance(e.op, Slice) and e.op.axis % view.type_of(
            view.value(e, 0)).rank == 0:
        v = view.value(e, 0)
        e = view.producer(v)
    return e is None and view.storage(v) is StorageClass.CONST


def batched_operand(view: GraphView, mm: Eqn) -> tuple[ValueId, Eqn, list[Eqn]]:
    """(activation, root, extra eqns): linear() on x [..., M, K] reshapes x to 2-D and the
    product back; a contraction takes x [..., M, K] directly, so both reshapes go."""
    a = view.value(mm, 0)
    inner, outer = view.producer(a), view.single_user(mm.out)
    if inner is None or outer is None or not isinstance(inner.op, Reshape) or \
            not isinstance(outer.op, Reshape):
        return a, mm, []
    x = view.value(inner, 0)
    xs, n = view.type_of(x).shape, view.type_of(mm.out).shape[-1]
    if len(xs) < 3 or view.type_of(a).rank != 2 or outer.op.shape != xs[:-1] + (n,):
        return a, mm, []
    return x, outer, [mm] + ([inner] if view.single_user(a) is mm else [])


def removable(view: GraphView, steps: list[Eqn], consumer: Eqn) -> list[Eqn]:
    """The eqns of `steps` (in graph order) that only the rewritten consumer reads."""
    gone = {consumer.out}
    out = []
    for e in reversed(steps):
        if not view.is_output(e.out) and all(u.out in gone for u in view.users.get(e.out, ())):
            gone.add(e.out)
            out.append(e)
    return out


@dataclass
class Contraction:
    """A matched contraction: `op(args)` replaces `root`; `steps` are the weight-side eqns
    the consumer read (removed where nothing else reads them); `extra` always go."""

    op: object
    args: list
    root: Eqn
    consumer: Eqn
    steps: list[Eqn]
    extra: list[Eqn]


def on_matmul(view: GraphView, mm: Eqn, op, weight_args: list, steps: list[Eqn]) -> Contraction:
    """A contraction of MatMul `mm`'s activation (with linear()'s reshapes absorbed)."""
    a, root, extra = batched_operand(view, mm)
    return Contraction(op, [a, *weight_args], root, mm, steps, extra)


def run_matchers(graph: Graph, ctx, matchers: dict) -> Graph:
    """Try `matchers[type(eqn.op)] = (candidate name, fn(view, eqn) -> Contraction | None)`
    on every eqn; rewrite the matches the target allows; record every verdict."""
    from poot.compiler.rewrite import Rewriter

    view, rw = GraphView(graph), Rewriter(graph)
    for e in view.eqns:
        entry = matchers.get(type(e.op))
        if entry is None:
            continue
        name, fn = entry
        try:
            m = fn(view, e)
        except NoMatch as why:
            ctx.record.kept(name, e.out, str(why))
            continue
        if m is None or rw.claimed([m.root.out, m.consumer.out]):
            continue
        refused = ctx.refusal(m.op, m.args, m.root, view)
        if refused:
            ctx.record.kept(m.op.name, m.root.out, f"target refuses: {refused}")
            continue
        gone = removable(view, m.steps, m.consumer) + m.extra
        rw.replace(m.root, m.op, m.args, gone)
        ctx.record.rewrote(m.op.name, m.root.out, f"{len(gone) + 1} eqns -> {m.op!r} on "
                           f"{weight_label(view, m.args)}")
    return rw.commit()


def weight_label(view: GraphView, args) -> str:
    """The checkpoint tensor a contraction reads, for the report."""
    for a in args:
        if view.storage(a) is StorageClass.CONST:
            return f"{view.graph.meta(a).identity.label or repr(a)} {view.type_of(a)}"
    return "a computed weight"


def activation_readers(view: GraphView, e: Eqn, heads: tuple, most: int, rows: int,
                       what: str) -> list[Eqn]:
    """The eqns reading e's result (at most `most`), each a contraction of `heads` taking
    it as its activation only (bare, or an epilogue's head), the result of at most `rows`
    rows and no graph output; NoMatch otherwise, saying why of `what` ("a norm")."""
    n = math.prod(view.type_of(e.out).shape[:-1])
    if n > rows:
        raise NoMatch(f"{n} rows: {what} more than {rows} rows read stays a kernel")
    if view.is_output(e.out):
        raise NoMatch(f"{what}'s result is a graph output")
    readers = list(dict.fromkeys(view.users.get(e.out, ())))
    if len(readers) > most:
        raise NoMatch(f"{len(readers)} readers: {what} read by more than {most} stays a kernel")
    for r in readers:
        head = r.op.head if isinstance(r.op, ContractionEpilogue) else r.op
        if not isinstance(head, heads):
            raise NoMatch(f"{r.op.name} at {r.out!r} reads {what}")
        if [x for x in r.inputs if isinstance(x, Value) and x.id == e.out] != [r.inputs[0]]:
            raise NoMatch(f"{r.op.name} at {r.out!r} reads {what} other than as its activation")
    return readers
