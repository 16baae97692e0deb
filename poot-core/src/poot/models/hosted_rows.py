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
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from poot import ops
from poot.dtypes import DType
from poot.ir.types import SlotKind
from poot.plugin import hookimpl, manager

OWNER = "poot.models.hosted_rows"
ROWS, USE = "hosted.rows", "hosted.use"


def roles() -> list[SlotKind]:
    return [SlotKind(ROWS, DType.F32, None, None, owner=OWNER),
            SlotKind(USE, DType.I32, 0, 2, owner=OWNER)]


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
