"""gpt-oss's experts: each routed token's gate|up projection (one matrix whose rows
interleave gate and up, as the checkpoint stores them) plus its expert's bias, a SwiGLU
whose inputs are clamped, then the down projection plus its bias.

    gate = min(g, limit), up = clip(u, -limit, limit)
    out  = (up + 1) * gate * sigmoid(alpha * gate)

The router (a biased linear, top-k, softmax over the chosen k) and the weighted sum are
the shared MoE of poot.models.llama; its attention sinks are poot.ir.ops.attention_chain's.
"""
from __future__ import annotations

from poot import ops


def gpt_oss_experts(c, xk, experts, bias, fused: bool = True):
    """The expert outputs [N*k, dim] of the routed rows xk [N*k, dim], before the routing
    weights: `experts(x, name)` multiplies each row by its expert's matrix of the stack
    `name` ([E, N, K] as GGUF orders it), `bias(name)` is each row's expert bias [N*k, N].
    fused: gate and up are one stack whose rows alternate (HF's gate_up_proj); else the
    stacks ffn_gate_exps and ffn_up_exps (llama.cpp's converter splits them)."""
    rows, f = xk.shape[0], c.expert_ffn
    if fused:
        gu = ops.add(experts(xk, "ffn_gate_up_exps"), bias("ffn_gate_up_exps"))  # [N*k, 2f]
        pairs = ops.reshape(gu, (rows, f, 2))                                   # (gate, up)
        gate, up = (ops.reshape(ops.slice_axis(pairs, 2, j, j + 1), (rows, f)) for j in (0, 1))
    else:
        gate, up = (ops.add(experts(xk, name), bias(name))
                    for name in ("ffn_gate_exps", "ffn_up_exps"))
    limit = c.swiglu_limit
    gate = ops.minimum(gate, limit)
    up = ops.maximum(ops.minimum(up, limit), -limit)
    sig = ops.div(1.0, ops.add(ops.exp(ops.neg(ops.mul(gate, c.swiglu_alpha))), 1.0))
    act = ops.mul(ops.add(up, 1.0), ops.mul(gate, sig))
    return ops.add(experts(act, "ffn_down_exps"), bias("ffn_down_exps"))
