"""LlamaConfig from a checkpoint's own metadata: GGUF key/values or an HF config.json.

Each family is the shared decoder with its traits (`FAMILIES`). Every key a checkpoint's
config holds is either read, known not to change the forward pass, or refused by name: a
variant poot does not implement never runs as something else.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from poot.checked import MISSING, Values
from poot.errors import CheckpointError
from poot.models import deepseek_config
from poot.models.families import FAMILIES, HF_FAMILIES, HF_TYPES, Family
from poot.models.fused import GATE_UP, QKV, check_fused, gguf_fused_name
from poot.models.hf_experts import check_hf_experts
from poot.models.llama import LlamaConfig
from poot.models.rope import RopeScaling
from poot.models.shapes import LIMITS, check_config

GGUF_ARCHS = {a: f.gguf_rows for a, f in FAMILIES.items()}
HF_ARCHS = set(HF_TYPES)

#: GGUF `<arch>.*` keys that are read below, or do not change the forward pass
_GGUF_KEYS = {
    "context_length", "embedding_length", "block_count", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.key_length",
    "attention.value_length", "attention.layer_norm_rms_epsilon", "rope.freq_base",
    "rope.dimension_count", "rope.scaling.type", "rope.scaling.factor",
    "rope.scaling.original_context_length", "rope.scaling.finetuned",
    "rope.scaling.yarn_log_multiplier", "rope.scaling.attn_factor",
    "attention.sliding_window", "vocab_size", "rope.freq_base_swa",
    "attention.sliding_window_pattern", "expert_count", "expert_used_count",
    "expert_feed_forward_length", "expert_shared_feed_forward_length", "expert_weights_norm",
}


def from_gguf(meta: dict[str, Any], tensors: dict, max_seq: int | None = None) -> LlamaConfig:
    v = Values(meta, _source(tensors, "the GGUF file"))
    arch = v.text("general.architecture", "")
    if arch not in FAMILIES:
        raise CheckpointError(f"unsupported architecture {arch!r}: poot runs "
                              f"{', '.join(sorted(FAMILIES))} GGUF files")
    fam = FAMILIES[arch]
    read = _GGUF_KEYS | (deepseek_config.GGUF_KEYS if fam.moe == "deepseek" else set()) \
        | ({"rope.dimension_sections"} if fam.mrope else set())
    unknown = sorted(k for k in meta if k.startswith(f"{arch}.")
                     and k[len(arch) + 1:] not in read)
    if unknown:
        raise CheckpointError(f"GGUF metadata key {unknown[0]!r} = {meta[unknown[0]]!r} names "
                              f"a {arch} variant poot does not implement")

    def size(name, limit, default=MISSING, lo=1):
        return v.integer(f"{arch}.{name}", default, lo=lo, hi=LIMITS[limit])

    dim, heads = size("embedding_length", "dim"), size("attention.head_count", "heads")
    head_dim = size("attention.key_length", "head_dim", max(dim // heads, 1))
    if size("attention.value_length", "head_dim", head_dim) != head_dim and \
            fam.moe != "deepseek":   # MLA's sizes: poot.models.deepseek_config.from_gguf
        raise CheckpointError(f"{arch}.attention.value_length differs from key_length: poot's "
                              f"attention takes one head dim")
    tokens = v.text_list("tokenizer.ggml.tokens", [], max_len=LIMITS["vocab"])
    vocab = size("vocab_size", "vocab", 0) or len(tokens)
    if not vocab and "token_embd.weight" in tensors:
        vocab = tensors["token_embd.weight"].shape[0]
    layers, ctx = size("block_count", "layers"), size("context_length", "max_seq")
    window = size("attention.sliding_window", "max_seq", 0, lo=0)
    sliding: tuple[bool, ...] = ()
    if window:
        period = size("attention.sliding_window_pattern", "layers", fam.sliding_period, lo=0)
        sliding = tuple((i + 1) % period != 0 if period else True for i in range(layers))
    experts = size("expert_count", "experts", 0, lo=0)
    moe = {}
    if experts and fam.moe != "deepseek":
        if "blk.0.ffn_gate_exps.weight" not in tensors:
            raise CheckpointError(f"{arch} GGUF with {experts} experts has no stacked "
                                  f"blk.0.ffn_gate_exps.weight (per-expert tensors of old "
                                  f"converters are not read)")
        shared = size("expert_shared_feed_forward_length", "ffn", 0, lo=0)
        moe = dict(experts=experts, experts_used=size("expert_used_count", "experts"),
                   expert_ffn=size("expert_feed_forward_length", "ffn", 0, lo=0)
                   or tensors["blk.0.ffn_gate_exps.weight"].shape[1],
                   norm_topk=v.flag(f"{arch}.expert_weights_norm", arch != "qwen2moe"),
                   shared_ffn=shared or (tensors["blk.0.ffn_gate_shexp.weight"].shape[0]
                                         if "blk.0.ffn_gate_shexp.weight" in tensors else 0))
    config = LlamaConfig(
        vocab=int(vocab), dim=dim, layers=layers, heads=heads,
        kv_heads=size("attention.head_count_kv", "kv_heads", heads), head_dim=head_dim,
        ffn=size("feed_forward_length", "ffn", 0, lo=0) if experts
        else size("feed_forward_length", "ffn"),
        norm_eps=v.number(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5, positive=True,
                          hi=1.0),
        rope_base=v.number(f"{arch}.rope.freq_base", 10000.0, positive=True),
        rope_scaling=_gguf_rope_scaling(v, arch, tensors, "rope_freqs.weight" in tensors),
        rope_dim=size("rope.dimension_count", "head_dim", head_dim, lo=0) or None,
        rope_layout=fam.gguf_rows, tied="output.weight" not in tensors,
        qkv_bias="blk.0.attn_q.bias" in tensors,
        max_seq=min(ctx, max_seq or ctx), arch=arch, **_traits(fam, dim),
        window=window or None, sliding=sliding,
        rope_base_local=v.number(f"{arch}.rope.freq_base_swa", fam.rope_base_local or 0.0,
                                 lo=0.0) or None, **moe)
    if fam.moe == "gpt_oss":
        # llama.cpp fixes the clamped SwiGLU's constants; YaRN's correction range is not
        # rounded to whole dims (transformers' truncate = false for gpt-oss)
        config = replace(config, attn_sinks=True, swiglu_limit=7.0,
                         out_bias="blk.0.attn_output.bias" in tensors,
                         rope_scaling=replace(config.rope_scaling, truncate=False))
    if fam.mrope:
        config = replace(config, mrope=_gguf_mrope(v, arch, config.rot))
    if fam.moe == "deepseek":
        config = deepseek_config.from_gguf(config, v, arch, tensors)
        deepseek_config.check_gguf_tensors(config, tensors, v.file)
    if fam.fused:   # llama.cpp's ffn_up holds gate|up: checked as the fused tensor it is
        tensors = {gguf_fused_name(n): t for n, t in tensors.items()}
        check_fused(config, {n: t.shape for n, t in tensors.items()}, v.file)
    check_config(config, tensors, "gguf", v.file)
    _check_longrope(config, v.file)
    return config


def _traits(fam: Family, dim: int) -> dict:
    return dict(qk_norm=fam.qk_norm, sandwich_norms=fam.sandwich_norms, act=fam.act,
                embed_scale=math.sqrt(dim) if fam.embed_scale else 1.0)


def _gguf_mrope(v: Values, arch: str, rot: int) -> tuple[int, int, int]:
    """M-RoPE's sections (rotary pairs per temporal, height and width position) as
    llama.cpp's converter writes them: four counts, the fourth 0 for Qwen2-VL and
    Qwen2.5-VL."""
    key = f"{arch}.rope.dimension_sections"
    sections = v.int_list(key, lo=0, hi=LIMITS["head_dim"], max_len=4)
    if len(sections) != 4 or sections[3] or 2 * sum(sections) != rot:
        v.fail(key, sections, f"must give three counts of rotary pairs and a 0, summing "
                              f"to half the rotary dim {rot}")
    return tuple(sections[:3])


def _gguf_rope_scaling(v: Values, arch: str, tensors: dict, has_freqs: bool) -> RopeScaling:
    kind = v.text(f"{arch}.rope.scaling.type", None)
    factor = v.number(f"{arch}.rope.scaling.factor", 1.0, positive=True, hi=1e6)
    orig = v.integer(f"{arch}.rope.scaling.original_context_length", 0, lo=0,
                     hi=LIMITS["max_seq"])
    attn = v.number(f"{arch}.rope.scaling.attn_factor", None, positive=True, hi=1e3)
    longrope = [n for n in ("rope_factors_short.weight", "rope_factors_long.weight")
                if n in tensors]
    if longrope or arch == "phi3":
        return _gguf_longrope(v, arch, tensors, longrope, orig, attn)
    if attn not in (None, 1.0):
        raise CheckpointError(f"GGUF {arch}.rope.scaling.attn_factor = {attn:g} is read for "
                              f"phi3's LongRoPE only")
    if kind in (None, "none", ""):
        return RopeScaling()  # llama3 scaling lives in the rope_freqs tensor when present
    if kind == "linear":
        return RopeScaling("linear", factor)
    if kind == "yarn":
        if not orig:
            raise CheckpointError(f"GGUF YaRN scaling lacks "
                                  f"{arch}.rope.scaling.original_context_length")
        if v.number(f"{arch}.rope.scaling.yarn_log_multiplier", 0.0) and \
                FAMILIES[arch].moe != "deepseek":   # read by deepseek_config.from_gguf
            raise CheckpointError(f"{arch}.rope.scaling.yarn_log_multiplier (DeepSeek's mscale) "
                                  f"is not implemented")
        return RopeScaling("yarn", factor, orig)
    raise CheckpointError(f"GGUF {arch}.rope.scaling.type {kind!r} is not supported "
                          f"(linear and yarn; llama3 through the rope_freqs tensor)")


def _gguf_longrope(v: Values, arch: str, tensors: dict, names: list, orig: int,
                   attn: float | None) -> RopeScaling:
    """LongRoPE as llama.cpp's converter writes it: the factor tensors rope_factors_short /
    rope_factors_long, the original context and the attention factor it computed."""
    if arch != "phi3":
        raise CheckpointError(f"GGUF tensor {names[0]!r} (LongRoPE factors) in a {arch} "
                              f"file: poot reads LongRoPE for phi3")
    if not names:
        return RopeScaling()     # a 4k-context Phi-3: plain RoPE
    if len(names) != 2 or not orig:
        raise CheckpointError(f"GGUF phi3 LongRoPE needs rope_factors_short.weight, "
                              f"rope_factors_long.weight and {arch}.rope.scaling."
                              f"original_context_length")
    short, long = (_factor_tensor(tensors[n], n) for n in names)
    if len(short) != len(long):
        raise CheckpointError(f"GGUF phi3 rope_factors_short holds {len(short)} factors, "
                              f"rope_factors_long {len(long)}")
    ctx = v.integer(f"{arch}.context_length", orig, lo=1, hi=LIMITS["max_seq"])
    return RopeScaling("longrope", ctx / orig, orig, attention_factor=attn if attn else 1.0,
                       short_factor=short, long_factor=long)


def _factor_tensor(info, name: str) -> tuple[float, ...]:
    import numpy as np

    if getattr(info, "packed", None) is not None or len(info.shape) != 1:
        raise CheckpointError(f"GGUF tensor {name!r} must be a dense vector of factors")
    values = np.asarray(info.sources[0], np.float64).reshape(-1)
    if not np.isfinite(values).all() or (values <= 0).any():
        raise CheckpointError(f"GGUF tensor {name!r} holds a factor that is not a positive "
                              f"finite number")
    return tuple(float(x) for x in values)


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


def _check_hf_tensors(config: LlamaConfig, tensors: dict, where: str,
                      method: str | None = None) -> None:
    """Every tensor the builder will read is there (named the HF way where one is missing),
    and none is an integer tensor left over from a packed layout poot does not group."""
    from poot.models.weights import gguf_name, hf_name

    sandwich = config.sandwich_norms
    have = {}
    for n, info in tensors.items():
        have.setdefault(gguf_name(n, sandwich), (n, info))
    need = ["token_embd.weight", "output_norm.weight"]
    if not config.tied:
        need.append("output.weight")
    for i in range(config.layers):
        layer = list(_LAYER_TENSORS)
        if config.mla is not None:
            layer = [g for g in layer if not g.startswith(("attn_q", "attn_k", "attn_v"))]
            layer += ["attn_kv_a_mqa.weight", "attn_kv_a_norm.weight", "attn_kv_b.weight"]
            layer += (["attn_q_a.weight", "attn_q_a_norm.weight", "attn_q_b.weight"]
                      if config.mla.q_rank else ["attn_q.weight"])
        if getattr(FAMILIES.get(config.arch), "fused", False):
            layer = [g for g in layer if not g.startswith(("attn_q", "attn_k", "attn_v",
                                                           "ffn_gate", "ffn_up"))]
            layer += [QKV, GATE_UP]
        if config.experts and i >= config.dense_layers:
            layer = [g for g in layer if not g.startswith(("ffn_gate", "ffn_up", "ffn_down"))]
            layer += ["ffn_gate_inp.weight"]
            if config.shared_ffn:
                layer += [f"ffn_{g}_shexp.weight" for g in ("gate", "up", "down")]
                if config.routing is None:
                    layer += ["ffn_gate_inp_shexp.weight"]
            if config.routing is not None and config.routing.bias:
                layer += ["exp_probs_b.bias"]
        if config.qkv_bias:
            layer += [f"attn_{g}.bias" for g in "qkv"]
        if config.out_bias:
            layer += ["attn_output.bias"]
        if config.attn_sinks:
            layer += ["attn_sinks.weight"]
        if config.swiglu_limit is not None:      # gpt-oss's biased router and experts
            layer += ["ffn_gate_inp.bias"] + [f"ffn_{g}_exps.{kind}" for g in ("gate_up", "down")
                                              for kind in ("weight", "bias")]
        if config.qk_norm:
            layer += ["attn_q_norm.weight", "attn_k_norm.weight"]
        if sandwich:
            layer += ["post_attention_norm.weight", "post_ffw_norm.weight"]
        need += [f"blk.{i}.{g}" for g in layer]
    missing = [hf_name(g, sandwich) for g in need if g not in have]
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


#: config.json keys that do not change the forward pass
_HF_IGNORED = {
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version",
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "use_cache",
    "attention_dropout", "_name_or_path", "pretraining_tp", "output_attentions",
    "output_hidden_states", "return_dict", "_attn_implementation", "max_window_layers",
    "quantization_config", "cache_implementation", "id2label", "label2id",
    "resid_pdrop", "embd_pdrop",        # dropout: training only
    "auto_map",                         # remote-code classes: transformers' own Phi3 runs
}
#: keys that change nothing at the value given and are refused at any other: Phi-4-mini's
#: settings for its remote code (every layer global, no interpolation, no head bias), which
#: transformers' own Phi3 does not read
_HF_NEUTRAL = {"full_attn_mod": 1, "interpolate_factor": 1, "lm_head_bias": False}
#: keys read by from_hf (with the families that read them)
_HF_READ = {
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "intermediate_size", "rms_norm_eps", "rope_theta", "rope_scaling",
    "rope_parameters", "max_position_embeddings", "vocab_size", "tie_word_embeddings",
    "hidden_act", "hidden_activation", "attention_bias", "mlp_bias", "sliding_window",
    "use_sliding_window", "layer_types", "sliding_window_pattern", "rope_local_base_freq",
    "query_pre_attn_scalar", "final_logit_softcapping", "attn_logit_softcapping",
    "use_bidirectional_attention", "num_local_experts", "num_experts", "num_experts_per_tok",
    "moe_intermediate_size", "shared_expert_intermediate_size", "norm_topk_prob",
    "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef", "output_router_logits",
    "router_jitter_noise", "qkv_bias", "partial_rotary_factor",
    "original_max_position_embeddings", "swiglu_limit", "swiglu_alpha", "experts_per_token",
    "initial_context_length", *deepseek_config.KEYS,
}
#: keys only gpt_oss configs hold (refused in any other family's)
_GPT_OSS_KEYS = ("swiglu_limit", "swiglu_alpha", "experts_per_token", "initial_context_length")
#: the LIMITS entry bounding each integer config.json key
_HF_LIMITS = {
    "hidden_size": "dim", "num_attention_heads": "heads", "num_key_value_heads": "kv_heads",
    "head_dim": "head_dim", "num_hidden_layers": "layers", "intermediate_size": "ffn",
    "moe_intermediate_size": "ffn", "max_position_embeddings": "max_seq",
    "vocab_size": "vocab", "num_local_experts": "experts", "num_experts": "experts",
    "num_experts_per_tok": "experts",
}
#: rope_scaling keys read per kind (beyond rope_type/type, rope_theta)
_ROPE_KEYS = {
    "default": set(), "linear": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"},
    "yarn": {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
             "attention_factor", "truncate"},
    "longrope": {"short_factor", "long_factor", "factor", "attention_factor",
                 "original_max_position_embeddings"},
}
#: keys transformers 5 may write inside rope_parameters whatever the kind (the original
#: context is read where the kind uses it)
_ROPE_COMMON = {"rope_type", "type", "rope_theta", "partial_rotary_factor",
                "original_max_position_embeddings"}
#: transformers 5 writes Gemma 3's rope_parameters per layer type
_LAYER_TYPES = ("full_attention", "sliding_attention")


def from_hf(cfg: dict[str, Any], tensors: dict, max_seq: int | None = None) -> LlamaConfig:
    where = _source(tensors, "the HF folder", folder=True)
    v = Values(cfg, f"{where}/config.json")
    model_type = v.text("model_type", "")
    if model_type not in HF_TYPES:
        raise CheckpointError(f"{where}: unsupported architecture {model_type!r} (config.json "
                              f"model_type): poot runs {', '.join(sorted(HF_TYPES))} HF folders")
    arch = HF_TYPES[model_type]
    fam = FAMILIES.get(arch) or HF_FAMILIES[arch]

    def refuse(name, why):
        raise CheckpointError(f"{where}: config.json {name} = {cfg.get(name)!r}: {why}")

    unknown = sorted(set(cfg) - _HF_IGNORED - _HF_READ - set(_HF_NEUTRAL))
    if unknown:
        refuse(unknown[0], f"a {model_type} setting poot does not implement")
    for name, neutral in _HF_NEUTRAL.items():
        if name in cfg and (cfg[name] != neutral or type(cfg[name]) is not type(neutral)):
            refuse(name, f"poot implements {name} = {_json_value(neutral)} only")

    def key(name, default=MISSING, kind=int):
        if kind is float:
            return v.number(name, default, positive=True, hi=1.0)
        return v.integer(name, default, lo=1, hi=LIMITS[_HF_LIMITS[name]])

    act_key = "hidden_activation" if "hidden_activation" in cfg else "hidden_act"
    if cfg.get(act_key, fam.hf_act[0]) not in fam.hf_act:
        refuse(act_key, f"poot runs {model_type} with {fam.hf_act[0]}")
    for name in ("mlp_bias", "final_logit_softcapping", "attn_logit_softcapping",
                 "use_bidirectional_attention"):
        if cfg.get(name):
            refuse(name, "not implemented")
    if arch != "qwen2" and not fam.sinks and cfg.get("attention_bias"):
        refuse("attention_bias", "q/k/v/o biases are implemented for qwen2 and gpt_oss only")
    for name in _GPT_OSS_KEYS:
        if name in cfg and fam.moe != "gpt_oss":
            refuse(name, "a gpt_oss setting, read for gpt_oss only")
    for name in deepseek_config.KEYS:
        if name in cfg and fam.moe != "deepseek":
            refuse(name, "a DeepSeek setting, read for deepseek_v2 and deepseek_v3 only")
    # gpt-oss: q/k/v and o biases unless attention_bias says otherwise (its default: on)
    biases = fam.sinks and v.flag("attention_bias", True)
    # transformers 5 names Qwen2-MoE's q/k/v biases qkv_bias (4.x: always there)
    if cfg.get("qkv_bias") is not None and (arch != "qwen2_moe" or not v.flag("qkv_bias")):
        refuse("qkv_bias", f"q/k/v biases are implemented for qwen2 and qwen2_moe (with "
                           f"qkv_bias true)")
    dim, heads = key("hidden_size"), key("num_attention_heads")
    head_dim = key("head_dim", dim // heads)
    layers = key("num_hidden_layers")
    ctx = key("max_position_embeddings", 2048)
    rope = _hf_rope(v, where, fam, ctx)
    window, sliding = _hf_sliding(v, arch, layers)
    local = rope.local_base if arch == "gemma3" else None
    scalar = v.number("query_pre_attn_scalar", None, positive=True)
    config = LlamaConfig(
        vocab=key("vocab_size"), dim=dim, layers=layers,
        heads=heads, kv_heads=key("num_key_value_heads", heads), head_dim=head_dim,
        ffn=key("intermediate_size"), norm_eps=key("rms_norm_eps", 1e-5, float),
        rope_base=rope.base, rope_scaling=rope.scaling, rope_layout="half",
        rope_dim=_rotary_dims(head_dim, rope.partial),
        tied=v.flag("tie_word_embeddings", arch == "gemma3"),
        qkv_bias=fam.qkv_bias or (biases if fam.sinks else v.flag("attention_bias", False)),
        out_bias=biases, attn_sinks=fam.sinks,
        max_seq=min(ctx, max_seq or ctx), arch=arch, **_traits(fam, dim),
        attn_scale=scalar ** -0.5 if scalar else None,
        window=window, sliding=sliding,
        rope_base_local=(local if local is not None else fam.rope_base_local) or None)
    if fam.moe == "deepseek":
        config = deepseek_config.deepseek_config(config, cfg, v, where, model_type)
        tensors = deepseek_config.without_mtp(tensors, cfg, layers)
        check_hf_experts(config, tensors, where)
    elif fam.moe:
        config = replace(config, **_hf_moe(cfg, v, fam, where, key))
        if fam.moe != "gpt_oss":    # gpt-oss stacks [E, K, N] (and MXFP4 blocks) apart
            check_hf_experts(config, tensors, where, "block_sparse_moe.experts.0.w1"
                             if fam.moe == "mixtral" else "mlp.experts.0.gate_proj")
    elif any(cfg.get(k) for k in ("num_local_experts", "num_experts")):
        refuse("num_experts" if cfg.get("num_experts") else "num_local_experts",
               f"experts in a {model_type} model")
    quant = cfg.get("quantization_config")
    _check_hf_tensors(config, tensors, where,
                      quant.get("quant_method") if isinstance(quant, dict) else None)
    if fam.fused:
        from poot.models.weights import gguf_name

        check_fused(config, {g: t.shape for n, t in tensors.items()
                             if (g := gguf_name(n)) is not None}, where)
    check_config(config, tensors, "safetensors", v.file)
    _check_longrope(config, where)
    return config


def _json_value(value) -> str:
    """A config value as config.json spells it."""
    import json

    return json.dumps(value)


def _hf_moe(cfg: dict, v: Values, fam: Family, where: str, key) -> dict:
    """The experts of a Mixtral / Qwen2-MoE / Qwen3-MoE config (every layer sparse)."""
    def refuse(name, why):
        raise CheckpointError(f"{where}: config.json {name} = {cfg.get(name)!r}: {why}")

    if v.integer("decoder_sparse_step", 1) != 1:
        refuse("decoder_sparse_step", "poot runs configs where every layer has experts")
    if cfg.get("mlp_only_layers"):
        refuse("mlp_only_layers", "poot runs configs where every layer has experts")
    # transformers 5 writes num_local_experts for every MoE family (4.x: num_experts for
    # the Qwen ones); either spelling is read, and both only where they agree
    spelled = [n for n in ("num_local_experts", "num_experts") if cfg.get(n) is not None]
    if len(spelled) == 2 and cfg["num_local_experts"] != cfg["num_experts"]:
        refuse("num_experts", f"contradicts num_local_experts = {cfg['num_local_experts']!r}")
    experts = key(spelled[0] if spelled else "num_local_experts")
    if fam.moe == "gpt_oss":
        # OpenAI's own names beside transformers': experts_per_token must agree, and
        # initial_context_length is not read (transformers takes rope_scaling's)
        used = key("num_experts_per_tok")
        if cfg.get("experts_per_token", used) != used:
            refuse("experts_per_token", f"contradicts num_experts_per_tok = {used}")
        return dict(experts=experts, experts_used=used,
                    expert_ffn=key("intermediate_size"), norm_topk=True,
                    swiglu_limit=v.number("swiglu_limit", 7.0, positive=True),
                    swiglu_alpha=v.number("swiglu_alpha", 1.702, positive=True))
    if fam.moe == "mixtral":
        return dict(experts=experts, experts_used=key("num_experts_per_tok"),
                    expert_ffn=key("intermediate_size"), norm_topk=True)
    return dict(experts=experts, experts_used=key("num_experts_per_tok"),
                expert_ffn=key("moe_intermediate_size"),
                norm_topk=v.flag("norm_topk_prob", False),
                shared_ffn=v.integer("shared_expert_intermediate_size", 0, lo=0,
                                     hi=LIMITS["ffn"]))


@dataclass(frozen=True)
class _Rope:
    """What a config.json says of RoPE."""

    base: float
    scaling: RopeScaling
    partial: float = 1.0                 # the share of each head RoPE rotates
    local_base: float | None = None      # Gemma 3's sliding layers


def _hf_rope(v: Values, where: str, fam: Family, ctx: int) -> _Rope:
    """RoPE as transformers reads it: 4.x wrote rope_scaling and a top-level rope_theta
    (rope_local_base_freq for Gemma 3's sliding layers, partial_rotary_factor and
    original_max_position_embeddings for Phi-3); 5.x writes rope_parameters holding
    rope_theta and the rest, per layer type for Gemma 3. A rope_scaling that is set wins,
    as transformers 5 lets it."""
    name = "rope_scaling" if v.values.get("rope_scaling") else "rope_parameters"
    params = v.mapping(name, None) or {}
    local = v.number("rope_local_base_freq", None, positive=True)
    if params and set(params) <= set(_LAYER_TYPES):
        full = Values(v.mapping(name)["full_attention"] if "full_attention" in params else {},
                      f"{v.file} {name}.full_attention")
        slide = Values(params.get("sliding_attention") or {},
                       f"{v.file} {name}.sliding_attention")
        kind = slide.text("rope_type", None) or slide.text("type", None) or "default"
        extra = sorted(set(slide.values) - {"rope_type", "type", "rope_theta"})
        if kind != "default" or extra:
            what = f"rope_type {kind!r}" if kind != "default" else f"key {extra[0]!r}"
            raise CheckpointError(f"{where}: config.json {name}.sliding_attention {what}: "
                                  f"poot never scales the sliding layers' RoPE")
        local = slide.number("rope_theta", local, positive=True)
        rs, name = full, f"{name}.full_attention"
    else:
        rs = Values(params, f"{v.file} {name}")
    kind = rs.text("rope_type", None) or rs.text("type", None) or "default"
    if fam.partial_rotary and kind in ("su", "yarn"):   # Phi-3's older names of LongRoPE
        kind = "longrope"
    if kind not in _ROPE_KEYS or (kind == "longrope" and not fam.partial_rotary):
        known = [k for k in _ROPE_KEYS if k != "longrope" or fam.partial_rotary]
        raise CheckpointError(f"{where}: config.json {name} rope_type {kind!r} is not "
                              f"supported (poot runs {', '.join(known)} for this family)")
    # DeepSeek's YaRN also names mscale and mscale_all_dim (read where set)
    mscales = {"mscale", "mscale_all_dim"} if kind == "yarn" and fam.moe == "deepseek" else set()
    extra = sorted(set(rs.values) - _ROPE_KEYS[kind] - _ROPE_COMMON - mscales)
    if extra:
        raise CheckpointError(f"{where}: config.json {name} key {extra[0]!r} is not "
                              f"implemented for rope_type {kind!r}")
    base = v.number("rope_theta", rs.number("rope_theta", 10000.0, positive=True),
                    positive=True)
    partial = rs.number("partial_rotary_factor",
                        v.number("partial_rotary_factor", 1.0, positive=True, hi=1.0),
                        positive=True, hi=1.0)
    if partial != 1.0 and not fam.partial_rotary:
        raise CheckpointError(f"{where}: config.json partial_rotary_factor = {partial:g}: "
                              f"partial rotary is implemented for phi3 only")

    def rope(scaling=RopeScaling()):
        return _Rope(base, scaling, partial, local)

    if kind == "default":
        return rope()
    factor = rs.number("factor", 1.0, positive=True, hi=1e6)
    if kind == "linear":
        return rope(RopeScaling("linear", factor))
    if kind == "longrope":
        return rope(_hf_longrope(v, rs, where, name, ctx))
    orig = rs.integer("original_max_position_embeddings", 0 if kind == "llama3" else ctx,
                      lo=0, hi=LIMITS["max_seq"])
    if kind == "llama3":
        if not orig:
            raise CheckpointError(f"{where}: config.json {name} (llama3) lacks "
                                  f"original_max_position_embeddings")
        return rope(RopeScaling("llama3", factor, orig, rs.number("low_freq_factor", 1.0),
                                rs.number("high_freq_factor", 4.0)))
    return rope(RopeScaling("yarn", factor, orig, beta_fast=rs.number("beta_fast", 32.0),
                            beta_slow=rs.number("beta_slow", 1.0),
                            attention_factor=rs.number("attention_factor", None)
                            or _yarn_mscale_ratio(rs, factor),
                            truncate=rs.flag("truncate", True)))


def _yarn_mscale_ratio(rs: Values, factor: float) -> float | None:
    """YaRN's cos/sin factor where mscale and mscale_all_dim are set (DeepSeek), as
    transformers derives it; None: the default, from the factor alone."""
    mscale, all_dim = rs.number("mscale", 0.0, lo=0.0), rs.number("mscale_all_dim", 0.0, lo=0.0)
    if not (mscale and all_dim) or factor <= 1:
        return None
    return (0.1 * mscale * math.log(factor) + 1.0) / (0.1 * all_dim * math.log(factor) + 1.0)


def _hf_longrope(v: Values, rs: Values, where: str, name: str, ctx: int) -> RopeScaling:
    """Phi-3's LongRoPE as transformers computes it: the factor is the context's ratio to
    original_max_position_embeddings (top level in 4.x, in rope_parameters in 5.x; Phi3Config
    defaults it to 4096), so a `factor` key changes nothing."""
    orig = rs.integer("original_max_position_embeddings",
                      v.integer("original_max_position_embeddings", 4096, lo=1,
                                hi=LIMITS["max_seq"]), lo=1, hi=LIMITS["max_seq"])
    short, long = (rs.number_list(k, max_len=LIMITS["head_dim"] // 2)
                   for k in ("short_factor", "long_factor"))
    if any(x <= 0 for x in short + long):
        raise CheckpointError(f"{where}: config.json {name} factors must be positive")
    return RopeScaling("longrope", ctx / orig, orig,
                       attention_factor=rs.number("attention_factor", None, positive=True),
                       short_factor=tuple(short), long_factor=tuple(long))


def _check_longrope(c: LlamaConfig, where: str) -> None:
    """LongRoPE gives one short and one long factor per rotated frequency."""
    s = c.rope_scaling
    if s.kind == "longrope" and not len(s.short_factor) == len(s.long_factor) == c.rot // 2:
        raise CheckpointError(f"{where}: LongRoPE has {len(s.short_factor)} short and "
                              f"{len(s.long_factor)} long factors; {c.rot} rotated dims take "
                              f"{c.rot // 2} of each")


def _rotary_dims(head_dim: int, partial: float) -> int | None:
    """rope_dim of a partial_rotary_factor (None: the whole head), as transformers rounds it."""
    if partial == 1.0:
        return None
    return int(head_dim * partial)


def _hf_sliding(v: Values, arch: str, layers: int):
    """(window, per-layer sliding flags) from sliding_window and layer_types (or Gemma 3's
    sliding_window_pattern, or Qwen2's use_sliding_window / max_window_layers)."""
    window = v.integer("sliding_window", 0, lo=0, hi=LIMITS["max_seq"])
    if not window or not v.flag("use_sliding_window", True):
        return None, ()
    types = v.text_list("layer_types", None, max_len=layers)
    if types is not None:
        if len(types) != layers or not set(types) <= {"sliding_attention", "full_attention"}:
            v.fail("layer_types", types, f"must list 'sliding_attention' or 'full_attention' "
                                         f"for each of the {layers} layers")
        return window, tuple(t == "sliding_attention" for t in types)
    if arch == "gemma3":
        period = v.integer("sliding_window_pattern", 6, lo=1, hi=LIMITS["layers"])
        return window, tuple((i + 1) % period != 0 for i in range(layers))
    if arch == "gpt_oss":       # transformers' default: sliding, full, sliding, ...
        return window, tuple(i % 2 == 0 for i in range(layers))
    if arch == "qwen2":
        first = v.integer("max_window_layers", layers, lo=0, hi=LIMITS["layers"])
        return window, tuple(i >= first for i in range(layers))
    return window, (True,) * layers
