"""rope_fusion: the rotate-half chain (what poot.ops.rope_partial records) becomes one
Rope{rot} with operands [x, cos, sin]:

    Concat([Sub(Mul(x1, cos), Mul(x2, sin)), Add(Mul(x1, sin), Mul(x2, cos)) (, x[rot:])])
    with x1 = Slice(x, 0..rot/2), x2 = Slice(x, rot/2..rot)

rope_scatter (`scatter_run`, after it): a ScatterUpdate of a Rope's rows (a KV write of
rotated keys) becomes one RopeScatter.

rope_update (`update_run`): a DynamicUpdateSlice of a Rope's rows (a dense KV write of
rotated keys) becomes one RopeUpdateSlice, so the write no longer waits for the rotation;
the rows of a step of several tokens, transposed head by head into the cache, too
(`RopeUpdateSlice.tokens_first`).
"""
from __future__ import annotations

from poot.compiler.match import match_definition
from poot.compiler.passes.kv_write import token_transpose
from poot.compiler.passes.relabel import moves_only_unit_axes
from poot.compiler.rewrite import Rewriter, rewrite_each
from poot.compiler.view import GraphView, NoMatch
from poot.errors import ShapeError
from poot.ir.graph import Value
from poot.ir.ops import (
    Binary,
    BinaryOp,
    Cast,
    Concat,
    DynamicUpdateSlice,
    Reshape,
    Rope,
    RopeScatter,
    RopeUpdateSlice,
    ScatterUpdate,
    Slice,
    Transpose,
)

#: the eqns a RopeUpdateSlice's block is read through, from the Rope to the write
BLOCK_LINKS = (Rope, Reshape, Transpose, Cast, Slice)


def guess(view: GraphView, root) -> tuple[Rope, list]:
    """Rope's parameter and operands read off the first half of the candidate chain."""
    if len(root.inputs) not in (2, 3):
        raise NoMatch("a rotate-half Concat has two or three parts")
    lo = view.defined_by(root.inputs[0], Binary, "the first part")
    if lo.op.op is not BinaryOp.Sub:
        raise NoMatch("the first part is not x1*cos - x2*sin")
    m1 = view.defined_by(lo.inputs[0], Binary, "x1*cos")
    m2 = view.defined_by(lo.inputs[1], Binary, "x2*sin")
    x1 = view.defined_by(m1.inputs[0], Slice, "x1")
    rot = 2 * (x1.op.end - x1.op.start)
    return Rope(rot), [view.value(x1, 0), view.value(m1, 1), view.value(m2, 1)]


def run(graph, ctx):
    return rewrite_each(graph, ctx, "Rope", Concat, _rope_chain,
                         lambda op, chain: f"{len(chain)} eqns -> Rope(rot={op.rot})")


def scatter_run(graph, ctx):
    """rope_scatter: a ScatterUpdate whose rows are a Rope's result (through a Reshape that
    flattens its leading axes), read by nothing else, becomes one RopeScatter{rot} with
    operands [base, x, cos, sin, slots]: the rotated keys go straight to the KV pool."""
    return rewrite_each(graph, ctx, "RopeScatter", ScatterUpdate, _rope_rows,
                         lambda op, chain: f"Rope(rot={op.rot}) + ScatterUpdate")


def _rope_chain(view: GraphView, root):
    op, args = guess(view, root)
    return op, args, match_definition(view, op, args, root)


def _rope_rows(view: GraphView, scatter):
    """RopeScatter over [Rope, Reshape?] that produce the scatter's rows and feed nothing
    else."""
    chain = []
    e = view.defined_by(scatter.inputs[1], (Rope, Reshape), "the scattered rows")
    if isinstance(e.op, Reshape):
        chain.append(e)
        e = view.defined_by(e.inputs[0], Rope, "the reshaped rows")
    chain.insert(0, e)
    for link, user in zip(chain, chain[1:] + [scatter], strict=True):
        if view.single_user(link.out) is not user:
            raise NoMatch(f"{link.op.name} at {link.out!r} is read elsewhere too")
    op = RopeScatter(e.op.rot)
    args = [scatter.inputs[0], *e.inputs, scatter.inputs[2]]
    try:
        op.infer([view.type_of(x.id) if isinstance(x, Value) else x.type for x in args])
    except ShapeError as why:
        raise NoMatch(str(why)) from None
    return op, args, chain


def update_run(graph, ctx):
    """rope_update: a DynamicUpdateSlice whose block is a Rope's result (through Reshapes),
    read by nothing else, becomes one RopeUpdateSlice{rot, axis} with operands [base, x, cos,
    sin, index]. Where the block is a Slice of a Rope that others read too (a step's q and k
    heads rotated as one result), the Slice cuts the Rope's operand instead: on an axis cos
    and sin do not vary along, slicing commutes with Rope, so the rotated k rows go straight
    to the cache, in the same batch as the rotation of q; the Rope then rotates only the
    rows still read from it (`_narrow`), so none is rotated twice."""
    view, rw = GraphView(graph), Rewriter(graph)
    cut_ropes, moved = {}, set()
    for e in view.eqns:
        if not isinstance(e.op, DynamicUpdateSlice):
            continue
        try:
            op, args, chain, cut = _rope_block(view, e)
        except NoMatch as why:
            ctx.record.kept("RopeUpdateSlice", e.out, str(why))
            continue
        refused = ctx.refusal(op, args, e, view)
        if refused:
            ctx.record.kept("RopeUpdateSlice", e.out, f"target refuses: {refused}")
            continue
        if cut is not None:
            rope = view.producer(view.value(cut, 0))
            rw.replace(cut, cut.op, [rope.inputs[0]])
            cut_ropes[rope.out], moved = rope, moved | {cut.out}
        rw.replace(e, op, args, chain)
        ctx.record.rewrote("RopeUpdateSlice", e.out, f"Rope(rot={op.rot}) + DynamicUpdateSlice"
                           + (" (its rows cut before the rotation)" if cut else ""))
    for rope in cut_ropes.values():
        _narrow(view, rw, ctx, rope, moved)
    return rw.commit()


def _narrow(view: GraphView, rw: Rewriter, ctx, rope, moved: set) -> None:
    """Where the one reader a Rope has left (its `moved` Slices now cut its operand) is a
    Slice that commutes with it, that Slice becomes Rope(Slice(x)): only the rows read are
    rotated."""
    rest = [u for u in view.users.get(rope.out, ()) if u.out not in moved]
    if view.is_output(rope.out) or len(rest) != 1 or not isinstance(rest[0].op, Slice):
        return
    try:
        _check_commutes(view, rest[0], rope)
    except NoMatch:
        return
    rows = rw.add(rest[0], rest[0].op, [rope.inputs[0]])
    rw.replace(rest[0], rope.op, [rows, *rope.inputs[1:]])
    rw.remove(rope)
    ctx.record.rewrote("Rope", rest[0].out, "rotates only the rows read after the rest moved "
                       "into RopeUpdateSlice")


def _rope_block(view: GraphView, update):
    """(RopeUpdateSlice, its operands, the eqns it removes, the Slice to move before the
    rotation or None) for a DynamicUpdateSlice of [Rope or Slice of Rope, Reshape* with at
    most one float Cast among them] whose links feed nothing else."""
    links, tokens_first = [], False
    e = view.defined_by(update.inputs[1], BLOCK_LINKS, "the written block")
    while True:
        if token_transpose(view, e, update, links):
            if tokens_first:
                raise NoMatch(f"the Transpose at {e.out!r} reorders the rows a second time")
            tokens_first = True
        elif not _relabels(view, e):
            break
        links.insert(0, e)
        e = view.defined_by(e.inputs[0], BLOCK_LINKS, "the reshaped block")
    if sum(isinstance(link.op, Cast) for link in links) > 1:
        raise NoMatch("the rows are rounded more than once on their way to the cache")
    cut = None
    if isinstance(e.op, Slice):
        cut = e
        e = view.defined_by(e.inputs[0], Rope, "the sliced block")
        _check_commutes(view, cut, e)
    links.insert(0, cut or e)
    for link, user in zip(links, links[1:] + [update], strict=True):
        if view.single_user(link.out) is not user:
            raise NoMatch(f"{link.op.name} at {link.out!r} is read elsewhere too")
    x = Value(cut.out) if cut else e.inputs[0]
    args = [update.inputs[0], x, *e.inputs[1:], update.inputs[2]]
    return (RopeUpdateSlice(e.op.rot, update.op.axis, tokens_first), args,
            links[1:] if cut else links, cut)


def _relabels(view: GraphView, e) -> bool:
    """A Reshape, a Transpose that moves only unit axes (the elements keep their order:
    relabel makes it a Reshape later) or a Cast between floats (elementwise: it commutes
    with both); any other Transpose or Cast is NoMatch."""
    if isinstance(e.op, Transpose):
        if not moves_only_unit_axes(e.op.perm, view.type_of(view.value(e, 0)).shape):
            raise NoMatch(f"the Transpose at {e.out!r} reorders the rows")
        return True
    if isinstance(e.op, Cast):
        if not (e.op.to.is_float and view.type_of(view.value(e, 0)).dtype.is_float):
            raise NoMatch(f"the Cast at {e.out!r} is not between floats")
        return True
    return isinstance(e.op, Reshape)


def _check_commutes(view: GraphView, cut, rope) -> None:
    """Slice(Rope(x, cos, sin)) is Rope(Slice(x), cos, sin) when the slice keeps every
    rotated feature and cos and sin are the same all along its axis."""
    r = view.type_of(cut.out).rank
    a = cut.op.axis % r
    if a == r - 1:
        raise NoMatch("the Slice cuts the rotated features")
    for t in (view.type_of(x.id) if isinstance(x, Value) else x.type for x in rope.inputs[1:]):
        k = a - (r - t.rank)
        if k >= 0 and t.shape[k] != 1:
            raise NoMatch(f"cos and sin vary along the sliced axis {a}")
