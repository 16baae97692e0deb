"""Megatron's weight splits for the decoders of poot.models.llama (GGUF tensor names).

Column-parallel (output rows split): attn_q/k/v (and their biases) by heads, ffn_gate and
ffn_up by FFN units; row-parallel (input columns split): attn_output by query heads,
ffn_down by FFN units; vocabulary-parallel: token_embd and output rows. Norm weights, q/k
norms and rope tables stay whole on every rank. The ranges come from poot.parallel.layout.
"""
from __future__ import annotations

from poot.errors import ShardError
from poot.models.weights import STACK
from poot.parallel.layout import Layout, layout_of
from poot.parallel.shard import RankGraph, Split, shard

#: tensor suffix -> (axis, which range of the layout, elements per unit)
_SPLITS = {
    "attn_q.weight": (0, "q", "head"), "attn_q.bias": (0, "q", "head"),
    "attn_k.weight": (0, "kv", "head"), "attn_k.bias": (0, "kv", "head"),
    "attn_v.weight": (0, "kv", "head"), "attn_v.bias": (0, "kv", "head"),
    "attn_output.weight": (1, "q", "head"),
    "ffn_gate.weight": (0, "ffn", "unit"), "ffn_up.weight": (0, "ffn", "unit"),
    "ffn_down.weight": (1, "ffn", "unit"),
    "token_embd.weight": (0, "vocab", "unit"), "output.weight": (0, "vocab", "unit"),
}


def splits(layout: Layout):
    """`splits(rank, tensor)` for poot.parallel.shard: the rank's share of a tensor."""
    def split(rank: int, tensor: str) -> Split | None:
        if STACK in tensor:      # each part splits by its own heads: no one range fits them
            raise ShardError(f"{tensor} stacks several tensors by rows; shard a step traced "
                             f"with stack_qkv=False and stack_ffn=False", dim=tensor,
                             ranks=layout.ranks)
        tensor = tensor.split("~", 1)[0]     # a derived copy (q/k rows in half layout)
        suffix = tensor.split(".", 2)[-1] if tensor.startswith("blk.") else tensor
        got = _SPLITS.get(suffix)
        if got is None:
            return None
        axis, which, unit = got
        r = getattr(layout, which)[rank]
        per = layout.head_dim if unit == "head" else 1
        return Split(axis, r.start * per, r.stop * per)
    return split


def shard_step(step, ranks: int, only: int | None = None) -> list[RankGraph]:
    """The rank graphs of a traced decoder step (poot.models.llama.Step) over `ranks` (just
    rank `only`'s if given)."""
    return shard(step.graph, splits(layout_of(step.config, ranks)), ranks, only)
