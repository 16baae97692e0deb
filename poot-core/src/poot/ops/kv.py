"""KV-cache writes and reads as primitives: dense (DynamicUpdateSlice at Pos) and
paged (ScatterUpdate through a WriteMap slot, Gather through a SlotMap slot)."""
from __future__ import annotations

from poot.ops.core import dynamic_update_slice, gather, scatter_update, transpose
from poot.tracer import Tensor


def kv_write_dense(cache: Tensor, new: Tensor, pos: Tensor) -> Tensor:
    """cache [Hkv, S, D] with new [Hkv, T, D] written at rows pos .. pos+T."""
    return dynamic_update_slice(cache, new, pos, axis=1)


def kv_write_paged(pool: Tensor, new: Tensor, write_map: Tensor) -> Tensor:
    """pool [P, Hkv, D]: row t of new [T, Hkv, D] goes to slot write_map[t] (-1: nowhere)."""
    return scatter_update(pool, new, write_map)


def kv_read_paged(pool: Tensor, slot_map: Tensor) -> Tensor:
    """The sequence's keys/values [Hkv, S, D] gathered from pool [P, Hkv, D] by slot_map [S]."""
    return transpose(gather(pool, slot_map, 0), (1, 0, 2))
