"""DeepSeek-V2/V3: multi-head latent attention (MLA) and the group-limited expert router.

MLA compresses each token's keys and values into a latent c_kv [kv_rank] (normed) plus one
RoPE key k_pe [rope] shared by every head; the cache holds only those (one KV "head" of
kv_rank + rope values per position), not per-head keys and values. The up-projection
kv_b ([H, nope + v, kv_rank] per head) is absorbed instead of applied to the cache:

    score_h(i, j) = q_nope_h(i) . (W_UK_h c_kv(j)) + q_pe_h(i) . k_pe(j)
                  = (W_UK_h^T q_nope_h(i)) . c_kv(j) + q_pe_h(i) . k_pe(j)
    out_h(i)      = W_UV_h sum_j p_h(i, j) c_kv(j)

so attention runs as MQA over the latent rows [c_kv | k_pe] with keys of kv_rank + rope
dims and values of kv_rank dims (the Attention composite takes Dv != D), then W_UV maps
each head's result to its v dims. Prefill and decode share this one form; the latent rows
live in a dense cache of one sequence or a pool shared by a batch (paged, as poot serve
runs), in any KV dtype.

RoPE: the checkpoints store q_pe and k_pe with each rotated pair adjacent; the graph
reorders them to rotate-half order (even dims, then odd) before the shared rotation, as
transformers does.

Router (V3): sigmoid scores; a per-expert bias added for choosing only; experts in
`groups` groups of which each token keeps the `groups_used` with the largest sum of their
two best biased scores; top-k among those; weights are the unbiased scores of the chosen,
renormalized where norm_topk, times `scale`. V2: softmax scores, groups ranked by their
best score, no bias.
"""
from __future__ import annotations

from dataclasses import dataclass

from poot import ops
from poot.dtypes import DType


@dataclass(frozen=True)
class Mla:
    """Multi-head latent attention's sizes (per head: nope + rope query/key dims, v dims)."""

    q_rank: int            # 0: q straight from the hidden state (q_proj), else q_a -> q_b
    kv_rank: int
    nope: int
    rope: int
    v_dim: int
    #: kv_b stored split per head (GGUF since llama.cpp's absorbed MLA: attn_k_b
    #: [H, kv_rank, nope], attn_v_b [H, v, kv_rank]) rather than whole (attn_kv_b)
    split_kv_b: bool = False

    @property
    def latent(self) -> int:
        """Values per position in the cache: the normed latent and the RoPE key."""
        return self.kv_rank + self.rope


@dataclass(frozen=True)
class Routing:
    """DeepSeek's router (see the module doc)."""

    scoring: str = "sigmoid"         # "sigmoid" (V3) | "softmax" (V2)
    groups: int = 1
    groups_used: int = 1
    group_score: str = "top2"        # "top2": sum of the two best (V3) | "max" (V2)
    scale: float = 1.0               # routed_scaling_factor
    bias: bool = True                # e_score_correction_bias for choosing (V3)


def describe(c) -> list[str]:
    """`poot info`'s lines for a DeepSeek config."""
    m, r = c.mla, c.routing
    q = f"q through a rank-{m.q_rank} latent" if m.q_rank else "q projected directly"
    groups = (f", {r.groups_used} of {r.groups} groups kept" if r.groups_used < r.groups
              else "")
    return [f"latent       MLA: cache of {m.kv_rank} latent + {m.rope} RoPE values per position "
            f"(absorbed up-projections); heads nope {m.nope} + rope {m.rope}, v {m.v_dim}; {q}; "
            f"softmax scale {c.attn_scale:.4g}",
            f"experts      {c.experts} of hidden size {c.expert_ffn}, top {c.experts_used} per "
            f"token by {r.scoring} scores{' with a choice bias' if r.bias else ''}{groups}, "
            f"weights {'renormalized, ' if c.norm_topk else ''}times {r.scale:g}; shared "
            f"experts {c.shared_ffn} (no gate); first {c.dense_layers} layers dense"]


def _f32(w):
    """A declared weight as f32 values (dense cast, or packed dequantized)."""
    if isinstance(w, ops.PackedTensor):
        return w.dequant()
    return w if w.dtype is DType.F32 else ops.cast(w, DType.F32)


def _half_order(x):
    """Adjacent (even, odd) pairs of the last axis to rotate-half order: evens, then odds."""
    *lead, d = x.shape
    pairs = ops.reshape(x, (*lead, d // 2, 2))
    perm = tuple(range(len(lead))) + (len(lead) + 1, len(lead))
    return ops.reshape(ops.transpose(pairs, perm), (*lead, d))


@dataclass(frozen=True)
class LatentCache:
    """Where a step's latent rows go: a dense cache of one sequence (written at `pos`), or
    a pool shared by the batch (written through `write_map`, read through `slot_map`)."""

    kv: str                 # "dense" | "paged"
    batch: int
    tokens: int
    rows: int               # dense: max_seq; paged: pool slots
    pos: object = None      # dense: Pos [1]
    write_map: object = None
    slot_map: object = None


def _cache_rows(m: Mla, rows, p: str, cache: LatentCache, kv_dtype: str):
    """Write rows [B*T, latent] into the layer's State and read back every sequence's
    cache [B, 1, S, latent] (one KV head)."""
    if cache.kv == "dense":
        state = ops.kv_state((1, cache.rows, m.latent), kv_dtype, p + "kv_latent")
        new = ops.reshape(rows, (1, cache.tokens, m.latent))
        written = [ops.kv_write_dense(st, y, cache.pos)
                   for st, y in zip(state, ops.kv_encode(new, kv_dtype), strict=True)]
        read = [ops.reshape(y, (1,) + y.shape) for y in written]       # [1, 1, S, latent]
    else:
        state = ops.kv_state((cache.rows, 1, m.latent), kv_dtype, p + "kv_latent_pool")
        new = ops.reshape(rows, (rows.shape[0], 1, m.latent))
        written = [ops.kv_write_paged(st, y, cache.write_map)
                   for st, y in zip(state, ops.kv_encode(new, kv_dtype), strict=True)]
        read = [ops.transpose(ops.gather(y, cache.slot_map, 0), (0, 2, 1, 3))
                for y in written]                                      # [B, 1, S, latent]
    for st, nxt in zip(state, written, strict=True):
        ops.state_update(st, nxt)
    return ops.kv_decode(read, kv_dtype)


def mla_attention(c, h, p: str, declare, linear, cos, sin, qpos, mask, scale: float,
                  cache: LatentCache, kv_dtype: str = "f32"):
    """One layer's attention output [B*T, dim] of the normed h [B*T, dim]: writes this
    step's latent rows into the layer's State and attends over the cache as it then is.
    qpos: each token's position [B, T]; mask: the additive causal mask ([T, S] dense, the
    grouped [B, 1, 1, T, S] paged)."""
    m, heads = c.mla, c.heads
    b, t, n = cache.batch, cache.tokens, h.shape[0]
    dn, dr, dv, r = m.nope, m.rope, m.v_dim, m.kv_rank

    def norm(x, name):
        return ops.rms_norm(x, declare(name), c.norm_eps)

    def rope(x):                                    # x [N, k, dr] -> rotated, half order
        k = x.shape[1]
        y = ops.reshape(_half_order(x), (b, t, k, dr))
        return ops.reshape(ops.rope_partial(y, cos, sin, qpos, dr, tokens_first=True),
                           (n, k, dr))

    if m.q_rank:
        q = linear(norm(linear(h, p + "attn_q_a.weight"), p + "attn_q_a_norm.weight"),
                   p + "attn_q_b.weight")
    else:
        q = linear(h, p + "attn_q.weight")
    q = ops.reshape(q, (n, heads, dn + dr))
    q_nope, q_pe = ops.slice_axis(q, 2, 0, dn), rope(ops.slice_axis(q, 2, dn, dn + dr))
    kv = linear(h, p + "attn_kv_a_mqa.weight")                         # [N, r + dr]
    c_kv = norm(ops.slice_axis(kv, 1, 0, r), p + "attn_kv_a_norm.weight")
    k_pe = rope(ops.reshape(ops.slice_axis(kv, 1, r, r + dr), (n, 1, dr)))
    latent = _cache_rows(m, ops.concat([c_kv, ops.reshape(k_pe, (n, dr))], 1), p, cache,
                         kv_dtype)                                     # [B, 1, S, r + dr]
    w_uk, w_uv = _up_projections(m, heads, p, declare)
    q_lat = ops.matmul(ops.transpose(q_nope, (1, 0, 2)), w_uk)         # [H, N, r]
    qh = ops.concat([q_lat, ops.transpose(q_pe, (1, 0, 2))], 2)        # [H, N, r + dr]
    qh = ops.transpose(ops.reshape(qh, (heads, b, t, m.latent)), (1, 0, 2, 3))
    if cache.kv == "dense":     # one sequence: [H, T, .] against [1, S, .], mask [T, S]
        qh, latent = ops.reshape(qh, (heads, t, m.latent)), ops.reshape(
            latent, latent.shape[1:])
    o = ops.attention_masked(qh, latent, ops.slice_axis(latent, -1, 0, r), mask, scale)
    o = ops.reshape(ops.transpose(ops.reshape(o, (b, heads, t, r)), (1, 0, 2, 3)),
                    (heads, n, r))
    o = ops.matmul(o, ops.transpose(w_uv, (0, 2, 1)))                  # [H, N, dv]
    o = ops.reshape(ops.transpose(o, (1, 0, 2)), (n, heads * dv))
    return linear(o, p + "attn_output.weight")


def _up_projections(m: Mla, heads: int, p: str, declare):
    """The per-head up-projections of the latent: keys' W_UK [H, nope, kv_rank] and
    values' W_UV [H, v, kv_rank], from kv_b whole or split."""
    dn, dv, r = m.nope, m.v_dim, m.kv_rank
    if m.split_kv_b:
        k_b = ops.reshape(_f32(declare(p + "attn_k_b.weight")), (heads, r, dn))
        return (ops.transpose(k_b, (0, 2, 1)),
                ops.reshape(_f32(declare(p + "attn_v_b.weight")), (heads, dv, r)))
    wkv = ops.reshape(_f32(declare(p + "attn_kv_b.weight")), (heads, dn + dv, r))
    return ops.slice_axis(wkv, 1, 0, dn), ops.slice_axis(wkv, 1, dn, dn + dv)


def route(r: Routing, logits, bias, k: int, norm_topk: bool):
    """(expert ids [N, k] I32, weights [N, k]) of the router logits [N, E]; `bias` [E]
    (or None) shifts the scores for choosing only."""
    n, e = logits.shape
    if r.scoring == "sigmoid":
        scores = ops.div(1.0, ops.add(ops.exp(ops.neg(logits)), 1.0))
    else:
        scores = ops.softmax(logits, -1)
    choice = scores if bias is None else ops.add(scores, ops.reshape(_f32(bias), (1, e)))
    if r.groups_used < r.groups:
        g, per = r.groups, e // r.groups
        grouped = ops.reshape(choice, (n * g, per))
        if r.group_score == "top2":
            best = _picked(grouped, ops.argtopk(grouped, 2))
            group_scores = ops.reduce_sum(best, -1)
        else:
            group_scores = ops.reduce_max(grouped, -1)
        kept = ops.reshape(ops.argtopk(ops.reshape(group_scores, (n, g)), r.groups_used),
                           (n, r.groups_used, 1))
        which = ops.iota((1, 1, g), 2)
        hit = ops.select(ops.mul(ops.ge(kept, which), ops.ge(which, kept)), 1.0, 0.0,
                         dtype=DType.F32)
        keep = ops.reduce_sum(hit, 1)                                  # [N, G]: 1 kept, 0 not
        keep = ops.broadcast_to(ops.reshape(keep, (n, g, 1)), (n, g, per))
        # dropped groups' experts score 0 (not -inf) when choosing, as DeepSeek masks them
        choice = ops.mul(choice, ops.reshape(keep, (n, e)))
    ids = ops.argtopk(choice, k)
    weights = _picked(scores, ids)
    if norm_topk:
        weights = ops.div(weights, ops.add(ops.reduce_sum(weights, -1, keepdim=True), 1e-20))
    return ids, ops.mul(weights, r.scale)


def _picked(x, ids):
    """x [N, E] at each row's ids [N, k]."""
    n, e = x.shape
    rows = ops.mul(ops.iota((n, 1), 0), e)
    return ops.gather(ops.reshape(x, (n * e,)), ops.add(ids, rows), 0)
