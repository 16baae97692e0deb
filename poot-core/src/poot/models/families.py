"""The model families poot builds: each is the shared Llama-style decoder with its traits."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """What a family sets beyond the Llama block (see LlamaConfig for each trait)."""

    #: how GGUF files order its q/k rows: llama.cpp's converter permutes llama/mistral
    #: rows into adjacent pairs; the others keep HF's rotate-half order (NEOX mode)
    gguf_rows: str = "half"
    qkv_bias: bool = False
    qk_norm: bool = False
    sandwich_norms: bool = False
    act: str = "silu"
    embed_scale: bool = False        # embeddings times sqrt(dim)
    #: GGUF files name no per-layer pattern: every n-th layer is global, the rest slide
    #: (0: no sliding layers unless the metadata names a window for all)
    sliding_period: int = 0
    rope_base_local: float | None = None  # GGUF default for the sliding layers
    #: HF's spelling of the activation
    hf_act: tuple[str, ...] = ("silu",)
    #: HF: the norm weights are stored as w and applied as (1 + w)
    hf_norm_offset: bool = False
    #: mixture of experts: "" (dense FFN), "mixtral" (HF num_local_experts), "qwen"
    #: (num_experts, moe_intermediate_size, norm_topk_prob, shared expert where sized) or
    #: "gpt_oss" (biased router and experts, clamped SwiGLU: poot.models.gpt_oss) or
    #: "deepseek" (poot.models.deepseek_config)
    moe: str = ""
    #: q|k|v and gate|up stored as one tensor each (HF qkv_proj, gate_up_proj; GGUF attn_qkv,
    #: and ffn_up holding gate|up): poot.models.fused serves their parts
    fused: bool = False
    #: HF: reads partial_rotary_factor and LongRoPE (Phi-3)
    partial_rotary: bool = False
    #: HF: attention sinks and q/k/v/o biases (per attention_bias, default on), layers that
    #: alternate sliding and full from the first (gpt-oss)
    sinks: bool = False
    #: GGUF: M-RoPE (poot.models.mrope), its sections in `<arch>.rope.dimension_sections`
    mrope: bool = False


FAMILIES: dict[str, Family] = {
    "llama": Family(gguf_rows="pairs"),
    "mistral": Family(gguf_rows="pairs"),
    "qwen2": Family(qkv_bias=True),
    # llama.cpp's Qwen2-VL / Qwen2.5-VL text model: Qwen2 whose rotary pairs turn by M-RoPE
    "qwen2vl": Family(qkv_bias=True, mrope=True),
    "qwen3": Family(qk_norm=True),
    "gemma3": Family(qk_norm=True, sandwich_norms=True, act="gelu_tanh", embed_scale=True,
                     sliding_period=6, rope_base_local=10000.0,
                     hf_act=("gelu_pytorch_tanh", "gelu_tanh"), hf_norm_offset=True),
    "qwen2moe": Family(qkv_bias=True, moe="qwen"),
    "qwen3moe": Family(qk_norm=True, moe="qwen"),
    "phi3": Family(fused=True, partial_rotary=True),
    # llama.cpp's gpt-oss: every other layer slides (from the first), gate and up experts
    # apart, the FFN's norm named post_attention_norm
    "gpt-oss": Family(moe="gpt_oss", sinks=True, sliding_period=2),
    # llama.cpp's DeepSeek-V2/V3 (poot.models.deepseek_config.from_gguf)
    "deepseek2": Family(moe="deepseek"),
}
#: HF-only families (their GGUF forms are not read yet: see from_gguf)
HF_FAMILIES = {
    "mixtral": Family(moe="mixtral"),
    "qwen2_moe": Family(qkv_bias=True, moe="qwen"),
    "qwen3_moe": Family(qk_norm=True, moe="qwen"),
    # experts as poot.models.gpt_oss computes them
    "gpt_oss": Family(moe="gpt_oss", sinks=True),
    # multi-head latent attention, shared experts, group-limited routing:
    # poot.models.deepseek
    "deepseek_v2": Family(moe="deepseek"),
    "deepseek_v3": Family(moe="deepseek"),
}
#: HF model_type -> family (GGUF architecture name)
HF_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
            "gemma3_text": "gemma3", "mixtral": "mixtral", "qwen2_moe": "qwen2_moe",
            "qwen3_moe": "qwen3_moe", "phi3": "phi3", "gpt_oss": "gpt_oss",
            "deepseek_v2": "deepseek_v2", "deepseek_v3": "deepseek_v3"}
