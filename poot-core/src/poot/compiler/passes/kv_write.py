"""kv_write (after rope_update): a dense KV write of a step's rows token by token, a
DynamicUpdateSlice of their Transpose into the cache's order ([T, Hkv, D] -> the
[Hkv, T, D] block of a cache [Hkv, S, D]), at most a float Cast after it, becomes one
TransposedUpdateSlice: the write reads the rows where they are, no Transpose kernel
between (a step of one token has none: its Transpose moves only unit axes).
"""
from __future__ import annotations

from poot.compiler.passes.relabel import moves_only_unit_axes
from poot.compiler.rewrite import rewrite_each
from poot.compiler.view import GraphView, NoMatch
from poot.ir.ops import Cast, DynamicUpdateSlice, Transpose, TransposedUpdateSlice


def run(graph, ctx):
    return rewrite_each(graph, ctx, "TransposedUpdateSlice", DynamicUpdateSlice, _rows,
                        lambda op, chain: "Transpose + DynamicUpdateSlice")


def token_transpose(view: GraphView, e, update, later: list) -> bool:
    """Whether `e` is the Transpose of a step's rows token by token into the cache's
    order (its first axis moved to the update's axis: [T, Hkv, D] -> [Hkv, T, D]), with at
    most Casts after it (`later`); False for any other eqn."""
    if not isinstance(e.op, Transpose) or \
            moves_only_unit_axes(e.op.perm, view.type_of(view.value(e, 0)).shape):
        return False
    rank = len(e.op.perm)
    a = update.op.norm_axis(update.op.axis, rank)
    if e.op.perm != tuple(range(1, a + 1)) + (0,) + tuple(range(a + 1, rank)):
        raise NoMatch(f"the Transpose at {e.out!r} reorders the rows other than token by "
                      f"token into the cache")
    if not all(isinstance(link.op, Cast) for link in later):
        raise NoMatch(f"the rows are reshaped after the Transpose at {e.out!r}")
    return True


def _rows(view: GraphView, update):
    """(TransposedUpdateSlice, its operands, the eqns it removes) for a DynamicUpdateSlice
    of [Transpose token by token, a float Cast or none] whose links feed nothing else."""
    e = view.defined_by(update.inputs[1], (Transpose, Cast), "the written block")
    links = []
    if isinstance(e.op, Cast):
        if not (e.op.to.is_float and view.type_of(view.value(e, 0)).dtype.is_float):
            raise NoMatch(f"the Cast at {e.out!r} is not between floats")
        links.append(e)
        e = view.defined_by(e.inputs[0], Transpose, "the rounded block")
    if not token_transpose(view, e, update, links):
        raise NoMatch(f"the Transpose at {e.out!r} moves only unit axes")
    links.insert(0, e)
    for link, user in zip(links, links[1:] + [update], strict=True):
        if view.single_user(link.out) is not user:
            raise NoMatch(f"{link.op.name} at {link.out!r} is read elsewhere too")
    args = [update.inputs[0], e.inputs[0], update.inputs[2]]
    return TransposedUpdateSlice(update.op.axis), args, links
