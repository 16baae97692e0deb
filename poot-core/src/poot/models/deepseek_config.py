"""DeepSeek-V2/V3's settings: from config.json (model_type deepseek_v2, deepseek_v3) as
transformers reads them, and from GGUF metadata (architecture deepseek2) as llama.cpp's
converter writes and its loader reads them: MLA sizes, the router, shared experts and the
first dense layers.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace

from poot.checked import MISSING, Values
from poot.errors import CheckpointError, ConfigError
from poot.models.deepseek import Mla, Routing
from poot.models.shapes import LIMITS

#: keys only DeepSeek configs hold (refused in any other family's); the last five change
#: nothing at inference (expert parallelism, auxiliary losses, the multi-token-prediction
#: layers that greedy decoding does not run)
KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
        "n_routed_experts", "n_shared_experts", "routed_scaling_factor", "n_group",
        "topk_group", "first_k_dense_replace", "moe_layer_freq", "topk_method",
        "scoring_func", "rope_interleave", "qk_head_dim",
        "ep_size", "aux_loss_alpha", "seq_aux", "num_nextn_predict_layers")
#: the router each model type's topk_method names
_METHODS = {"deepseek_v3": {"noaux_tc": "sigmoid"},
            "deepseek_v2": {"greedy": "softmax", "group_limited_greedy": "softmax"}}


def _mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def deepseek_config(config, cfg: dict, v: Values, where: str, model_type: str):
    """`config` (read as the shared decoder) with DeepSeek's attention, router and layers."""
    def refuse(name, why):
        raise CheckpointError(f"{where}: config.json {name} = {cfg.get(name)!r}: {why}")

    def size(name, limit, default=None, lo=1):
        return v.integer(name, default, lo=lo, hi=LIMITS[limit])

    if not v.flag("rope_interleave", True):
        refuse("rope_interleave", "poot runs DeepSeek's interleaved RoPE layout only")
    if v.integer("moe_layer_freq", 1, lo=1) != 1:
        refuse("moe_layer_freq", "poot runs configs where every layer after "
                                 "first_k_dense_replace has experts")
    mla = Mla(q_rank=size("q_lora_rank", "dim", 0, lo=0) or 0,
              kv_rank=size("kv_lora_rank", "dim"), nope=size("qk_nope_head_dim", "head_dim"),
              rope=size("qk_rope_head_dim", "head_dim"), v_dim=size("v_head_dim", "head_dim"))
    if mla.rope % 2:
        refuse("qk_rope_head_dim", "must be even")
    # transformers 4.x saves head_dim = qk_rope_head_dim; qk_head_dim = nope + rope
    for name, want in (("head_dim", mla.rope), ("qk_head_dim", mla.nope + mla.rope)):
        if cfg.get(name) is not None and cfg[name] != want:
            refuse(name, f"contradicts the MLA sizes (it must be {want})")
    if config.kv_heads != config.heads:
        refuse("num_key_value_heads", f"MLA has one key per head: it must equal "
                                      f"num_attention_heads = {config.heads}")
    method = v.text("topk_method", "noaux_tc" if model_type == "deepseek_v3" else "greedy")
    scoring = _METHODS[model_type].get(method)
    if scoring is None:
        refuse("topk_method", f"poot runs {model_type} with "
                              f"{' or '.join(_METHODS[model_type])}")
    if v.text("scoring_func", scoring) != scoring:
        refuse("scoring_func", f"{model_type} with topk_method {method!r} scores by {scoring}")
    experts = size("n_routed_experts", "experts")
    groups = size("n_group", "experts", 1)
    used_groups = size("topk_group", "experts", groups)
    if method == "greedy":
        groups = used_groups = 1
    if experts % groups or used_groups > groups:
        refuse("n_group", f"{experts} experts in {groups} groups, {used_groups} kept")
    top = size("num_experts_per_tok", "experts")
    if top > experts or (scoring == "sigmoid" and 2 > experts // groups):
        refuse("num_experts_per_tok", "more experts than there are (or groups of fewer than 2)")
    routing = Routing(scoring=scoring, groups=groups, groups_used=used_groups,
                      group_score="top2" if scoring == "sigmoid" else "max",
                      scale=v.number("routed_scaling_factor", 1.0, positive=True),
                      bias=scoring == "sigmoid")
    moe_ffn = size("moe_intermediate_size", "ffn")
    dense = size("first_k_dense_replace", "layers", 0, lo=0)
    # the softmax scale: 1/sqrt(q/k head dims), times (V3) YaRN's mscale(mscale_all_dim)
    # squared
    scale = (mla.nope + mla.rope) ** -0.5
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if model_type == "deepseek_v2":
        # transformers' V2 neither renormalizes the top-k weights nor scales the softmax by
        # mscale_all_dim, where DeepSeek's own V2 code did: refused rather than guessed
        for name, value in (("norm_topk_prob", cfg.get("norm_topk_prob")),
                            ("mscale_all_dim", rs.get("mscale_all_dim"))):
            if value:
                refuse(name, "DeepSeek's V2 code and transformers' disagree on it; poot "
                             "runs deepseek_v2 without it")
    if config.rope_scaling.kind != "none" and rs.get("mscale_all_dim"):
        scale *= _mscale(rs.get("factor", config.rope_scaling.factor),
                         float(rs["mscale_all_dim"])) ** 2
    return replace(config, head_dim=mla.nope + mla.rope, rope_dim=mla.rope, mla=mla,
                   routing=routing, attn_scale=scale, experts=experts, experts_used=top,
                   expert_ffn=moe_ffn, dense_layers=min(dense, config.layers),
                   norm_topk=model_type == "deepseek_v3" and v.flag("norm_topk_prob", True),
                   shared_ffn=moe_ffn * size("n_shared_experts", "experts", 0, lo=0))


def without_mtp(tensors: dict, cfg: dict, layers: int) -> dict:
    """The tensors less the multi-token-prediction layers DeepSeek-V3 checkpoints append
    after the decoder (num_nextn_predict_layers of them, numbered from num_hidden_layers):
    greedy decoding does not run them, so they are neither checked nor read."""
    extra = cfg.get("num_nextn_predict_layers") or 0
    if not isinstance(extra, int) or extra <= 0:
        return tensors

    def mtp(name):
        m = re.match(r"model\.layers\.(\d+)\.", name)
        return m is not None and layers <= int(m.group(1)) < layers + extra

    return {n: t for n, t in tensors.items() if not mtp(n)}


# -- GGUF (llama.cpp's deepseek2) --------------------------------------------------------
#: `deepseek2.*` keys read by from_gguf beyond the shared decoder's (nextn_predict_layers:
#: the MTP layers, which llama.cpp's converter leaves out of deepseek2 files)
GGUF_KEYS = {"attention.q_lora_rank", "attention.kv_lora_rank", "attention.key_length_mla",
             "attention.value_length_mla", "expert_shared_count", "expert_weights_scale",
             "expert_gating_func", "expert_group_count", "expert_group_used_count",
             "leading_dense_block_count", "nextn_predict_layers"}
#: llama.cpp's expert_gating_func values (absent: softmax, as llama.cpp reads DeepSeek-V2
#: files written before the key existed)
_GATING = {1: "softmax", 2: "sigmoid"}


def from_gguf(config, v: Values, arch: str, tensors: dict):
    """`config` (the shared decoder's reading of the file) with DeepSeek's attention, router
    and layers read as llama.cpp reads a deepseek2 file.

    Two layouts of the attention exist: files from converters since MLA's absorption name
    attention.key_length_mla / value_length_mla (the per-head q/k and v dims), one KV head,
    key_length = kv_lora_rank + rope and value_length = kv_lora_rank (the latent cache's
    rows), and store kv_b split per head as attn_k_b [H, kv_rank, nope] (transposed) and
    attn_v_b [H, v, kv_rank]; older ones name the per-head dims key_length / value_length,
    as many KV heads as heads, and keep attn_kv_b whole. RoPE pairs stay adjacent as in
    the HF checkpoints (llama.cpp's NORM rope mode)."""
    def key(name):
        return f"{arch}.{name}"

    def size(name, limit, default=MISSING, lo=1):
        return v.integer(key(name), default, lo=lo, hi=LIMITS[limit])

    def refuse(name, why):
        v.fail(key(name), v.values.get(key(name)), why)

    rope = size("rope.dimension_count", "head_dim")
    kv_rank = size("attention.kv_lora_rank", "dim")
    heads = config.heads
    split = v.has(key("attention.key_length_mla"))
    k_len, v_len = size("attention.key_length", "head_dim"), size("attention.value_length",
                                                                  "head_dim")
    kv_heads = size("attention.head_count_kv", "kv_heads", heads)
    if split:
        for name, have, want in (("attention.key_length", k_len, kv_rank + rope),
                                 ("attention.value_length", v_len, kv_rank),
                                 ("attention.head_count_kv", kv_heads, 1)):
            if have != want:
                refuse(name, f"contradicts MLA's latent cache (kv_lora_rank {kv_rank} + "
                             f"rope {rope}, one KV head): it must be {want}")
        k_len = size("attention.key_length_mla", "head_dim")
        v_len = size("attention.value_length_mla", "head_dim")
    elif kv_heads != heads:
        refuse("attention.head_count_kv", f"contradicts a file without attention."
                                          f"key_length_mla (one key per head): it must be "
                                          f"{heads}")
    if k_len <= rope or rope % 2:
        refuse("rope.dimension_count", f"must be even and below the q/k head dim {k_len}")
    mla = Mla(q_rank=size("attention.q_lora_rank", "dim", 0, lo=0), kv_rank=kv_rank,
              nope=k_len - rope, rope=rope, v_dim=v_len, split_kv_b=split)
    experts = size("expert_count", "experts")
    dense = size("leading_dense_block_count", "layers", 0, lo=0)
    gating = v.integer(key("expert_gating_func"), 1, lo=0)
    if gating not in _GATING:
        refuse("expert_gating_func", "is neither softmax (1) nor sigmoid (2), the routers "
                                     "poot runs for deepseek2")
    scoring = _GATING[gating]
    groups = size("expert_group_count", "experts", 1)
    used_groups = size("expert_group_used_count", "experts", groups)
    if experts % groups or used_groups > groups:
        refuse("expert_group_count", f"does not split {experts} experts into equal groups "
                                     f"of which {used_groups} are kept")
    top = size("expert_used_count", "experts")
    if top > experts or (scoring == "sigmoid" and used_groups < groups
                         and 2 > experts // groups):
        refuse("expert_used_count", "exceeds the experts (or their groups hold fewer than "
                                    "2)")
    first_moe = f"blk.{dense}."
    routing = Routing(scoring=scoring, groups=groups, groups_used=used_groups,
                      group_score="top2" if scoring == "sigmoid" else "max",
                      scale=v.number(key("expert_weights_scale"), 1.0, positive=True),
                      bias=first_moe + "exp_probs_b.bias" in tensors)
    expert_ffn = size("expert_feed_forward_length", "ffn")
    scaling, scale = config.rope_scaling, (mla.nope + mla.rope) ** -0.5
    log_mul = v.number(key("rope.scaling.yarn_log_multiplier"), 0.0, lo=0.0)
    if scaling.kind == "yarn":
        if not log_mul:
            name = key("rope.scaling.yarn_log_multiplier")
            raise ConfigError(f"{v.file} lacks {name!r}: deepseek2 YaRN scaling needs it "
                              f"(0.1 x mscale_all_dim)", file=v.file, key=name)
        # llama.cpp's reading: the converter wrote 0.1 x mscale_all_dim and mscale equals
        # it, so cos/sin keep their size and the scores take mscale(mscale_all_dim)^2
        scale *= _mscale(scaling.factor, log_mul / 0.1) ** 2
        scaling = replace(scaling, attention_factor=1.0)
    elif log_mul:
        refuse("rope.scaling.yarn_log_multiplier", "is read with YaRN scaling only")
    return replace(config, head_dim=mla.nope + mla.rope, rope_dim=mla.rope,
                   kv_heads=heads, mla=mla, routing=routing, attn_scale=scale,
                   rope_scaling=scaling, experts=experts, experts_used=top,
                   expert_ffn=expert_ffn, dense_layers=min(dense, config.layers),
                   norm_topk=v.flag(key("expert_weights_norm"), False),
                   shared_ffn=expert_ffn * size("expert_shared_count", "experts", 0, lo=0))


def gguf_tensor_shapes(c) -> dict[str, tuple[int, ...]]:
    """Every tensor a deepseek2 GGUF file must hold for `c`, with its shape (GGUF names,
    numpy order)."""
    m, h, d = c.mla, c.heads, c.dim
    out = {"token_embd.weight": (c.vocab, d), "output_norm.weight": (d,)}
    if not c.tied:
        out["output.weight"] = (c.vocab, d)
    for i in range(c.layers):
        p = f"blk.{i}."
        layer = {"attn_norm.weight": (d,), "ffn_norm.weight": (d,),
                 "attn_kv_a_mqa.weight": (m.latent, d), "attn_kv_a_norm.weight": (m.kv_rank,),
                 "attn_output.weight": (d, h * m.v_dim)}
        if m.q_rank:
            layer.update({"attn_q_a.weight": (m.q_rank, d),
                          "attn_q_a_norm.weight": (m.q_rank,),
                          "attn_q_b.weight": (h * c.head_dim, m.q_rank)})
        else:
            layer["attn_q.weight"] = (h * c.head_dim, d)
        if m.split_kv_b:
            layer.update({"attn_k_b.weight": (h, m.kv_rank, m.nope),
                          "attn_v_b.weight": (h, m.v_dim, m.kv_rank)})
        else:
            layer["attn_kv_b.weight"] = (h * (m.nope + m.v_dim), m.kv_rank)
        if i < c.dense_layers:
            layer.update({"ffn_gate.weight": (c.ffn, d), "ffn_up.weight": (c.ffn, d),
                          "ffn_down.weight": (d, c.ffn)})
        else:
            e, f = c.experts, c.expert_ffn
            layer.update({"ffn_gate_inp.weight": (e, d), "ffn_gate_exps.weight": (e, f, d),
                          "ffn_up_exps.weight": (e, f, d), "ffn_down_exps.weight": (e, d, f)})
            if c.routing.bias:
                layer["exp_probs_b.bias"] = (e,)
            if c.shared_ffn:
                layer.update({"ffn_gate_shexp.weight": (c.shared_ffn, d),
                              "ffn_up_shexp.weight": (c.shared_ffn, d),
                              "ffn_down_shexp.weight": (d, c.shared_ffn)})
        out.update({p + n: s for n, s in layer.items()})
    return out


def check_gguf_tensors(c, tensors: dict, where: str) -> None:
    """Every tensor the builder reads is in the file with the shape the metadata implies.
    A layer's gate and up expert stacks may be one (llama.cpp's --fuse-gate-up-exps:
    ffn_gate_up_exps [E, 2I, H], each expert's gate rows, then its up rows)."""
    shapes = gguf_tensor_shapes(c)
    for gate in [n for n in shapes if n.endswith(".ffn_gate_exps.weight")]:
        fused = gate.replace("ffn_gate_exps", "ffn_gate_up_exps")
        if fused in tensors:
            e, f, d = shapes.pop(gate)
            del shapes[gate.replace("ffn_gate_exps", "ffn_up_exps")]
            shapes[fused] = (e, 2 * f, d)
    for name, want in shapes.items():
        info = tensors.get(name)
        if info is None:
            raise ConfigError(f"{where}: deepseek2 file lacks tensor {name!r} (a "
                              f"{c.layers}-layer model, {c.dense_layers} dense, per its "
                              f"metadata)", file=where, key=name)
        have = tuple(int(x) for x in info.shape)
        if have != want:
            raise ConfigError(f"{where}: tensor {name!r} is {list(have)}, but the deepseek2 "
                              f"metadata implies {list(want)}", file=where, key=name,
                              value=have)
