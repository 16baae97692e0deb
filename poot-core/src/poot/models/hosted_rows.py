"""Hosted embedding rows: the host supplies the embedding of chosen prompt positions
(soft prompts, features from a vision or audio encoder) in place of their tokens' rows.

A step built with `hosted_rows=True` (poot.models.llama.build_decoder) takes two more
slots, whose roles this module owns and declares through the `poot_slot_roles` hook:

| slot (and role) | dtype | shape | range |
|---|---|---|---|
| hosted.rows | F32 | [N, dim] | any value: the rows, one per token of the step |
| hosted.use | I32 | [N] | 0 or 1: 1 takes the hosted row, 0 the token's embedding |

A hosted row replaces the embedding as the first layer reads it (after a family's
embedding scale, as Gemma 3 takes its image features), and the token id at that position is
ignored (any id in the vocabulary; 0 will do).

A dense step built with `spans=True` also takes

| slot (and role) | dtype | shape | range |
|---|---|---|---|
| hosted.span | I32 | [T] | 0 to T: tokens of one nonzero span see each other both ways |

so the tokens of one image attend to each other bidirectionally, besides causally (Gemma 3
attends so within an image's soft tokens); a span lies within one step. The mask stays
in-graph: built from Pos, Iota and the span ids.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from poot import ops
from poot.dtypes import DType
from poot.ir.types import SlotKind
from poot.plugin import hookimpl, manager

OWNER = "poot.models.hosted_rows"
ROWS, USE, SPAN = "hosted.rows", "hosted.use", "hosted.span"


def roles() -> list[SlotKind]:
    return [SlotKind(ROWS, DType.F32, None, None, owner=OWNER),
            SlotKind(USE, DType.I32, 0, 2, owner=OWNER),
            SlotKind(SPAN, DType.I32, 0, None, owner=OWNER)]


@hookimpl
def poot_slot_roles():
    return roles()


def embed_rows(x):
    """`x` F32 [N, dim] (the token embeddings) with the hosted rows where `hosted.use`
    is 1, in the traced graph."""
    manager()  # loads the plugins, this one included, which declares the roles
    n, dim = x.shape
    rows = ops.slot(SlotKind.get(ROWS), (n, dim), ROWS)
    use = ops.slot(SlotKind.get(USE), (n,), USE)
    return ops.select(ops.reshape(use, (n, 1)), rows, x)


def span_slot(t: int):
    """The span id of each of a dense step's T tokens (0: none), in the traced graph."""
    manager()
    return ops.slot(SlotKind.get(SPAN), (t,), SPAN, bound=t + 1)


def _same_span(q, k):
    """q [T, 1], k [1, S] span ids -> additive mask [T, S]: 0 where both are one nonzero
    span, -inf elsewhere."""
    same = ops.mul(ops.mul(ops.ge(q, k), ops.ge(k, q)), ops.ge(q, 1))
    return ops.select(same, 0.0, float("-inf"), dtype=DType.F32)


def span_mask(span, pos, cap: int):
    """Additive mask [T, cap] over a dense cache's positions: a step's token at pos + i sees
    the step's tokens of its own span (the key at cache position j has span id
    span[j - pos] where 0 <= j - pos < T, else none)."""
    t = span.shape[0]
    rel = ops.sub(ops.iota((cap,), 0), pos)
    inside = ops.mul(ops.ge(rel, 0), ops.ge(t - 1, rel))
    keys = ops.mul(ops.gather(span, ops.minimum(ops.maximum(rel, 0), t - 1), 0), inside)
    return _same_span(ops.reshape(span, (t, 1)), ops.reshape(keys, (1, cap)))


def span_mask_ring(span, ring: int):
    """Additive mask [T, ring + T] of a ring step (the ring's keys, then the step's own):
    a token sees the step's tokens of its own span, no ring key."""
    t = span.shape[0]
    own = _same_span(ops.reshape(span, (t, 1)), ops.reshape(span, (1, t)))
    none = ops.broadcast_to(ops.reshape(ops.select(ops.ge(ops.iota((1,), 0), 1), 0.0,
                                                   float("-inf"), dtype=DType.F32),
                                        (1, 1)), (t, ring))
    return ops.concat([none, own], 1)


def span_values(spans, tokens: int) -> dict:
    """The span slot of a step of `tokens` tokens: position (0-based within the step) ->
    span id (1, 2, ...); the rest 0."""
    ids = np.zeros(tokens, np.int32)
    for pos, span in spans.items():
        if not 0 <= pos < tokens or not 0 < span <= tokens:
            from poot.errors import BindError

            raise BindError(f"span {span} at position {pos} does not fit a step of {tokens} "
                            f"tokens")
        ids[pos] = span
    return {SPAN: ids}


def slot_values(hosted: Mapping[int, np.ndarray], tokens: int, dim: int) -> dict:
    """The two slots of a step of `tokens` tokens: position -> row [dim] for the hosted
    positions (0-based within the step)."""
    rows = np.zeros((tokens, dim), np.float32)
    use = np.zeros(tokens, np.int32)
    for pos, row in hosted.items():
        if not 0 <= pos < tokens:
            from poot.errors import BindError

            raise BindError(f"hosted row at position {pos} lies outside the step's "
                            f"{tokens} tokens")
        row = np.asarray(row, np.float32)
        if row.shape != (dim,):
            from poot.errors import BindError

            raise BindError(f"hosted row at position {pos} has shape {row.shape}, the "
                            f"model's embedding rows ({dim},)")
        rows[pos], use[pos] = row, 1
    return {ROWS: rows, USE: use}
