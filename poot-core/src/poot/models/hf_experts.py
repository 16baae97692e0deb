"""The routed experts of an HF folder, in either layout transformers writes, checked against
the config before a graph is built (Mixtral, Qwen2-MoE, Qwen3-MoE and DeepSeek alike).

transformers 4.x, and 5.x's default save_pretrained (which reverts its fusion), store one
tensor per expert; 5.x with `save_original_format=False` stores its in-memory stacks:
`mlp.experts.gate_up_proj` [E, 2I, H] (each expert's gate rows, then its up rows) and
`mlp.experts.down_proj` [E, H, I], for Mixtral too (4.x: `block_sparse_moe.experts.N.w1`).
poot.models.weights serves either as GGUF's expert stacks.
"""
from __future__ import annotations

from poot.errors import CheckpointError, ConfigError


def check_hf_experts(c, tensors: dict, where: str, per_expert: str = "mlp.experts.0.gate_proj"
                     ) -> None:
    """Each MoE layer of config `c` (from c.dense_layers on) holds its experts per expert
    (`per_expert`: expert 0's gate under the layer, as the family names it) or stacked,
    both halves of the stack there with the shapes the config implies."""
    e, f, d = c.experts, c.expert_ffn, c.dim
    for i in range(c.dense_layers, c.layers):
        p = f"model.layers.{i}.mlp.experts."
        stacks = {p + "gate_up_proj": (e, 2 * f, d), p + "down_proj": (e, d, f)}
        if not any(n in tensors for n in stacks):
            one = f"model.layers.{i}.{per_expert}.weight"
            if one not in tensors:
                raise CheckpointError(f"{where}: the safetensors files lack layer {i}'s "
                                      f"experts ({one}, or {p}gate_up_proj)")
            continue
        for name, want in stacks.items():
            info = tensors.get(name)
            if info is None:
                raise CheckpointError(f"{where}: the safetensors files lack tensor {name!r} "
                                      f"(the other half of layer {i}'s stacked experts)")
            if tuple(info.shape) != want:
                raise ConfigError(f"{where}: tensor {name!r} is {list(info.shape)}, but the "
                                  f"config implies {list(want)}", file=where, key=name,
                                  value=tuple(info.shape))
