"""The Llama family (Llama 2/3, Mistral, Qwen2 with q/k/v bias, SmolLM) traced through poot.ops.

`build_decoder(config, weights, ...)` records one step of the decoder as a
Graph of primitives: the token embedding, per layer RMSNorm, q/k/v projections,
RoPE (rotate-half), KV write (dense: DynamicUpdateSlice at Pos; paged:
ScatterUpdate through a WriteMap), masked GQA attention built from Pos and an
Iota, the output projection and residual, the SwiGLU MLP, the final norm and
the LM head. compile then finds the fused kernels in it.

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
from poot.models.weights import DenseSpec, HalfLayoutRows, PackedSpec, WeightSource


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int
    dim: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    rope_scale: float = 1.0          # linear position scaling
    rope_dim: int | None = None      # partial rotary (None: the whole head)
    #: "pairs": q/k rows stored as adjacent (even, odd) pairs, as GGUF llama checkpoints
    #: hold them (the converter permutes HF rows; build_decoder reorders them once, through
    #: poot.models.weights.HalfLayoutRows); "half": HF's rotate-half order
    rope_layout: str = "half"
    tied: bool = True
    qkv_bias: bool = False
    max_seq: int = 2048              # KV capacity per sequence
    arch: str = "llama"

    @property
    def rot(self) -> int:
        return self.rope_dim or self.head_dim


@dataclass
class Step:
    """A traced decoder step and how to feed it."""

    graph: Graph
    config: LlamaConfig
    mode: str                       # "decode" | "prefill"
    kv: str                         # "dense" | "paged"
    batch: int                      # sequences per step
    tokens: int                     # tokens per sequence in this step
    logits: str                     # "all" | "last"
    #: host arrays the step binds beyond the source's `arrays`: rope tables, and q/k rows
    #: reordered from a "pairs" source (poot.models.weights.HalfLayoutRows)
    consts: dict[str, np.ndarray] = field(default_factory=dict)


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
                  pool_slots: int | None = None) -> Step:
    """Trace one decoder step for `batch` sequences of `tokens` tokens each.

    dense KV: batch must be 1; State k/v per layer [Hkv, max_seq, D]; slots
    `tokens` (Token [T]) and `pos` (Pos [1], the first position).
    paged KV: a pool per layer [pool_slots, Hkv, D] shared by all sequences;
    slots `tokens` [B, T], `pos` [B, 1], `write_map` (WriteMap [B*T]: pool slot of
    each new token, -1 for padding) and `slot_map` (SlotMap [B, max_seq]: the pool
    slot of each position of each sequence).
    """
    c = config
    consts: dict[str, np.ndarray] = {}
    if c.rope_layout == "pairs":  # reorder the q/k weight rows once, not q/k every step
        weights = HalfLayoutRows(weights, c.head_dim)
        consts = weights.arrays
    if kv not in ("dense", "paged"):
        raise ValueError(f"kv must be 'dense' or 'paged', not {kv!r}")
    if kv == "dense" and batch != 1:
        raise ValueError("a dense KV cache holds one sequence; use kv='paged' for batches")
    b, t, n = batch, tokens, batch * tokens
    cap = c.max_seq
    pool = pool_slots or cap * b
    cos_t, sin_t = ops.rope_tables(cap, c.rot, c.rope_base, c.rope_scale)
    scale = 1.0 / math.sqrt(c.head_dim)

    def step():
        seen: dict = {}

        def declare(name):
            return _declare(weights, name, seen)

        if kv == "dense":
            tok = ops.slot(SlotKind.TOKEN, (t,), "tokens", bound=c.vocab)
            pos = ops.slot(SlotKind.POS, (1,), "pos", bound=cap - t + 1)
            rope_pos = ops.positions(pos, t)
        else:
            tok2 = ops.slot(SlotKind.TOKEN, (b, t), "tokens", bound=c.vocab)
            tok = ops.reshape(tok2, (n,))
            pos = ops.slot(SlotKind.POS, (b, 1), "pos", bound=cap - t + 1)
            wmap = ops.slot(SlotKind.WRITE_MAP, (n,), "write_map", bound=pool)
            smap = ops.slot(SlotKind.SLOT_MAP, (b, cap), "slot_map", bound=pool)
            rope_pos = ops.positions(pos, t)                       # [B, T]
        cos = ops.const(cos_t.shape, DType.F32, "rope.cos")
        sin = ops.const(sin_t.shape, DType.F32, "rope.sin")
        mask = ops.causal_mask(pos, t, cap)                        # [T, S] or [B, T, S]
        if kv == "paged":
            mask = ops.reshape(mask, (b, 1, 1, t, cap))

        x = ops.embedding(declare("token_embd.weight"), tok)   # [N, dim]
        for i in range(c.layers):
            p = f"blk.{i}."
            h = ops.rms_norm(x, declare(p + "attn_norm.weight"), c.norm_eps)

            def proj(name, heads, h=h, p=p):
                bias = declare(p + name + ".bias") if c.qkv_bias else None
                y = ops.linear(h, declare(p + name + ".weight"), bias)
                return ops.reshape(y, (b, t, heads, c.head_dim))

            q = proj("attn_q", c.heads)
            k, v = proj("attn_k", c.kv_heads), proj("attn_v", c.kv_heads)
            qpos = rope_pos if kv == "paged" else ops.reshape(rope_pos, (1, t))
            q = ops.rope_partial(q, cos, sin, qpos, c.rot, tokens_first=True)
            k = ops.rope_partial(k, cos, sin, qpos, c.rot, tokens_first=True)
            if kv == "dense":
                kc = ops.state((c.kv_heads, cap, c.head_dim), DType.F32, p + "k_cache")
                vc = ops.state((c.kv_heads, cap, c.head_dim), DType.F32, p + "v_cache")
                k_new = ops.transpose(ops.reshape(k, (t, c.kv_heads, c.head_dim)), (1, 0, 2))
                v_new = ops.transpose(ops.reshape(v, (t, c.kv_heads, c.head_dim)), (1, 0, 2))
                kc2, vc2 = ops.kv_write_dense(kc, k_new, pos), ops.kv_write_dense(vc, v_new, pos)
                ops.state_update(kc, kc2)
                ops.state_update(vc, vc2)
                qh = ops.transpose(ops.reshape(q, (t, c.heads, c.head_dim)), (1, 0, 2))
                o = ops.attention_masked(qh, kc2, vc2, mask, scale)         # [Hq, T, D]
                o = ops.reshape(ops.transpose(o, (1, 0, 2)), (n, c.heads * c.head_dim))
            else:
                kp = ops.state((pool, c.kv_heads, c.head_dim), DType.F32, p + "k_pool")
                vp = ops.state((pool, c.kv_heads, c.head_dim), DType.F32, p + "v_pool")
                kp2 = ops.kv_write_paged(kp, ops.reshape(k, (n, c.kv_heads, c.head_dim)), wmap)
                vp2 = ops.kv_write_paged(vp, ops.reshape(v, (n, c.kv_heads, c.head_dim)), wmap)
                ops.state_update(kp, kp2)
                ops.state_update(vp, vp2)
                ks = ops.transpose(ops.gather(kp2, smap, 0), (0, 2, 1, 3))   # [B, Hkv, S, D]
                vs = ops.transpose(ops.gather(vp2, smap, 0), (0, 2, 1, 3))
                qh = ops.transpose(q, (0, 2, 1, 3))                          # [B, Hq, T, D]
                o = ops.attention_masked(qh, ks, vs, mask, scale)
                o = ops.reshape(ops.transpose(o, (0, 2, 1, 3)), (n, c.heads * c.head_dim))
            x = ops.add(x, ops.linear(o, declare(p + "attn_output.weight")))
            h = ops.rms_norm(x, declare(p + "ffn_norm.weight"), c.norm_eps)
            g = ops.linear(h, declare(p + "ffn_gate.weight"))
            u = ops.linear(h, declare(p + "ffn_up.weight"))
            x = ops.add(x, ops.linear(ops.swiglu(g, u), declare(p + "ffn_down.weight")))
        x = ops.rms_norm(x, declare("output_norm.weight"), c.norm_eps)
        if logits == "last" and t > 1:
            x = ops.reshape(ops.slice_axis(ops.reshape(x, (b, t, c.dim)), 1, t - 1, t), (b, c.dim))
        head = "output.weight" if weights.has("output.weight") else "token_embd.weight"
        if head == "token_embd.weight" and not c.tied:
            raise CheckpointError("checkpoint has no output.weight and the model is not tied")
        return ops.linear(x, declare(head))

    mode = "decode" if t == 1 else "prefill"
    g = ops_trace(step, f"{c.arch}_{mode}_{kv}_b{b}_t{t}")
    return Step(g, c, mode, kv, b, t, logits, {**consts, "rope.cos": cos_t, "rope.sin": sin_t})


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
    import hashlib

    return hashlib.blake2b(np.ascontiguousarray(a).view(np.uint8), digest_size=16).hexdigest()


def random_weights(config: LlamaConfig, seed: int = 0, dtype: str = "f32",
                   packed_format: str | None = None) -> ArrayWeights:
    """Random weights of the GGUF names. Projections are `dtype` ("f32", "bf16", "f16",
    "f16words"), or packed with `packed_format` (quantized by that format's quantizer)."""
    from poot.formats import get_format

    c = config
    rng = np.random.default_rng(seed)
    w = ArrayWeights(f"random-{seed}")

    def mat(n, k, scale=None):
        return (rng.standard_normal((n, k)) * (scale or 1.0 / math.sqrt(k))).astype(np.float32)

    def add_matrix(name, m):
        if packed_format:
            fmt = get_format(packed_format)
            w.add_packed(name, PackedWeight(packed_format, m.shape), list(fmt.quantize(m)))
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
        for name, n, k in (("attn_q", qd, c.dim), ("attn_k", kd, c.dim), ("attn_v", kd, c.dim),
                           ("attn_output", c.dim, qd), ("ffn_gate", c.ffn, c.dim),
                           ("ffn_up", c.ffn, c.dim), ("ffn_down", c.dim, c.ffn)):
            add_matrix(p + name + ".weight", mat(n, k))
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
