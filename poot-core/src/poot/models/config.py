"""LlamaConfig from a checkpoint's own metadata: GGUF key/values or an HF config.json."""
from __future__ import annotations

from typing import Any

from poot.errors import CheckpointError
from poot.models.llama import LlamaConfig

#: GGUF architectures the Llama builder runs, and how their q/k rows are ordered
#: (llama.cpp's converter permutes llama/mistral q/k rows into adjacent pairs; qwen2 keeps
#: HF's rotate-half order and llama.cpp runs it in NEOX mode)
GGUF_ARCHS = {"llama": "pairs", "mistral": "pairs", "qwen2": "half"}
HF_ARCHS = {"llama", "mistral", "qwen2"}


def from_gguf(meta: dict[str, Any], tensors: dict, max_seq: int | None = None) -> LlamaConfig:
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHS:
        raise CheckpointError(f"unsupported architecture {arch!r}: poot runs "
                              f"{', '.join(sorted(GGUF_ARCHS))} (Llama family) GGUF files")

    def key(name, default=None):
        v = meta.get(f"{arch}.{name}", default)
        if v is None:
            raise CheckpointError(f"GGUF metadata lacks {arch}.{name}")
        return v

    dim, heads = int(key("embedding_length")), int(key("attention.head_count"))
    head_dim = int(meta.get(f"{arch}.attention.key_length", dim // heads))
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
    if not vocab:
        vocab = tensors["token_embd.weight"].shape[0]
    scaling = meta.get(f"{arch}.rope.scaling.type")
    scale = float(meta.get(f"{arch}.rope.scaling.factor", 1.0)) if scaling == "linear" else 1.0
    if scaling not in (None, "none", "linear"):
        raise CheckpointError(f"RoPE scaling {scaling!r} is not supported (linear only)")
    ctx = int(key("context_length"))
    return LlamaConfig(
        vocab=int(vocab), dim=dim, layers=int(key("block_count")), heads=heads,
        kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)), head_dim=head_dim,
        ffn=int(key("feed_forward_length")),
        norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_base=float(meta.get(f"{arch}.rope.freq_base", 10000.0)), rope_scale=scale,
        rope_dim=int(meta.get(f"{arch}.rope.dimension_count", head_dim)) or None,
        rope_layout=GGUF_ARCHS[arch], tied="output.weight" not in tensors,
        qkv_bias="blk.0.attn_q.bias" in tensors,
        max_seq=min(ctx, max_seq or ctx), arch=arch)


def from_hf(cfg: dict[str, Any], tensors: dict, max_seq: int | None = None) -> LlamaConfig:
    arch = cfg.get("model_type")
    if arch not in HF_ARCHS:
        raise CheckpointError(f"unsupported architecture {arch!r}: poot runs "
                              f"{', '.join(sorted(HF_ARCHS))} (Llama family) HF folders")
    dim, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or dim // heads)
    rs = cfg.get("rope_scaling") or {}
    rtype = rs.get("rope_type", rs.get("type"))
    if rtype not in (None, "default", "linear"):
        raise CheckpointError(f"RoPE scaling {rtype!r} is not supported (linear only)")
    ctx = int(cfg.get("max_position_embeddings", 2048))
    return LlamaConfig(
        vocab=int(cfg["vocab_size"]), dim=dim, layers=int(cfg["num_hidden_layers"]),
        heads=heads, kv_heads=int(cfg.get("num_key_value_heads", heads)), head_dim=head_dim,
        ffn=int(cfg["intermediate_size"]), norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        rope_base=float(cfg.get("rope_theta", 10000.0)),
        rope_scale=float(rs.get("factor", 1.0)) if rtype == "linear" else 1.0,
        rope_layout="half", tied=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        max_seq=min(ctx, max_seq or ctx), arch=arch)
