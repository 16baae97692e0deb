"""KV-cache writes and reads as primitives: dense (DynamicUpdateSlice at Pos) and
paged (ScatterUpdate through a WriteMap slot, Gather through a SlotMap slot); and the
cache's dtype: f32, f16 (cast on write, widened on read) or q8_0 (int8 codes and f32
scales per 32 values, as two States)."""
from __future__ import annotations

from collections.abc import Sequence

from poot.dtypes import DType
from poot.ir.ops.quantize import Q8_BLOCK, q8_quantize, q8_rows
from poot.ops.core import dynamic_update_slice, gather, scatter_update, state, transpose
from poot.tracer import Tensor, builder, cast, reshape


def kv_write_dense(cache: Tensor, new: Tensor, pos: Tensor) -> Tensor:
    """cache [Hkv, S, D] with new [Hkv, T, D] written at rows pos .. pos+T."""
    return dynamic_update_slice(cache, new, pos, axis=1)


def kv_write_paged(pool: Tensor, new: Tensor, write_map: Tensor) -> Tensor:
    """pool [P, Hkv, D]: row t of new [T, Hkv, D] goes to slot write_map[t] (-1: nowhere)."""
    return scatter_update(pool, new, write_map)


def kv_read_paged(pool: Tensor, slot_map: Tensor) -> Tensor:
    """The sequence's keys/values [Hkv, S, D] gathered from pool [P, Hkv, D] by slot_map [S]."""
    return transpose(gather(pool, slot_map, 0), (1, 0, 2))


# -- the cache's dtype (docs/ir.md section 15) ---------------------------------------------
#: how a cache holds its rows (llama.cpp's --cache-type-k names), the default first
KV_DTYPES = ("f32", "f16", "q8_0")


def kv_state(shape: Sequence[int], kv_dtype: str, name: str) -> tuple[Tensor, ...]:
    """The State binders of one cache of rows `shape` (last axis: head_dim): one f32 or f16
    State, or for q8_0 the codes (i8, `shape`) and the scales (f32, one per 32 values,
    `name` + ".scales")."""
    shape = tuple(shape)
    if kv_dtype == "q8_0":
        return (state(shape, DType.I8, name),
                state(shape[:-1] + (shape[-1] // Q8_BLOCK,), DType.F32, name + ".scales"))
    return (state(shape, _FLOAT[kv_dtype], name),)


def kv_encode(x: Tensor, kv_dtype: str) -> tuple[Tensor, ...]:
    """Rows x [..., D] f32 as the cache stores them (kv_state's parts): cast to f16, or
    quantized to int8 codes and f32 scales per 32 values (q8_quantize)."""
    if kv_dtype == "q8_0":
        q, d = q8_quantize(builder(), x.ref)
        return (reshape(Tensor(q), x.shape),
                reshape(Tensor(d), x.shape[:-1] + (x.shape[-1] // Q8_BLOCK,)))
    return (cast(x, _FLOAT[kv_dtype]),)


def kv_decode(parts: Sequence[Tensor], kv_dtype: str) -> Tensor:
    """The f32 rows [..., D] of stored parts (kv_encode's, or rows read from kv_state's)."""
    if kv_dtype == "q8_0":      # the chain Q8KVAttention's definition reads
        codes, scales = parts
        return Tensor(q8_rows(builder(), codes.ref, scales.ref))
    return cast(parts[0], DType.F32)


_FLOAT = {"f32": DType.F32, "f16": DType.F16}
