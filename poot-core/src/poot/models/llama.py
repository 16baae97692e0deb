"""The decoder every supported family shares, traced through poot.ops.

Llama 2/3, Mistral, Qwen2 (q/k/v bias), Qwen3 (q/k norms), Gemma 3 (q/k norms, four norms
per layer, GeGLU, scaled embeddings, sliding-window layers), SmolLM: one pre-norm decoder
block whose differences are the traits of `LlamaConfig` (see poot.models.config for which
family sets which).

`build_decoder(config, weights, ...)` records one step of the decoder as a
Graph of primitives: the token embedding, per layer RMSNorm, q/k/v projections,
RoPE (rotate-half), KV write (dense: DynamicUpdateSlice at Pos; paged:
ScatterUpdate through a WriteMap), masked GQA attention built from Pos and an
Iota, the output projection and residual, the gated MLP, the final norm and
the LM head. compile then finds the fused kernels in it.

Sliding-window layers with a dense cache keep a ring of the last `window` positions
(ScatterUpdate at pos mod window): a step attends to the ring as it was plus its own new
keys, masked by each key's position, then writes its keys into the ring. So a sliding
layer's cache never holds more than the window, however long the sequence.

Weights come from a `WeightSource` (a checkpoint loader, or `random_weights`
for tests): dense ones become Consts with their WeightRef, packed ones stay
packed (PackedDequant feeding the projections). Tensor names are GGUF's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from poot import ops
from poot.dtypes import DType
from poot.errors import CheckpointError
from poot.formats import PackedWeight
from poot.ir.graph import Graph
from poot.ir.types import SlotKind, TensorType, WeightRef
from poot.models import mrope
from poot.models.deepseek import LatentCache, Mla, Routing, mla_attention, route
from poot.models.gpt_oss import gpt_oss_experts
from poot.models.hosted_rows import embed_rows, span_mask, span_mask_ring, span_slot
from poot.models.rope import RopeScaling
from poot.models.sample_graph import sample_tokens
from poot.models.weights import (
    DenseSpec,
    PackedSpec,
    RowLayout,
    WeightSource,
    frozen_stack,
    stacked,
)


@dataclass(frozen=True)
class LlamaConfig:
    """The decoder's shape and its family's traits (defaults: Llama)."""

    vocab: int
    dim: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()  # of the global (non-sliding) layers
    rope_dim: int | None = None      # partial rotary (None: the whole head)
    #: "pairs": q/k rows stored as adjacent (even, odd) pairs, as GGUF llama checkpoints
    #: hold them (the converter permutes HF rows; build_decoder reorders them once, through
    #: poot.models.weights.RowLayout); "half": HF's rotate-half order
    rope_layout: str = "half"
    tied: bool = True
    qkv_bias: bool = False
    max_seq: int = 2048              # KV capacity per sequence
    arch: str = "llama"
    qk_norm: bool = False            # per-head RMSNorm of q and k before RoPE
    sandwich_norms: bool = False     # also RMSNorm the attention and FFN outputs (Gemma 3)
    act: str = "silu"                # FFN gate: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    embed_scale: float = 1.0         # embeddings multiplied by this (Gemma: sqrt(dim))
    attn_scale: float | None = None  # scores' scale (None: 1/sqrt(head_dim))
    window: int | None = None        # span of the sliding-window layers
    sliding: tuple[bool, ...] = ()   # per layer: attends within `window` (empty: none does)
    rope_base_local: float | None = None  # RoPE base of the sliding layers (None: rope_base)
    experts: int = 0                 # mixture of experts: experts per layer (0: dense FFN)
    experts_used: int = 0            # experts each token is routed to (top-k)
    expert_ffn: int = 0              # each expert's hidden size
    norm_topk: bool = True           # renormalize the top-k probabilities (Mixtral, Qwen3)
    shared_ffn: int = 0              # a shared expert under a sigmoid gate (Qwen2-MoE)
    #: gpt-oss: a learned logit per head in each attention softmax's denominator
    attn_sinks: bool = False
    out_bias: bool = False           # the attention output projection has a bias (gpt-oss)
    #: gpt-oss experts (poot.models.gpt_oss): router and expert biases, gate|up fused and
    #: interleaved, and the SwiGLU clamped at this limit (None: the plain gated MLP)
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.702      # gpt-oss: the sigmoid's gain in that SwiGLU
    #: DeepSeek (poot.models.deepseek): multi-head latent attention, whose cache holds the
    #: latent (head_dim is then nope + rope, rope_dim the rope part); its router; and the
    #: count of first layers with a dense FFN (of size ffn) before the expert layers
    mla: Mla | None = None
    routing: Routing | None = None
    dense_layers: int = 0
    #: M-RoPE (poot.models.mrope, Qwen2.5-VL): rotary pairs per temporal, height and width
    #: section; None: one position per token
    mrope: tuple[int, int, int] | None = None

    @property
    def kv_row(self) -> int:
        """Values a KV cache row holds: a head's (or MLA's latent and RoPE key)."""
        return self.mla.latent if self.mla is not None else self.head_dim

    @property
    def rot(self) -> int:
        return self.rope_dim or self.head_dim

    def is_sliding(self, layer: int) -> bool:
        return bool(self.sliding) and self.sliding[layer]

    @property
    def ring(self) -> int:
        """Positions a sliding layer's dense cache holds."""
        return min(self.window or self.max_seq, self.max_seq)


@dataclass
class Step:
    """A traced decoder step and how to feed it."""

    graph: Graph
    config: LlamaConfig
    mode: str                       # "decode" | "prefill"
    kv: str                         # "dense" | "paged"
    batch: int                      # sequences per step
    tokens: int                     # tokens per sequence in this step
    logits: str                     # "all" | "last" | "rows" | "hidden"
    #: host arrays the step binds beyond the source's `arrays`: rope tables, and q/k rows
    #: reordered from a "pairs" source (poot.models.weights.RowLayout)
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    #: None: the result is logits; "argmax" or "full": token ids (sampled in the graph)
    sample: str | None = None


def _rows(w, start: int, end: int):
    """Rows start..end of a declared weight (a dense const or a PackedTensor)."""
    if isinstance(w, ops.PackedTensor):
        return w.rows(start, end)
    return ops.slice_axis(w, 0, start, end)


def _declare(weights: WeightSource, name: str, seen: dict):
    """One binder per checkpoint tensor, however often the model reads it (tied heads)."""
    if name in seen:
        return seen[name]
    s = weights.spec(name)
    if isinstance(s, PackedSpec):
        seen[name] = ops.packed_const(s.weight, s.refs)
    else:
        seen[name] = ops.const(s.type.shape, s.type.dtype, s.ref)
    return seen[name]


def build_decoder(config: LlamaConfig, weights: WeightSource, *, tokens: int = 1,
                  batch: int = 1, kv: str = "dense", logits: str = "all",
                  pool_slots: int | None = None, lora=None, expert_pool=None,
                  sample: str | None = None, hosted_rows: bool = False, spans: bool = False,
                  stack_qkv: bool = True, stack_ffn: bool = True, kv_dtype: str = "f32") -> Step:
    """Trace one decoder step for `batch` sequences of `tokens` tokens each.

    dense KV: batch must be 1; State k/v per layer [Hkv, max_seq, D] (a sliding layer's
    ring: [ring, Hkv, D]); slots `tokens` (Token [T]) and `pos` (Pos [1], the first
    position); with sliding layers also `end` (Pos [1]: one past the last real token, so
    the padding of a short chunk never overwrites a live ring slot).
    paged KV: a pool per layer [pool_slots, Hkv, D] shared by all sequences;
    slots `tokens` [B, T], `pos` [B, 1], `write_map` (WriteMap [B*T]: pool slot of
    each new token, -1 for padding) and `slot_map` (SlotMap [B, max_seq]: the pool
    slot of each position of each sequence).
    `lora` (poot.models.lora.Adapters) adds slot `adapter` [B] and each row's low-rank
    update to the projections it adapts; `expert_pool` (poot.models.expert_pool.ExpertPool)
    reads the experts from its pool through slot `expert_map`.
    sample ("argmax" or "full", decode steps only): the step draws each sequence's next
    token itself (poot.models.sample_graph) and its result is the token ids [B] I32;
    "argmax" also takes a wider step with logits "all", whose result is every token's
    argmax [B*T] (a greedy verification of proposed tokens).
    hosted_rows: the step takes embedding rows from the host for chosen positions
    (poot.models.hosted_rows: slots `hosted.rows` [B*T, dim] and `hosted.use` [B*T]).
    spans (dense KV): slot `hosted.span` [T]; tokens of one span also see each other
    both ways (an image's soft tokens in Gemma 3), every layer.
    logits: "all" gives every token's logits [B*T, vocab]; "last" each sequence's at
    position T-1 [B, vocab]; "rows" (T > 1) each sequence's at its last real token, whose
    row of the step (0..B*T-1) the host writes into slot `last` (Pos [B]): a chunk padded
    past its prompt's end runs the head on one row per sequence, not on all B*T; "hidden"
    every token's final hidden state (after the output norm) [B*T, dim], without the head.
    stack_qkv: the q, k and v projections read one weight stacked by rows
    (poot.models.weights.RowLayout) where the checkpoint's three agree in format: a step
    of one token computes them in one contraction, a wider step each over its rows.
    stack_ffn: the same for the FFN's gate and up projections.
    kv_dtype: how the caches hold keys and values, "f32", "f16" or "q8_0" (poot.ops.kv_state;
    docs/ir.md section 15); a step attends over the stored rows, its own included.
    """
    c = config
    tables = _rope_tables(c, weights)
    consts: dict[str, np.ndarray] = {}
    # q/k weight rows reordered once (not q/k every step) where the source pairs them, and
    # the q, k and v projections stacked by rows
    weights = RowLayout(weights, c.head_dim if c.rope_layout == "pairs" else None)
    consts = weights.arrays
    if kv not in ("dense", "paged"):
        raise ValueError(f"kv must be 'dense' or 'paged', not {kv!r}")
    if kv == "dense" and batch != 1:
        raise ValueError("a dense KV cache holds one sequence; use kv='paged' for batches")
    if spans and kv != "dense":
        raise ValueError("spans (tokens that see each other both ways) take a dense KV cache")
    if c.act not in ("silu", "gelu_tanh"):
        raise ValueError(f"unknown FFN activation {c.act!r}")
    check_kv_dtype(kv_dtype, c.kv_row)
    if c.mla is not None and spans:
        raise CheckpointError(f"{c.arch}: multi-head latent attention takes no spans")
    if logits not in ("all", "last", "rows", "hidden"):
        raise ValueError(f"logits must be 'all', 'last', 'rows' or 'hidden', not {logits!r}")
    if sample is not None and tokens != 1 and (sample, logits) != ("argmax", "all"):
        raise ValueError(f"a step of {tokens} tokens per sequence takes in the graph only "
                         f"the argmax of every row's logits (logits='all'), not {sample!r} "
                         f"samples of {logits!r} logits")
    b, t, n = batch, tokens, batch * tokens
    cap = c.max_seq
    pool = pool_slots or cap * b
    scale = c.attn_scale or 1.0 / math.sqrt(c.head_dim)
    hd, hkv = c.head_dim, c.kv_heads

    def step():
        seen: dict = {}

        def declare(name):
            return _declare(weights, name, seen)

        adapter_rows = lora.rows_of(b, t) if lora is not None else None
        resident = expert_pool.trace() if expert_pool is not None else None

        def linear(x, name, bias=None):
            y = ops.linear(x, declare(name), bias)
            return y if lora is None else lora.update(y, x, name, adapter_rows)

        def stack(names, wanted: bool):
            """The weight stacking `names` by rows, where wanted, the source serves it and
            no adapter updates a part; else None."""
            if not wanted or not weights.has(stacked(names)) or (
                    lora is not None and any(x in lora.stacks for x in names)):
                return None
            return declare(stacked(names))

        if kv == "dense":
            tok = ops.slot(SlotKind.TOKEN, (t,), "tokens", bound=c.vocab)
            pos = ops.slot(SlotKind.POS, (1,), "pos", bound=cap - t + 1)
            rope_pos = ops.positions(pos, t)
            if any(c.sliding):
                end = ops.slot(SlotKind.POS, (1,), "end", bound=cap + 1)
        else:
            tok2 = ops.slot(SlotKind.TOKEN, (b, t), "tokens", bound=c.vocab)
            tok = ops.reshape(tok2, (n,))
            pos = ops.slot(SlotKind.POS, (b, 1), "pos", bound=cap - t + 1)
            wmap = ops.slot(SlotKind.WRITE_MAP, (n,), "write_map", bound=pool)
            smap = ops.slot(SlotKind.SLOT_MAP, (b, cap), "slot_map", bound=pool)
            rope_pos = ops.positions(pos, t)                       # [B, T]
        if c.mrope is not None:
            rope_pos = mrope.shifted(rope_pos, b)
        pos3 = mrope.positions_slot(t, cap) if c.mrope is not None and hosted_rows else None
        rope = {k: ops.const(v.shape, DType.F32, k) for k, v in tables.items()}
        masks = {}
        span = span_slot(t) if spans else None

        def mask_for(sliding):
            if sliding not in masks:
                if kv == "dense" and sliding:
                    masks[sliding] = ops.ring_mask(pos, t, c.ring, c.window)  # [T, ring+T]
                    if span is not None:
                        masks[sliding] = ops.maximum(masks[sliding],
                                                     span_mask_ring(span, c.ring))
                else:
                    m = ops.causal_mask(pos, t, cap, c.window if sliding else None)
                    if span is not None:
                        m = ops.maximum(m, span_mask(span, pos, cap))
                    masks[sliding] = ops.reshape(m, (b, 1, 1, t, cap)) if kv == "paged" else m
            return masks[sliding]

        def norm(x, name):
            return ops.rms_norm(x, declare(name), c.norm_eps)

        heads = (c.heads, hkv, hkv)

        def qkv(h, p):
            """The q, k and v heads [B, T, heads, D] of the normed h: from the stacked
            q|k|v weight where the source serves it and no adapter updates the parts,
            else from each projection's own; and the q|k heads as one view where one
            contraction gives all three (else None)."""
            names, biases = ([f"{p}attn_{x}.{kind}" for x in "qkv"]
                             for kind in ("weight", "bias"))
            w = stack(names, stack_qkv)
            bias = stack(biases, w is not None) if c.qkv_bias else None
            if w is None or (c.qkv_bias and bias is None):
                return [ops.reshape(linear(h, w, declare(bias) if c.qkv_bias else None),
                                    (b, t, nh, hd))
                        for w, bias, nh in zip(names, biases, heads, strict=True)] + [None]
            ends = [hd * sum(heads[:i]) for i in range(4)]
            if n == 1:    # one contraction; q, k and v are its rows (views, not copies)
                y = ops.reshape(ops.linear(h, w, bias), (b, t, sum(heads), hd))
                return [ops.slice_axis(y, 2, s // hd, e // hd)
                        for s, e in zip(ends, ends[1:])] + [ops.slice_axis(y, 2, 0, c.heads + hkv)]
            # one contraction each over its rows of the stacked weight (views)
            return [ops.reshape(ops.linear(h, _rows(w, s, e), None if bias is None else
                                           ops.slice_axis(bias, 0, s, e)), (b, t, nh, hd))
                    for s, e, nh in zip(ends, ends[1:], heads)] + [None]

        x = ops.embedding(declare("token_embd.weight"), tok)   # [N, dim]
        if c.embed_scale != 1.0:
            x = ops.mul(x, c.embed_scale)
        if hosted_rows:
            x = embed_rows(x)
        for i in range(c.layers):
            p = f"blk.{i}."
            sliding = c.is_sliding(i)
            h = norm(x, p + "attn_norm.weight")
            if c.mla is not None:
                latent = LatentCache(kv, b, t, cap, pos) if kv == "dense" else \
                    LatentCache(kv, b, t, pool, write_map=wmap, slot_map=smap)
                o = mla_attention(c, h, p, declare, linear, rope["rope.cos"], rope["rope.sin"],
                                  ops.reshape(rope_pos, (b, t)), mask_for(False), scale,
                                  latent, kv_dtype)
                x = ops.add(x, o)
                x = ops.add(x, _ffn(c, norm(x, p + "ffn_norm.weight"), p, declare,
                                    linear=linear, stack=lambda names: stack(names, stack_ffn),
                                    has=weights.has))
                continue

            q, k, v, qk = qkv(h, p)
            if c.qk_norm:
                q, k = norm(q, p + "attn_q_norm.weight"), norm(k, p + "attn_k_norm.weight")
            local = "rope_local" if sliding and "rope_local.cos" in tables else "rope"
            cos, sin = rope[local + ".cos"], rope[local + ".sin"]
            qpos = rope_pos if kv == "paged" else ops.reshape(rope_pos, (1, t))

            def rotate(y):
                if pos3 is not None:   # an image prompt's tokens: each section its own
                    return mrope.rotate(y, rope, pos3, c.rot)
                return ops.rope_partial(y, cos, sin, qpos, c.rot, tokens_first=True)

            if qk is not None and not c.qk_norm and kv == "dense":
                # q and k are adjacent heads of one result: one rotation (one kernel) for
                # both. Paged steps keep k's own, which RopeScatter writes to the pool.
                qk = rotate(qk)
                q, k = ops.slice_axis(qk, 2, 0, c.heads), ops.slice_axis(qk, 2, c.heads,
                                                                         c.heads + hkv)
            else:
                q, k = rotate(q), rotate(k)
            mask = mask_for(sliding)
            sinks = declare(p + "attn_sinks.weight") if c.attn_sinks else None
            if kv == "dense" and sliding:
                k_new, v_new = ops.reshape(k, (t, hkv, hd)), ops.reshape(v, (t, hkv, hd))
                kr = ops.kv_state((c.ring, hkv, hd), kv_dtype, p + "k_ring")
                vr = ops.kv_state((c.ring, hkv, hd), kv_dtype, p + "v_ring")
                k_new, v_new = ops.kv_encode(k_new, kv_dtype), ops.kv_encode(v_new, kv_dtype)
                # the ring as it was and the new rows, each as the cache holds them, decoded
                # last so attention can read 16-bit rows directly
                ks, vs = (ops.kv_decode([ops.transpose(ops.concat([r, y], 0), (1, 0, 2))
                                         for r, y in zip(ring, new, strict=True)], kv_dtype)
                          for ring, new in ((kr, k_new), (vr, v_new)))   # [Hkv, ring+T, D]
                qh = ops.transpose(ops.reshape(q, (t, c.heads, hd)), (1, 0, 2))
                o = ops.attention_masked(qh, ks, vs, mask, scale, sinks)   # [Hq, T, D]
                o = ops.reshape(ops.transpose(o, (1, 0, 2)), (n, c.heads * hd))
                slots = ops.ring_slots(pos, t, c.ring, end)  # written after the reads above
                for st, rows in zip(kr + vr, k_new + v_new, strict=True):
                    ops.state_update(st, ops.kv_write_paged(st, rows, slots))
            elif kv == "dense":
                kc = ops.kv_state((hkv, cap, hd), kv_dtype, p + "k_cache")
                vc = ops.kv_state((hkv, cap, hd), kv_dtype, p + "v_cache")
                k_new = ops.transpose(ops.reshape(k, (t, hkv, hd)), (1, 0, 2))
                v_new = ops.transpose(ops.reshape(v, (t, hkv, hd)), (1, 0, 2))
                kc2, vc2 = ([ops.kv_write_dense(st, y, pos) for st, y in zip(
                    cache, ops.kv_encode(new, kv_dtype), strict=True)]
                    for cache, new in ((kc, k_new), (vc, v_new)))
                for st, nxt in zip(kc + vc, kc2 + vc2, strict=True):
                    ops.state_update(st, nxt)
                qh = ops.transpose(ops.reshape(q, (t, c.heads, hd)), (1, 0, 2))
                o = ops.attention_masked(qh, ops.kv_decode(kc2, kv_dtype),
                                         ops.kv_decode(vc2, kv_dtype), mask, scale,
                                         sinks)                             # [Hq,T,D]
                o = ops.reshape(ops.transpose(o, (1, 0, 2)), (n, c.heads * hd))
            else:
                kp = ops.kv_state((pool, hkv, hd), kv_dtype, p + "k_pool")
                vp = ops.kv_state((pool, hkv, hd), kv_dtype, p + "v_pool")
                kp2, vp2 = ([ops.kv_write_paged(st, y, wmap) for st, y in zip(
                    cache, ops.kv_encode(ops.reshape(new, (n, hkv, hd)), kv_dtype), strict=True)]
                    for cache, new in ((kp, k), (vp, v)))
                for st, nxt in zip(kp + vp, kp2 + vp2, strict=True):
                    ops.state_update(st, nxt)
                ks, vs = (ops.kv_decode([ops.transpose(ops.gather(y, smap, 0), (0, 2, 1, 3))
                                         for y in cache], kv_dtype)      # [B, Hkv, S, D]
                          for cache in (kp2, vp2))
                qh = ops.transpose(q, (0, 2, 1, 3))                          # [B, Hq, T, D]
                o = ops.attention_masked(qh, ks, vs, mask, scale, sinks)
                o = ops.reshape(ops.transpose(o, (0, 2, 1, 3)), (n, c.heads * hd))
            o = linear(o, p + "attn_output.weight",
                       declare(p + "attn_output.bias") if c.out_bias else None)
            if c.sandwich_norms:
                o = norm(o, p + "post_attention_norm.weight")
            x = ops.add(x, o)
            h = norm(x, p + "ffn_norm.weight")
            f = _ffn(c, h, p, declare, linear=linear, pool=resident,
                     stack=lambda names: stack(names, stack_ffn), has=weights.has)
            if c.sandwich_norms:
                f = norm(f, p + "post_ffw_norm.weight")
            x = ops.add(x, f)
        if logits == "rows" and t > 1:
            x = ops.gather(x, ops.slot(SlotKind.POS, (b,), "last", bound=n))     # [B, dim]
        x = norm(x, "output_norm.weight")
        if logits == "hidden":
            return x            # every token's final hidden state, no head (embeddings)
        if logits == "last" and t > 1:
            x = ops.reshape(ops.slice_axis(ops.reshape(x, (b, t, c.dim)), 1, t - 1, t), (b, c.dim))
        head = "output.weight" if weights.has("output.weight") else "token_embd.weight"
        if head == "token_embd.weight" and not c.tied:
            raise CheckpointError("checkpoint has no output.weight and the model is not tied")
        out = ops.linear(x, declare(head))
        return out if sample is None else sample_tokens(out, sample)

    mode = "decode" if t == 1 else "prefill"
    g = ops_trace(step, f"{c.arch}_{mode}_{kv}_b{b}_t{t}" + (f"_{sample}" if sample else ""))
    adapters = lora.arrays if lora is not None else {}
    return Step(g, c, mode, kv, b, t, logits, {**consts, **tables, **adapters}, sample)


def check_kv_dtype(kv_dtype: str, head_dim: int) -> None:
    """Refuse a KV dtype nobody knows, or q8_0 where head_dim is not whole blocks."""
    from poot.compiler.policy import PrecisionError
    from poot.ir.ops import Q8_BLOCK

    if kv_dtype not in ops.KV_DTYPES:
        raise PrecisionError(f"unknown KV dtype {kv_dtype!r}; the KV dtypes are "
                             f"{', '.join(ops.KV_DTYPES)}")
    if kv_dtype == "q8_0" and head_dim % Q8_BLOCK:
        raise PrecisionError(f"KV dtype 'q8_0' quantizes blocks of {Q8_BLOCK} along the head "
                             f"dimension; this model's is {head_dim}")


def _ffn(c: LlamaConfig, h, p: str, declare, suffix: str = "", *, linear=None, pool=None,
         stack=None, has=None):
    """The gated MLP: act(h W_gate) * (h W_up), then W_down; a mixture of experts where the
    config has experts (`suffix` "_shexp": the shared expert's tensors). `linear(x, name)`
    is the step's projection (with its LoRA updates); `pool` the traced expert pool;
    `stack(names)` the gate and up weights stacked by rows, or None: one token's step then
    computes both in one contraction (one GEMV instead of two; the SwiGLU reads its
    halves), a wider one each over its rows. `has(name)`: whether the source holds a
    tensor (gpt-oss experts: gate|up fused, or apart)."""
    linear = linear or (lambda x, name: ops.linear(x, declare(name)))
    if c.experts and not suffix and int(p.split(".")[1]) >= c.dense_layers:
        return _moe(c, h, p, declare, linear, pool, has)
    names = [f"{p}ffn_gate{suffix}.weight", f"{p}ffn_up{suffix}.weight"]
    w = stack(names) if stack is not None else None
    if w is None:
        g, u = (linear(h, name) for name in names)
    else:
        f = w.shape[0] // 2
        if math.prod(h.shape[:-1]) == 1:
            y = ops.linear(h, w)
            g, u = (ops.slice_axis(y, -1, s, e) for s, e in ((0, f), (f, 2 * f)))
        else:
            g, u = (ops.linear(h, _rows(w, s, e)) for s, e in ((0, f), (f, 2 * f)))
    return linear(_gated(c, g, u), f"{p}ffn_down{suffix}.weight")


def _gated(c: LlamaConfig, g, u):
    return ops.swiglu(g, u) if c.act == "silu" else ops.geglu_tanh(g, u)


def _moe(c: LlamaConfig, h, p: str, declare, linear, pool=None, has=None):
    """Route each token to its top-k experts (ArgTopK in the graph) and sum their gated MLPs
    weighted by the router's probabilities: softmax over the chosen logits where the top-k
    are renormalized (Mixtral, Qwen3-MoE), the full softmax's entries where not (Qwen2-MoE).
    Each expert matrix is one IndexedMatMul over the stacked experts [E, K, N]: a row reads
    only its expert's weights (with an expert pool: the pool row the map gives its expert)."""
    n, k, e = h.shape[0], c.experts_used, c.experts
    router_bias = declare(p + "ffn_gate_inp.bias") if c.swiglu_limit is not None else None
    logits = ops.linear(h, declare(p + "ffn_gate_inp.weight"), router_bias)  # [N, E]
    if c.routing is not None:
        bias = declare(p + "exp_probs_b.bias") if c.routing.bias else None
        ids, probs = route(c.routing, logits, bias, k, c.norm_topk)
    elif c.norm_topk:
        ids, probs = ops.moe_route(logits, k)                              # [N, k] each
    else:
        full = ops.softmax(logits, -1)
        ids = ops.argtopk(logits, k)
        rows = ops.mul(ops.iota((n, 1), 0), e)
        probs = ops.gather(ops.reshape(full, (n * e,)), ops.add(ids, rows), 0)
    idx = ops.reshape(ids, (n * k,))
    xk = ops.reshape(ops.broadcast_to(ops.reshape(h, (n, 1, c.dim)), (n, k, c.dim)),
                     (n * k, c.dim))
    if pool is not None:
        layer = int(p.split(".")[1])
        rows = pool.rows(layer, idx)

    def experts(x, name):
        if pool is not None:
            return ops.indexed_matmul(x, pool.matrix(layer, name), rows)
        w = declare(f"{p}{name}.weight")             # [E, N, K], or packed as [E*N, K]
        if isinstance(w, ops.PackedTensor):          # compile: IndexedPackedContraction
            w = ops.reshape(w.dequant(), (e, w.weight.shape[0] // e, w.weight.shape[1]))
        elif w.dtype is not DType.F32:
            w = ops.cast(w, DType.F32)
        return ops.indexed_matmul(x, ops.transpose(w, (0, 2, 1)), idx)

    if c.swiglu_limit is not None:
        if pool is not None:
            raise CheckpointError("gpt-oss experts are not served from an expert pool")

        def bias(name):                              # [E, N] -> each row's [N*k, N]
            b = declare(f"{p}{name}.bias")
            return ops.gather(b if b.dtype is DType.F32 else ops.cast(b, DType.F32), idx, 0)

        fused = has is None or has(f"{p}ffn_gate_up_exps.weight")
        y = gpt_oss_experts(c, xk, experts, bias, fused)
    else:
        a = _gated(c, experts(xk, "ffn_gate_exps"), experts(xk, "ffn_up_exps"))
        y = experts(a, "ffn_down_exps")
    y = ops.mul(y, ops.reshape(probs, (n * k, 1)))
    out = ops.reduce_sum(ops.reshape(y, (n, k, c.dim)), 1)
    if c.shared_ffn and c.routing is not None:      # DeepSeek: shared experts, no gate
        out = ops.add(out, _ffn(c, h, p, declare, "_shexp", linear=linear))
    elif c.shared_ffn:
        gate = ops.linear(h, declare(p + "ffn_gate_inp_shexp.weight"))    # [N, 1]
        sig = ops.div(1.0, ops.add(ops.exp(ops.neg(gate)), 1.0))
        out = ops.add(out, ops.mul(_ffn(c, h, p, declare, "_shexp", linear=linear), sig))
    return out


def _rope_tables(c: LlamaConfig, weights: WeightSource) -> dict[str, np.ndarray]:
    """Host cos/sin tables: "rope.*" for global layers, "rope_local.*" for sliding layers
    where their base differs (they are never scaled: Gemma 3 scales its global layers only)."""
    from poot.models import rope

    factors = None
    if weights.has("rope_freqs.weight"):  # GGUF llama3 scaling: divisors per frequency
        spec = weights.spec("rope_freqs.weight")
        factors = np.asarray(weights.arrays[spec.ref.tensor], np.float64)
    cos, sin = rope.tables(c.max_seq, c.rot, c.rope_base, c.rope_scaling, factors)
    out = {"rope.cos": cos, "rope.sin": sin}
    if c.mrope is not None:
        out.update(mrope.section_tables(cos, sin, c.mrope))
    if any(c.sliding) and c.rope_base_local is not None:
        cos, sin = rope.tables(c.max_seq, c.rot, c.rope_base_local)
        out.update({"rope_local.cos": cos, "rope_local.sin": sin})
    # frozen: a host runtime adopts them rather than holding a second copy
    return {name: frozen_stack([table], [None]) for name, table in out.items()}


def ops_trace(fn, name: str) -> Graph:
    from poot.tracer import trace

    return trace(fn, name=name)


# -- random weights for tests and benchmarks -------------------------------------------
def tiny_config(**overrides) -> LlamaConfig:
    """A small GQA config whose graphs evaluate in milliseconds."""
    base = LlamaConfig(vocab=96, dim=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=96,
                       norm_eps=1e-5, rope_base=10000.0, max_seq=32)
    return replace(base, **overrides)


class ArrayWeights:
    """A WeightSource over host arrays (dense numpy arrays, or packed source lists)."""

    def __init__(self, checkpoint: str = "random"):
        self.checkpoint = checkpoint
        self.specs: dict[str, DenseSpec | PackedSpec] = {}
        self.arrays: dict[str, np.ndarray] = {}       # const label -> array

    def has(self, name: str) -> bool:
        return name in self.specs

    def spec(self, name: str):
        try:
            return self.specs[name]
        except KeyError:
            raise CheckpointError(f"{self.checkpoint}: no tensor {name!r}") from None

    def add_dense(self, name: str, array: np.ndarray) -> None:
        ref = WeightRef(self.checkpoint, name, payload=_payload(array), format=str(array.dtype))
        self.specs[name] = DenseSpec(TensorType(array.shape, DType.of(array)), ref)
        self.arrays[name] = array

    def add_packed(self, name: str, weight: PackedWeight, sources: list[np.ndarray]) -> None:
        roles = [s.role for s in weight.sources()]
        refs = []
        for role, arr in zip(roles, sources, strict=True):
            label = name if len(roles) == 1 else f"{name}:{role}"
            refs.append(WeightRef(self.checkpoint, label, payload=_payload(arr),
                                  format=weight.format))
            self.arrays[label] = arr
        self.specs[name] = PackedSpec(weight, tuple(refs))


def _payload(a: np.ndarray) -> str:
    from poot.digest import blake2b

    return blake2b(np.ascontiguousarray(a).view(np.uint8), digest_size=16).hexdigest()


def random_weights(config: LlamaConfig, seed: int = 0, dtype: str = "f32",
                   packed_format=None) -> ArrayWeights:
    """Random weights of the GGUF names. Projections are `dtype` ("f32", "bf16", "f16",
    "f16words"), or packed with `packed_format` (quantized by that format's quantizer): a
    format name, or a function of the tensor name giving one (None: `dtype`)."""
    from poot.formats import get_format

    format_of = packed_format if callable(packed_format) else lambda name: packed_format

    c = config
    rng = np.random.default_rng(seed)
    w = ArrayWeights(f"random-{seed}")

    def mat(n, k, scale=None):
        return (rng.standard_normal((n, k)) * (scale or 1.0 / math.sqrt(k))).astype(np.float32)

    def add_matrix(name, m):
        if format_of(name):
            fmt = get_format(format_of(name))
            w.add_packed(name, PackedWeight(format_of(name), m.shape), list(fmt.quantize(m)))
        elif dtype == "f16words":  # f16 kept as u32 words, decoded by the built-in format
            words = np.ascontiguousarray(m.astype("<f2")).view("<u4")
            w.add_packed(name, PackedWeight("dense:f16words", m.shape), [words])
        else:
            w.add_dense(name, m.astype(DType.parse(dtype).numpy))

    def norm(name, d):
        w.add_dense(name, (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32))

    add_matrix("token_embd.weight", mat(c.vocab, c.dim, 1.0))
    qd, kd = c.heads * c.head_dim, c.kv_heads * c.head_dim
    for i in range(c.layers):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", c.dim)
        norm(p + "ffn_norm.weight", c.dim)
        if c.qk_norm:
            norm(p + "attn_q_norm.weight", c.head_dim)
            norm(p + "attn_k_norm.weight", c.head_dim)
        if c.sandwich_norms:
            norm(p + "post_attention_norm.weight", c.dim)
            norm(p + "post_ffw_norm.weight", c.dim)
        ffn = () if c.experts else (("ffn_gate", c.ffn, c.dim), ("ffn_up", c.ffn, c.dim),
                                    ("ffn_down", c.dim, c.ffn))
        for name, n, k in (("attn_q", qd, c.dim), ("attn_k", kd, c.dim), ("attn_v", kd, c.dim),
                           ("attn_output", c.dim, qd), *ffn):
            add_matrix(p + name + ".weight", mat(n, k))
        if c.experts:
            w.add_dense(p + "ffn_gate_inp.weight", mat(c.experts, c.dim))
            for name, n, k in (("ffn_gate_exps", c.expert_ffn, c.dim),
                               ("ffn_up_exps", c.expert_ffn, c.dim),
                               ("ffn_down_exps", c.dim, c.expert_ffn)):
                w.add_dense(p + name + ".weight",
                            np.stack([mat(n, k) for _ in range(c.experts)]))
        if c.qkv_bias:
            for name, n in (("attn_q", qd), ("attn_k", kd), ("attn_v", kd)):
                w.add_dense(p + name + ".bias", (0.1 * rng.standard_normal(n)).astype(np.float32))
    norm("output_norm.weight", c.dim)
    if not c.tied:
        add_matrix("output.weight", mat(c.vocab, c.dim))
    return w


def const_inputs(step: Step, weights: ArrayWeights) -> dict[str, np.ndarray]:
    """Every Const binder of the step's graph by label: weights and rope tables."""
    out = {}
    g = step.graph
    for v in g.consts():
        label = g.meta(v).identity.label
        out[label] = step.consts[label] if label in step.consts else weights.arrays[label]
    return out
