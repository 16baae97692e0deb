"""The attention rewrite: attention_masked chains become Attention (decode, prefill, GQA,
batched), when the policy and the target allow it."""
from __future__ import annotations

from dataclasses import replace

import poot
import pytest
from poot import ops
from poot.compiler import LimitedBackend, Policy
from poot.compiler.validate import validated_pass
from poot.dtypes import DType
from poot.ir.types import SlotKind
from poot.plugin import get_backend


def attention_graph(lead, hq, hkv, t, s, d, window=None, scale=None, witness_probs=False,
                    dtype="f32"):
    def fn(q, k, v, pos):
        mask = ops.causal_mask(pos, t, s, window, dtype=q.dtype)
        if witness_probs:  # the softmax read outside: the chain must stay
            ops.witness(ops.softmax(q), "probs")
        return ops.attention_masked(q, k, v, mask, scale)

    return poot.trace(fn, poot.spec(lead + (hq, t, d), dtype, name="q"),
                      poot.spec(lead + (hkv, s, d), dtype, name="k"),
                      poot.spec(lead + (hkv, s, d), dtype, name="v"),
                      poot.spec((1,), "i32", name="pos", kind="slot", slot=SlotKind.POS,
                                bound=s - t + 1))


@pytest.mark.parametrize("lead,hq,hkv,t,s,d,window,dtype", [
    ((), 4, 4, 1, 16, 8, None, "f32"),       # decode, MHA
    ((), 6, 2, 1, 24, 16, None, "f32"),      # decode, GQA 3:1
    ((), 4, 2, 5, 12, 8, None, "f32"),       # prefill, GQA
    ((2,), 4, 1, 3, 8, 4, 4, "f32"),         # batched, MQA, sliding window
    ((), 4, 2, 3, 8, 8, None, "bf16"),       # bf16 prefill, GQA
])
def test_attention_rewrite(lead, hq, hkv, t, s, d, window, dtype):
    g = attention_graph(lead, hq, hkv, t, s, d, window, dtype=dtype)
    out, rec = validated_pass(g, "attention", seed=t + s)
    att = [e for e in out.eqns() if e.op.name == "Attention"]
    assert len(att) == 1 and rec.rewrites == 1
    assert att[0].op.scale == pytest.approx(d ** -0.5)
    assert not {"MatMul", "Reduce", "Unary"} & {e.op.name for e in out.eqns()}


def test_policy_never_and_limits_keep_the_chain():
    g = attention_graph((), 4, 2, 2, 16, 8)
    for policy, why in ((Policy(attention="never"), "'never'"),
                        (Policy(attention_max_keys=8), "16 keys exceed"),
                        (Policy(attention_max_head_dim=4), "head dim 8 exceeds")):
        out, rec = validated_pass(g, "attention", policy=policy)
        assert rec.rewrites == 0 and why in rec.decisions[0].reason
        assert "Attention" not in {e.op.name for e in out.eqns()}


def test_target_without_attention_keeps_the_chain():
    ref = get_backend("reference")
    out, rec = validated_pass(attention_graph((), 2, 2, 1, 8, 4), "attention",
                              (LimitedBackend(ref, {"Attention"}), None))
    assert rec.rewrites == 0 and "does not lower Attention" in rec.decisions[0].reason


def test_softmax_read_elsewhere_is_still_rewritten_only_where_whole():
    g = attention_graph((), 2, 2, 1, 8, 4, witness_probs=True)
    out, rec = validated_pass(g, "attention")
    assert rec.rewrites == 1  # the witnessed softmax is a separate chain


def test_custom_scale_and_no_mask_slot():
    g = poot.trace(lambda q, k, v, m: ops.attention_masked(q, k, v, m, 0.3),
                   poot.spec((2, 3, 4)), poot.spec((2, 5, 4)), poot.spec((2, 5, 6)),
                   poot.spec((3, 5), name="mask"))
    out, rec = validated_pass(g, "attention")
    (att,) = [e for e in out.eqns() if e.op.name == "Attention"]
    assert att.op.scale == 0.3 and out.type_of(att.out).shape == (2, 3, 6)


def paged_graph(b, hq, hkv, t, s, d, pool, same_map=True):
    """The paged decoder's read: K and V pool rows gathered through slot maps, transposed
    to [B, Hkv, S, D], under a per-sequence mask [B, 1, 1, T, S]."""
    def fn(q, kp, vp, smap, smap2, mask):
        ks = ops.transpose(ops.gather(kp, smap, 0), (0, 2, 1, 3))
        vs = ops.transpose(ops.gather(vp, smap if same_map else smap2, 0), (0, 2, 1, 3))
        return ops.attention_masked(q, ks, vs, mask, None)

    return poot.trace(fn, poot.spec((b, hq, t, d), name="q"),
                      poot.spec((pool, hkv, d), name="kp"), poot.spec((pool, hkv, d), name="vp"),
                      poot.spec((b, s), "i32", name="smap", kind="slot",
                                slot=SlotKind.SLOT_MAP, bound=pool),
                      poot.spec((b, s), "i32", name="smap2", kind="slot",
                                slot=SlotKind.SLOT_MAP, bound=pool),
                      poot.spec((b, 1, 1, t, s), name="mask"))


@pytest.mark.parametrize("b,hq,hkv,t,s,d,pool", [(3, 4, 2, 1, 12, 8, 20), (2, 4, 1, 3, 9, 8, 16)])
def test_paged_reads_become_paged_attention(b, hq, hkv, t, s, d, pool):
    out, rec = validated_pass(paged_graph(b, hq, hkv, t, s, d, pool), "attention", seed=s)
    names = [e.op.name for e in out.eqns()]
    assert names.count("PagedAttention") == 1 and rec.rewrites == 1
    assert not {"Gather", "Transpose", "MatMul", "Attention"} & set(names)


def test_paged_reads_without_the_op_or_one_map_keep_the_gathers():
    ref = get_backend("reference")
    g = paged_graph(2, 2, 2, 1, 8, 4, 10)
    out, _ = validated_pass(g, "attention", (LimitedBackend(ref, {"PagedAttention"}), None))
    names = [e.op.name for e in out.eqns()]
    assert "Attention" in names and names.count("Gather") == 2
    out, _ = validated_pass(paged_graph(2, 2, 2, 1, 8, 4, 10, same_map=False), "attention")
    assert "PagedAttention" not in {e.op.name for e in out.eqns()}


def sink_graph(lead, hq, hkv, t, s, d):
    def fn(q, k, v, sinks, pos):
        return ops.attention_masked(q, k, v, ops.causal_mask(pos, t, s), None, sinks)

    return poot.trace(fn, poot.spec(lead + (hq, t, d), "f32", name="q"),
                      poot.spec(lead + (hkv, s, d), "f32", name="k"),
                      poot.spec(lead + (hkv, s, d), "f32", name="v"),
                      poot.spec((hq,), "f32", name="sinks"),
                      poot.spec((1,), "i32", name="pos", kind="slot", slot=SlotKind.POS,
                                bound=s - t + 1))


@pytest.mark.parametrize("lead,hq,hkv,t,s,d", [((), 4, 2, 1, 16, 8), ((2,), 4, 2, 3, 8, 4)])
def test_sink_chain_becomes_sink_attention_where_declared(lead, hq, hkv, t, s, d):
    """gpt-oss's chain (the sinks in the max and the denominator): SinkAttention on a target
    that declares it, never a plain Attention; the primitives on one that does not."""
    g = sink_graph(lead, hq, hkv, t, s, d)
    out, rec = validated_pass(g, "attention", seed=s)
    names = [e.op.name for e in out.eqns()]
    assert "SinkAttention" in names and "Attention" not in names and rec.rewrites == 1
    ref = get_backend("reference")
    out, rec = validated_pass(g, "attention", (LimitedBackend(ref, {"SinkAttention"}), None))
    names = {e.op.name for e in out.eqns()}
    assert rec.rewrites == 0 and not {"SinkAttention", "Attention"} & names
    assert "does not lower SinkAttention" in rec.decisions[0].reason


def widened_graph(kv_dtype, paged=False):
    """An f32 query over a 16-bit cache widened by Cast(f32) first, as the fast decoder reads
    its f16 KV: dense [Hkv, S, D] rows, or pool rows gathered through one slot map."""
    def fn(q, k, v, smap, mask):
        if paged:
            k, v = (ops.transpose(ops.gather(x, smap, 0), (0, 2, 1, 3)) for x in (k, v))
        k, v = (ops.cast(x, "f32") for x in (k, v))
        return ops.attention_masked(q, k, v, mask, None)

    rows = (10, 2, 8) if paged else (2, 12, 8)
    return poot.trace(fn, poot.spec((2, 4, 1, 8) if paged else (4, 3, 8), name="q"),
                      poot.spec(rows, kv_dtype, name="k"), poot.spec(rows, kv_dtype, name="v"),
                      poot.spec((2, 12), "i32", name="smap", kind="slot",
                                slot=SlotKind.SLOT_MAP, bound=10),
                      poot.spec((2, 1, 1, 1, 12) if paged else (3, 12), name="mask"))


class WithoutWidened(LimitedBackend):
    """A target whose attentions take f32 keys only (no 16-bit entry)."""

    def capabilities(self, device):
        t = super().capabilities(device)
        return replace(t, ops={k: v - {DType.F16, DType.BF16} if "Attention" in k else v
                               for k, v in t.ops.items()})


@pytest.mark.parametrize("kv_dtype,paged,op", [("f16", False, "Attention"),
                                               ("bf16", False, "Attention"),
                                               ("f16", True, "PagedAttention")])
def test_widened_kv_folds_into_the_attention_where_declared(kv_dtype, paged, op):
    """Cast(f32) of a 16-bit k and v folds into the composite's operands (no f32 copy of the
    cache); a target without the 16-bit entry keeps the casts and attends over f32."""
    g = widened_graph(kv_dtype, paged)
    out, rec = validated_pass(g, "attention", seed=3)
    (att,) = [e for e in out.eqns() if "Attention" in e.op.name]
    assert att.op.name == op and rec.rewrites == 1
    assert [str(out.type_of(x.id).dtype) for x in att.inputs[1:3]] == [kv_dtype] * 2
    assert "Cast" not in {e.op.name for e in out.eqns()}
    ref = WithoutWidened(get_backend("reference"), ())
    out, rec = validated_pass(g, "attention", (ref, None), seed=3)
    (att,) = [e for e in out.eqns() if "Attention" in e.op.name]
    assert att.op.name == "Attention" and rec.rewrites == 1
    assert [str(out.type_of(x.id).dtype) for x in att.inputs[1:3]] == ["f32"] * 2
    assert [e.op.name for e in out.eqns()].count("Cast") == 2


def q8_graph(sinks=False):
    """An f32 query over a q8_0 cache dequantized first, as the decoder reads it
    (poot.ops.kv_decode): codes [Hkv, S, D] and scales [Hkv, S, D/32] for k and for v;
    with `sinks`, gpt-oss's sink logit per head in the softmax."""
    def fn(q, kc, ks, vc, vs, mask, *sink):
        k, v = ops.kv_decode([kc, ks], "q8_0"), ops.kv_decode([vc, vs], "q8_0")
        return ops.attention_masked(q, k, v, mask, None, *sink)

    return poot.trace(fn, poot.spec((4, 3, 64), name="q"),
                      *(poot.spec(s, dt, name=f"{x}{n}") for x in "kv" for s, dt, n in (
                          ((2, 12, 64), "i8", "c"), ((2, 12, 2), "f32", "s"))),
                      poot.spec((3, 12), name="mask"),
                      *([poot.spec((4,), name="sinks")] if sinks else []))


@pytest.mark.parametrize("sinks,fused,plain", [(False, "Q8KVAttention", "Attention"),
                                               (True, "Q8KVSinkAttention", "SinkAttention")])
def test_q8_kv_reads_fold_into_the_q8_attention_where_declared(sinks, fused, plain):
    """The q8_0 dequantization of k and v folds into Q8KVAttention, or for gpt-oss's sinks
    into Q8KVSinkAttention (never a plain Q8KVAttention): no f32 copy of the cache; a
    target without it keeps the dequantization and attends over f32."""
    g = q8_graph(sinks=sinks)
    out, rec = validated_pass(g, "attention", seed=5)
    assert [e.op.name for e in out.eqns()] == [fused] and rec.rewrites == 1
    ref = LimitedBackend(get_backend("reference"), {fused})
    out, rec = validated_pass(g, "attention", (ref, None), seed=5)
    names = [e.op.name for e in out.eqns()]
    assert plain in names and "Q8KVAttention" not in names and rec.rewrites == 1
    assert names.count("Cast") == 2


@pytest.mark.parametrize("kv,op,ring", [("dense", "Attention", False),
                                        ("dense", "Attention", True),
                                        ("paged", "PagedAttention", False)])
def test_the_f16_kv_decoder_attends_over_its_cache_in_place(kv, op, ring):
    """build_decoder(kv_dtype="f16") compiled: every layer's attention reads the f16 cache,
    pool or sliding ring itself, and no step widens the cache to f32."""
    from poot.models.llama import build_decoder, random_weights, tiny_config

    cfg = tiny_config(dim=64, heads=2, kv_heads=1, head_dim=32, ffn=96, max_seq=24,
                      **({"window": 8, "sliding": (True, False)} if ring else {}))
    pool = {"pool_slots": 64} if kv == "paged" else {}
    st = build_decoder(cfg, random_weights(cfg), kv=kv, kv_dtype="f16", **pool)
    g = poot.compile(st.graph, "reference").graph
    att = [e for e in g.eqns() if "Attention" in e.op.name]
    assert {e.op.name for e in att} == {op} and len(att) == cfg.layers
    assert all(str(g.type_of(x.id).dtype) == "f16" for e in att for x in e.inputs[1:3])
    widened = [e for e in g.eqns() if e.op.name == "Cast" and e.op.to is DType.F32
               and g.type_of(e.inputs[0].id).dtype is DType.F16]
    assert not widened


@pytest.mark.parametrize("kv,ring,op", [("dense", False, "Q8KVAttention"),
                                        ("dense", True, "Q8KVAttention"),
                                        ("paged", False, "PagedQ8KVAttention")])
def test_the_q8_0_kv_decoder_attends_over_its_codes_in_place(kv, ring, op):
    """build_decoder(kv_dtype="q8_0") compiled: every layer's attention reads the codes and
    scales of its cache, sliding ring or pools, and no step dequantizes a cache; without the
    paged form, the gathered pool rows."""
    from poot.models.llama import build_decoder, random_weights, tiny_config

    cfg = tiny_config(dim=64, heads=2, kv_heads=1, head_dim=32, ffn=96, max_seq=24,
                      **({"window": 8, "sliding": (True, False)} if ring else {}))
    pool = {"pool_slots": 64} if kv == "paged" else {}
    st = build_decoder(cfg, random_weights(cfg), kv=kv, kv_dtype="q8_0", **pool)
    ref = get_backend("reference")
    for target, want in ((ref, op), (LimitedBackend(ref, {"PagedQ8KVAttention"}),
                                     "Q8KVAttention")):
        g = poot.compile(st.graph, target).graph
        att = [e for e in g.eqns() if "Attention" in e.op.name]
        assert {e.op.name for e in att} == {want} and len(att) == cfg.layers
        assert not [e for e in g.eqns() if e.op.name == "Cast" and
                    g.type_of(e.inputs[0].id).dtype is DType.I8]
