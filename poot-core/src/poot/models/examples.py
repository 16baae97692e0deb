"""Small example graphs: the spec's decode-step attention layer and a transformer block."""
from __future__ import annotations

import math

from poot import ops
from poot.dtypes import DType
from poot.ir.graph import Graph
from poot.ir.types import SlotKind
from poot.tracer import trace


def decode_attention_layer(heads: int = 4, head_dim: int = 16, capacity: int = 32) -> Graph:
    """The spec's "attention layer as a DAG": q [H, D] against k/v caches [H, cap, D],
    the causal mask built from Pos and an Iota, then MatMul, scale, mask, softmax, MatMul."""

    def layer():
        q = ops.const((heads, 1, head_dim), DType.F32, "q")
        k = ops.state((heads, capacity, head_dim), DType.F32, "k_cache")
        v = ops.state((heads, capacity, head_dim), DType.F32, "v_cache")
        pos = ops.slot(SlotKind.POS, (1,), "pos", bound=capacity)
        mask = ops.causal_mask(pos, 1, capacity)
        ops.state_update(k, k)
        ops.state_update(v, v)
        return ops.attention_masked(q, k, v, mask, 1.0 / math.sqrt(head_dim))

    return trace(layer, name="decode_attention_layer")
