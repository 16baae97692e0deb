"""A checkpoint (from any `poot_open_checkpoint` plugin) as the builder's WeightSource.

Tensor names are GGUF's; HF folders are mapped to them here. Dense tensors stay
as memory-mapped arrays; packed ones keep their sources and PackedWeight.
"""
from __future__ import annotations

import re

import numpy as np

from poot.errors import CheckpointError
from poot.models.llama import DenseSpec, PackedSpec

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
