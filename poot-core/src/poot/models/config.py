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


def _hf_folder(tensors: dict) -> str:
    """The folder a safetensors checkpoint's tensors come from (for error messages)."""
    from pathlib import Path

    for t in tensors.values():
        ref = getattr(t, "ref", None)
        if ref is not None and ref.checkpoint:
            return str(Path(ref.checkpoint).parent)
    return "the HF folder"


#: the tensors every decoder layer needs (GGUF names; HF names are mapped to them)
_LAYER_TENSORS = ("attn_norm.weight", "ffn_norm.weight", "attn_q.weight", "attn_k.weight",
                  "attn_v.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight",
                  "ffn_down.weight")
_HF_LAYER_TENSORS = ("input_layernorm.weight", "post_attention_layernorm.weight",
                     "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                     "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                     "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")


def _check_hf_tensors(config: LlamaConfig, tensors: dict, where: str,
                      method: str | None = None) -> None:
    """Every tensor the builder will read is there (named the HF way where one is missing),
    and none is an integer tensor left over from a packed layout poot does not group."""
    from poot.models.weights import gguf_name

    have = {}
    for n, info in tensors.items():
        have.setdefault(gguf_name(n), (n, info))
    need = {"token_embd.weight": "model.embed_tokens.weight",
            "output_norm.weight": "model.norm.weight"}
    if not config.tied:
        need["output.weight"] = "lm_head.weight"
    for i in range(config.layers):
        for g, hf in zip(_LAYER_TENSORS, _HF_LAYER_TENSORS, strict=True):
            need[f"blk.{i}.{g}"] = f"model.layers.{i}.{hf}"
        if config.qkv_bias:
            for g in ("q", "k", "v"):
                need[f"blk.{i}.attn_{g}.bias"] = f"model.layers.{i}.self_attn.{g}_proj.bias"
    missing = [hf for g, hf in need.items() if g not in have]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise CheckpointError(f"{where}: the safetensors files lack tensor {missing[0]!r}{more} "
                              f"(a {config.layers}-layer {config.arch} model per config.json)")
    for g in need:
        name, info = have[g]
        dtype = getattr(info, "dtype", None)
        if getattr(info, "packed", None) is None and dtype is not None and dtype.is_int:
            raise CheckpointError(
                f"{where}: tensor {name!r} is {dtype.value}{list(info.shape)}, packed in a "
                f"layout poot does not read{f' (quant_method {method!r})' if method else ''}; "
                f"poot reads GPTQ, AWQ, FP8, NVFP4 (ModelOpt) and MXFP4 safetensors")


def from_hf(cfg: dict[str, Any], tensors: dict, max_seq: int | None = None) -> LlamaConfig:
    where = _hf_folder(tensors)
    arch = cfg.get("model_type")
    if arch not in HF_ARCHS:
        raise CheckpointError(f"{where}: unsupported architecture {arch!r} (config.json "
                              f"model_type): poot runs {', '.join(sorted(HF_ARCHS))} "
                              f"(Llama family) HF folders")

    def key(name, default=None, kind=int):
        value = cfg.get(name)
        if value is None:
            if default is None:
                raise CheckpointError(f"{where}: config.json lacks {name!r} "
                                      f"(needed for a {arch} model)")
            return default
        try:
            return kind(value)
        except (TypeError, ValueError):
            raise CheckpointError(f"{where}: config.json has {name} = {value!r}, "
                                  f"not a {kind.__name__}") from None

    dim, heads = key("hidden_size"), key("num_attention_heads")
    head_dim = key("head_dim", dim // heads)
    # transformers 5 writes rope_parameters (with rope_theta inside) where 4.x wrote
    # rope_scaling and a top-level rope_theta
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    rtype = rs.get("rope_type", rs.get("type"))
    if rtype not in (None, "default", "linear"):
        raise CheckpointError(f"{where}: RoPE scaling {rtype!r} is not supported (linear only)")
    ctx = key("max_position_embeddings", 2048)
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    if window:  # poot attends to the whole cache: keep the cache within the window
        ctx = min(ctx, key("sliding_window"))
    config = LlamaConfig(
        vocab=key("vocab_size"), dim=dim, layers=key("num_hidden_layers"),
        heads=heads, kv_heads=key("num_key_value_heads", heads), head_dim=head_dim,
        ffn=key("intermediate_size"), norm_eps=key("rms_norm_eps", 1e-5, float),
        rope_base=key("rope_theta", float(rs.get("rope_theta", 10000.0)), float),
        rope_scale=float(rs.get("factor", 1.0)) if rtype == "linear" else 1.0,
        rope_layout="half", tied=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        max_seq=min(ctx, max_seq or ctx), arch=arch)
    quant = cfg.get("quantization_config")
    _check_hf_tensors(config, tensors, where,
                      quant.get("quant_method") if isinstance(quant, dict) else None)
    return config
