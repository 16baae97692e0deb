"""A checkpoint (from any `poot_open_checkpoint` plugin) as the builder's WeightSource.

Tensor names are GGUF's; HF folders are mapped to them here. Dense tensors stay
as memory-mapped arrays; packed ones keep their sources and PackedWeight.
`HalfLayoutRows` reorders the q/k rows of a pair-ordered source (GGUF llama/mistral)
into rotate-half order once, so the traced step needs no permutation of activations.
"""
from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from poot.errors import CheckpointError
from poot.formats import PackedWeight
from poot.ir.types import TensorType, WeightRef


@dataclass(frozen=True)
class DenseSpec:
    """A dense checkpoint tensor: its type and identity."""

    type: TensorType
    ref: WeightRef


@dataclass(frozen=True)
class PackedSpec:
    """A packed checkpoint tensor: its descriptor and the identity of each source."""

    weight: PackedWeight
    refs: tuple[WeightRef, ...]


class WeightSource(Protocol):
    """What the builder needs from a checkpoint: a spec per GGUF tensor name."""

    def has(self, name: str) -> bool: ...

    def spec(self, name: str) -> DenseSpec | PackedSpec: ...



_HF = [
    (r"model\.embed_tokens\.weight", "token_embd.weight"),
    (r"model\.norm\.weight", "output_norm.weight"),
    (r"lm_head\.weight", "output.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", "blk.{}.attn_norm.weight"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", "blk.{}.ffn_norm.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.(weight|bias)", "blk.{}.attn_q.{}"),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.(weight|bias)", "blk.{}.attn_k.{}"),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.(weight|bias)", "blk.{}.attn_v.{}"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", "blk.{}.attn_output.weight"),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight", "blk.{}.ffn_gate.weight"),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.weight", "blk.{}.ffn_up.weight"),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", "blk.{}.ffn_down.weight"),
]


def gguf_name(hf: str) -> str | None:
    """The GGUF name of an HF Llama-family tensor (packed ones keep a `.weight` suffix)."""
    base = re.sub(r"\.(qweight|weight_packed)$", ".weight", hf)
    for pat, out in _HF:
        m = re.fullmatch(pat, base)
        if m:
            return out.format(*m.groups())
    return None


class CheckpointWeights:
    """WeightSource over an opened checkpoint; `arrays` maps const labels to source arrays."""

    def __init__(self, checkpoint):
        self.checkpoint = checkpoint
        self.infos = {}
        for name, info in checkpoint.tensors.items():
            key = name if checkpoint.kind == "gguf" else gguf_name(name)
            if key is not None:
                self.infos[key] = info
        self.arrays: dict[str, np.ndarray] = {}

    def has(self, name: str) -> bool:
        return name in self.infos

    def spec(self, name: str):
        info = self.infos.get(name)
        if info is None:
            raise CheckpointError(f"{self.checkpoint.path}: no tensor {name!r} "
                                  f"(is this a Llama-family checkpoint?)")
        if info.packed is not None:
            roles = [s.role for s in info.packed.sources()]
            refs = []
            for role, src in zip(roles, info.sources, strict=True):
                ref = info.ref if len(roles) == 1 else type(info.ref)(
                    info.ref.checkpoint, f"{info.ref.tensor}:{role}", f"{info.ref.payload}:{role}",
                    info.ref.format)
                refs.append(ref)
                self.arrays[ref.tensor] = src
            return PackedSpec(info.packed, tuple(refs))
        from poot.dtypes import DType
        from poot.ir.types import TensorType

        array, dtype, ref = info.sources[0], info.dtype, info.ref
        if len(info.shape) == 1 and dtype in (DType.F16, DType.BF16):
            # norm weights and biases meet f32 activations elementwise (only projections and
            # embeddings widen in their ops): widen these small vectors exactly, here
            array, dtype = np.asarray(array, np.float32), DType.F32
            ref = type(ref)(ref.checkpoint, ref.tensor, f"{ref.payload}:f32", "f32")
        self.arrays[ref.tensor] = array
        return DenseSpec(TensorType(info.shape, dtype), ref)


# -- q/k rows from GGUF's adjacent pairs to rotate-half order ---------------------------
#: the tensors llama.cpp's converter permutes (q/k projections and their biases)
_ROPE_ROWS = re.compile(r"blk\.\d+\.attn_[qk]\.(weight|bias)")


def half_rows(n: int, head_dim: int) -> np.ndarray:
    """The row order taking n = heads * head_dim q/k rows from adjacent (even, odd) pairs
    to rotate-half order, per head: row 2i -> i, row 2i+1 -> head_dim/2 + i (the inverse
    of llama.cpp's converter permutation)."""
    return np.arange(n).reshape(n // head_dim, head_dim // 2, 2).transpose(0, 2, 1).reshape(n)


def _row_sources(name: str, weight: PackedWeight) -> list[bool]:
    """Per source of a packed weight: True where its rows are the weight's output rows (GGUF
    blocks lie within rows, so reordering rows reorders them), False where it does not depend
    on the rows at all (a per-tensor scale). The format tells which by its sources for twice
    the rows; a source that packs output rows otherwise (GPTQ/AWQ pack output columns into
    words) cannot be reordered by rows, and is refused."""
    n, k = weight.shape
    fmt, attrs = weight.get_format(), weight.attr_dict
    rows = []
    for a, b in zip(fmt.roles((n, k), attrs), fmt.roles((2 * n, k), attrs), strict=True):
        sa, sb = a.type.shape, b.type.shape
        if sa != sb and not (sa[:1] == (n,) and sb == (2 * n,) + sa[1:]):
            raise CheckpointError(
                f"{name}: {weight.format} source {a.role!r} does not hold one row per output "
                f"row, so its q/k rows cannot be reordered from GGUF's adjacent pairs to "
                f"rotate-half order")
        rows.append(sa != sb)
    return rows


class HalfLayoutRows:
    """The WeightSource `inner` (with q/k rows in adjacent pairs) with its q/k rows in
    rotate-half order: the builder's only layout.

    The reordered tensors are materialized once (the rest stays memory-mapped in `inner`)
    and get their own identity: label `<tensor>~half` and payload `<payload>~half<head_dim>`,
    so weight caches never mix them with the stored bytes. `arrays` holds them by label.
    """

    arrays: dict[str, np.ndarray]

    def __init__(self, inner: WeightSource, head_dim: int):
        self.inner, self.head_dim = inner, head_dim
        # each traced step (prefill, decode, paged) wraps its source anew: they share the
        # reordered specs and arrays of this source and head_dim, which die with the source
        self._specs, self.arrays = _MADE.setdefault(inner, {}).setdefault(head_dim, ({}, {}))

    def has(self, name: str) -> bool:
        return self.inner.has(name)

    def spec(self, name: str):
        if not _ROPE_ROWS.fullmatch(name):
            return self.inner.spec(name)
        if name not in self._specs:
            self._specs[name] = self._reorder(name, self.inner.spec(name))
        return self._specs[name]

    def _reorder(self, name: str, s: DenseSpec | PackedSpec) -> DenseSpec | PackedSpec:
        packed = isinstance(s, PackedSpec)
        n = s.weight.shape[0] if packed else s.type.shape[0]
        order = half_rows(n, self.head_dim)

        def moved(ref):
            new = replace(ref, tensor=f"{ref.tensor}~half",
                          payload=ref.payload and f"{ref.payload}~half{self.head_dim}")
            self.arrays[new.tensor] = np.asarray(self.inner.arrays[ref.tensor])[order]
            return new

        if not packed:
            return DenseSpec(s.type, moved(s.ref))
        rows = _row_sources(name, s.weight)
        return PackedSpec(s.weight, tuple(moved(r) if row else r
                                          for r, row in zip(s.refs, rows, strict=True)))


#: HalfLayoutRows' reordered (specs, arrays) by source and head_dim (never holding the source)
_MADE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
