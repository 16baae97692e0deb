"""fresh_kv: a decode step's Attention over its own dense KV writes becomes one
FreshKVAttention that reads the caches as they were and this step's rows where the
projection left them:

    Attention(Reshape*(Rope(q, cos, sin)), RopeUpdateSlice(k_cache, k, cos, sin, index),
              DynamicUpdateSlice(v_cache, v, index), mask)
    -> FreshKVAttention(Reshape(q), k_cache, v_cache, mask, Reshape(k), v, cos', sin', index)

with cos' and sin' the one row of tables (a single token's: every row rotates alike). The
writes stay, read by nothing but the step's outputs (the caches' next state), and move
after the attention, so the cache is read before it is written in place and the writes run
beside the attention's readers: a layer no longer waits for the rotation and the writes
before its attention. Only an Attention proper (not its paged, sink or token-major forms)
over caches written along their positions axis (-2), one index for both.
"""
from __future__ import annotations

from poot.compiler.passes.relabel import moves_only_unit_axes
from poot.compiler.rewrite import Rewriter
from poot.compiler.view import GraphView, NoMatch
from poot.ir.graph import Value
from poot.ir.types import TensorType
from poot.ir.ops import (
    Attention,
    DynamicUpdateSlice,
    FreshKVAttention,
    Reshape,
    Rope,
    RopeUpdateSlice,
    Transpose,
)

NAME = "FreshKVAttention"


def run(graph, ctx):
    view, rw = GraphView(graph), Rewriter(graph)
    moves = []
    for e in view.eqns:
        if type(e.op) is not Attention:
            continue
        try:
            parts = _match(view, e)
        except NoMatch as why:
            ctx.record.kept(NAME, e.out, str(why))
            continue
        op, args, types, writes, chain = parts
        refused = ctx.refusal(op, args, e, view, types=types)
        if refused:
            ctx.record.kept(NAME, e.out, f"target refuses: {refused}")
            continue
        ins = [rw.add(e, Reshape(t.shape), [a[1]]) if isinstance(a, tuple) else a
               for a, t in zip(args, types, strict=True)]
        rw.replace(e, op, ins, chain)
        moves.append((e.out, writes))
        ctx.record.rewrote(NAME, e.out, "Rope + RopeUpdateSlice + DynamicUpdateSlice + "
                                        "Attention (the writes after it)")
    return _writes_after(rw.commit(), moves)


def _match(view: GraphView, att):
    q_in, k_in, v_in, mask = att.inputs
    kw = view.defined_by(k_in, RopeUpdateSlice, "the keys")
    vw = view.defined_by(v_in, DynamicUpdateSlice, "the values")
    kc, kx, cos, sin, index = kw.inputs
    vc, vx, v_index = vw.inputs
    kt = view.type_of(view.value(kw, 0))
    r = kt.rank
    if kw.op.tokens_first or kw.op.axis % r != r - 2 or vw.op.axis % r != r - 2:
        raise NoMatch("the caches are not written along their positions axis (-2)")
    if not _same(index, v_index):
        raise NoMatch("the keys and values are written at different indices")
    for w in (kw, vw):
        if [u.out for u in view.users.get(w.out, ())] != [att.out]:
            raise NoMatch(f"the write at {w.out!r} is read by more than this attention")
    rope, chain = _query_rope(view, att)
    if not (_same(rope.inputs[1], cos) and _same(rope.inputs[2], sin)) \
            or rope.op.rot != kw.op.rot:
        raise NoMatch("q and the keys rotate by different tables")
    half = (kw.op.rot // 2,)
    tables = [view.type_of(view.value(kw, i)) for i in (2, 3)]
    if any(t.size != half[0] for t in tables):
        raise NoMatch("the tables hold more than one token's row (a step of several tokens)")
    block = kw.op.update_type(kt, view.type_of(view.value(kw, 1)))
    qt = view.type_of(view.value(att, 0))
    vt = view.type_of(view.value(vw, 1))
    op = FreshKVAttention(att.op.scale, kw.op.rot)
    types = [qt, kt, view.type_of(view.value(vw, 0)), _type(view, mask),
             TensorType(block.shape, view.type_of(view.value(kw, 1)).dtype), vt,
             TensorType(half, tables[0].dtype), TensorType(half, tables[1].dtype),
             _type(view, index)]
    args = [rope.inputs[0], kc, vc, mask, kx, vx, cos, sin, index]
    # ("reshape", x): x through a Reshape to its type here, added by the rewrite
    args = [a if _type(view, a).shape == t.shape else ("reshape", a)
            for a, t in zip(args, types, strict=True)]
    return op, args, types, (kw.out, vw.out), chain


def _query_rope(view: GraphView, att):
    """The Rope whose rows, through Reshapes and Transposes of unit axes each read once,
    are the attention's q; and those eqns."""
    chain = []
    e = view.defined_by(att.inputs[0], (Rope, Reshape, Transpose), "the query")
    while not isinstance(e.op, Rope):
        if isinstance(e.op, Transpose) and not moves_only_unit_axes(
                e.op.perm, view.type_of(view.value(e, 0)).shape):
            raise NoMatch(f"the Transpose at {e.out!r} reorders the query rows")
        chain.append(e)
        e = view.defined_by(e.inputs[0], (Rope, Reshape, Transpose), "the query")
    chain.append(e)
    for link, user in zip(chain, [att] + chain[:-1], strict=True):
        if view.single_user(link.out) is not user:
            raise NoMatch(f"{link.op.name} at {link.out!r} is read elsewhere too")
    last = view.type_of(view.value(e, 0)).shape[-1]
    if last != view.type_of(view.value(att, 0)).shape[-1]:
        raise NoMatch("the query's rows are not its rotated rows")
    return e, chain


def _same(a, b) -> bool:
    return isinstance(a, Value) and isinstance(b, Value) and a.id == b.id


def _type(view: GraphView, x):
    return x.type if not isinstance(x, Value) else view.type_of(x.id)


def _writes_after(graph, moves):
    """Each attention's two writes placed right after it (the cache's in-place update
    must follow its last reader)."""
    if not moves:
        return graph
    d = graph.edit()
    for att, writes in moves:
        held = [e for e in d.eqns if e.out in writes]
        d.eqns[:] = [e for e in d.eqns if e.out not in writes]
        at = next(i for i, e in enumerate(d.eqns) if e.out == att)
        d.eqns[at + 1:at + 1] = held
    return d.commit()
