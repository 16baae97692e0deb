"""LlamaConfig from a checkpoint's own metadata: GGUF key/values or an HF config.json."""
from __future__ import annotations

from typing import Any

from poot.checked import MISSING, Values
from poot.errors import CheckpointError
from poot.models.llama import LlamaConfig
from poot.models.shapes import LIMITS, check_config

#: GGUF architectures the Llama builder runs, and how their q/k rows are ordered
#: (llama.cpp's converter permutes llama/mistral q/k rows into adjacent pairs; qwen2 keeps
#: HF's rotate-half order and llama.cpp runs it in NEOX mode)
GGUF_ARCHS = {"llama": "pairs", "mistral": "pairs", "qwen2": "half"}
HF_ARCHS = {"llama", "mistral", "qwen2"}


def from_gguf(meta: dict[str, Any], tensors: dict, max_seq: int | None = None) -> LlamaConfig:
    v = Values(meta, _source(tensors, "the GGUF file"))
    arch = v.text("general.architecture", "")
    if arch not in GGUF_ARCHS:
        raise CheckpointError(f"unsupported architecture {arch!r}: poot runs "
                              f"{', '.join(sorted(GGUF_ARCHS))} (Llama family) GGUF files")

    def size(name, limit, default=MISSING):
        return v.integer(f"{arch}.{name}", default, lo=1, hi=LIMITS[limit])

    dim, heads = size("embedding_length", "dim"), size("attention.head_count", "heads")
    head_dim = size("attention.key_length", "head_dim", max(dim // heads, 1))
    tokens = v.text_list("tokenizer.ggml.tokens", [], max_len=LIMITS["vocab"])
    vocab = size("vocab_size", "vocab", 0) or len(tokens)
    if not vocab and "token_embd.weight" in tensors:
        vocab = tensors["token_embd.weight"].shape[0]
    scaling = v.text(f"{arch}.rope.scaling.type", None)
    if scaling not in (None, "none", "linear"):
        raise CheckpointError(f"RoPE scaling {scaling!r} is not supported (linear only)")
    scale = v.number(f"{arch}.rope.scaling.factor", 1.0, positive=True, hi=1e6) \
        if scaling == "linear" else 1.0
    ctx = size("context_length", "max_seq")
    config = LlamaConfig(
        vocab=int(vocab), dim=dim, layers=size("block_count", "layers"), heads=heads,
        kv_heads=size("attention.head_count_kv", "kv_heads", heads), head_dim=head_dim,
        ffn=size("feed_forward_length", "ffn"),
        norm_eps=v.number(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5, positive=True,
                          hi=1.0),
        rope_base=v.number(f"{arch}.rope.freq_base", 10000.0, positive=True),
        rope_scale=scale,
        rope_dim=v.integer(f"{arch}.rope.dimension_count", head_dim, lo=0,
                           hi=LIMITS["head_dim"]) or None,
        rope_layout=GGUF_ARCHS[arch], tied="output.weight" not in tensors,
        qkv_bias="blk.0.attn_q.bias" in tensors,
        max_seq=min(ctx, max_seq or ctx), arch=arch)
    check_config(config, tensors, "gguf", v.file)
    return config


def _source(tensors: dict, unknown: str, folder: bool = False) -> str:
    """The file (or, with folder, its folder) the tensors come from, for error messages."""
    from pathlib import Path

    for t in tensors.values():
        ref = getattr(t, "ref", None)
        if ref is not None and ref.checkpoint:
            return str(Path(ref.checkpoint).parent) if folder else ref.checkpoint
    return unknown


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
    where = _source(tensors, "the HF folder", folder=True)
    v = Values(cfg, f"{where}/config.json")
    arch = v.text("model_type", "")
    if arch not in HF_ARCHS:
        raise CheckpointError(f"{where}: unsupported architecture {arch!r} (config.json "
                              f"model_type): poot runs {', '.join(sorted(HF_ARCHS))} "
                              f"(Llama family) HF folders")

    def size(name, limit, default=MISSING):
        return v.integer(name, default, lo=1, hi=LIMITS[limit])

    dim, heads = size("hidden_size", "dim"), size("num_attention_heads", "heads")
    head_dim = size("head_dim", "head_dim", max(dim // heads, 1))
    # transformers 5 writes rope_parameters (with rope_theta inside) where 4.x wrote
    # rope_scaling and a top-level rope_theta
    key = "rope_scaling" if v.has("rope_scaling") else "rope_parameters"
    rs = Values(v.mapping(key, {}), f"{v.file} {key}")
    rtype = rs.text("rope_type", None) or rs.text("type", None)
    if rtype not in (None, "default", "linear"):
        raise CheckpointError(f"{where}: RoPE scaling {rtype!r} is not supported (linear only)")
    ctx = size("max_position_embeddings", "max_seq", 2048)
    window = size("sliding_window", "max_seq", 0) if v.flag("use_sliding_window", True) else 0
    if window:  # poot attends to the whole cache: keep the cache within the window
        ctx = min(ctx, window)
    config = LlamaConfig(
        vocab=size("vocab_size", "vocab"), dim=dim, layers=size("num_hidden_layers", "layers"),
        heads=heads, kv_heads=size("num_key_value_heads", "kv_heads", heads), head_dim=head_dim,
        ffn=size("intermediate_size", "ffn"),
        norm_eps=v.number("rms_norm_eps", 1e-5, positive=True, hi=1.0),
        rope_base=v.number("rope_theta", rs.number("rope_theta", 10000.0, positive=True),
                           positive=True),
        rope_scale=rs.number("factor", 1.0, positive=True, hi=1e6) if rtype == "linear"
        else 1.0,
        rope_layout="half", tied=v.flag("tie_word_embeddings", False),
        qkv_bias=arch == "qwen2" or v.flag("attention_bias", False),
        max_seq=min(ctx, max_seq or ctx), arch=arch)
    quant = cfg.get("quantization_config")
    _check_hf_tensors(config, tensors, where,
                      quant.get("quant_method") if isinstance(quant, dict) else None)
    check_config(config, tensors, "safetensors", v.file)
    return config
