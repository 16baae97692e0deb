"""DeepSeek-V2/V3's config.json settings (model_type deepseek_v2, deepseek_v3): MLA sizes,
the router, shared experts and the first dense layers, as transformers reads them.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace

from poot.checked import Values
from poot.errors import CheckpointError
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
