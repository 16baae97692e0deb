"""Tensor parallelism on the CPU: the sharded model against the unsharded one through the N-rank
oracle, and compiled, planned and run on the reference runtime (a thread per rank through a
LocalGroup); the refusals of impossible splits and of collectives without a communicator."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import poot
import pytest
from poot.backends.reference.runtime import ReferenceRuntime
from poot.errors import GraphError, ShardError, UnsupportedOp
from poot.ir import ops as O
from poot.ir.builder import Builder
from poot.ir.types import StorageClass, TensorType
from poot.plugin import get_backend
from poot.models.llama import (
    LlamaConfig,
    build_decoder,
    const_inputs,
    random_weights,
    tiny_config,
)
from poot.oracle import evaluate
from poot.oracle.ranks import evaluate_ranks
from poot.parallel import layout_of, plan_layout, shard_step
from poot.parallel.local import LocalGroup, run_ranks
from poot.plan import plan
from poot.runtime.executor import Executor

#: SmolLM2-135M's shape (9 query heads, 3 KV heads, dim 576, FFN 1536, vocab 49152), one layer
SMOL = LlamaConfig(vocab=49152, dim=576, layers=1, heads=9, kv_heads=3, head_dim=64, ffn=1536,
                   rope_base=100000.0, max_seq=16)


def slots(c, kv, tokens, batch, rng):
    if kv == "dense":
        return {"tokens": rng.integers(0, c.vocab, tokens).astype(np.int32),
                "pos": np.array([3], np.int32)}
    base = np.arange(batch)[:, None] * c.max_seq
    return {"tokens": rng.integers(0, c.vocab, (batch, tokens)).astype(np.int32),
            "pos": np.full((batch, 1), 3, np.int32),
            "write_map": (base + 3 + np.arange(tokens)).reshape(-1).astype(np.int32),
            "slot_map": (base + np.arange(c.max_seq)).astype(np.int32)}


def states(graph, rng):
    return {graph.meta(v).identity.label:
            rng.standard_normal(graph.meta(v).aval.shape).astype(np.float32)
            for v in graph.inputs() if graph.meta(v).storage.cls is StorageClass.STATE}


def rank_inputs(rg, consts, slot_values, state):
    cs = rg.consts(consts)
    got = dict(slot_values)
    for v in rg.graph.inputs():
        meta = rg.graph.meta(v)
        label = meta.identity.label
        if meta.storage.cls is StorageClass.CONST:
            got[label] = cs[label]
        elif meta.storage.cls is StorageClass.STATE:
            got[label] = rg.state_part(label, state[label])
    return got


def close(got, want, what):
    """f32 to 1e-5 of the value's scale (elementwise relative error means nothing near 0)."""
    err = float(np.abs(got.astype(np.float64) - want).max())
    assert got.shape == want.shape and err <= 1e-5 * float(np.abs(want).max()), \
        f"{what}: max error {err} against scale {np.abs(want).max()}"


def check_sharded(step, consts, ranks, slot_values, rng):
    g = step.graph
    state = states(g, rng)
    want = evaluate(g, {**consts, **slot_values, **state})
    rgs = shard_step(step, ranks)
    got = evaluate_ranks([r.graph for r in rgs],
                         [rank_inputs(r, consts, slot_values, state) for r in rgs])
    next_state = {g.meta(o.input).identity.label: a
                  for o, a in zip(g.outputs(), want) if o.kind.name == "STATE_NEXT"}
    for rg, outs in zip(rgs, got, strict=True):
        close(outs[0], want[0], f"rank {rg.rank} logits")
        for o, a in zip(rg.graph.outputs(), outs, strict=True):
            if o.kind.name == "STATE_NEXT":
                label = rg.graph.meta(o.input).identity.label
                close(a, rg.state_part(label, next_state[label]), f"rank {rg.rank} {label}")
    return rgs


@pytest.mark.parametrize("kv", ["dense", "paged"])
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_sharded_smollm2_shape_equals_unsharded(ranks, kv):
    """f32 random weights of SmolLM2's shape: 2 ranks split the KV heads 1+2 (whole GQA
    groups), 3 ranks one group each, 4 ranks replicate KV head 0 on two ranks."""
    batch = 2 if kv == "paged" else 1
    w = random_weights(SMOL, seed=ranks)
    step = build_decoder(SMOL, w, tokens=2, batch=batch, kv=kv,
                         pool_slots=SMOL.max_seq * batch if kv == "paged" else None,
                         stack_qkv=False, stack_ffn=False)
    rgs = check_sharded(step, const_inputs(step, w), ranks,
                        slots(SMOL, kv, 2, batch, np.random.default_rng(ranks)),
                        np.random.default_rng(7))
    g = rgs[0].graph
    kinds = [e.op.name for e in g.eqns() if isinstance(e.op, (O.AllReduce, O.AllGather))]
    # the embedding's, then per layer the attention's and the FFN's; one gather of logits
    assert kinds == ["AllReduce"] * (1 + 2 * SMOL.layers) + ["AllGather"]
    layout = layout_of(SMOL, ranks)
    for rg in rgs:
        shapes = {rg.graph.meta(v).identity.label.split("[")[0]: rg.graph.type_of(v).shape
                  for v in rg.graph.consts()}
        assert shapes["blk.0.attn_q.weight"] == (len(layout.q[rg.rank]) * 64, 576)
        assert shapes["blk.0.attn_k.weight"] == (len(layout.kv[rg.rank]) * 64, 576)
        assert shapes["token_embd.weight"] == (49152 // ranks, 576)


def test_sharded_real_smollm2_equals_unsharded(smollm2_gguf):
    """The real SmolLM2 GGUF (Q4_1 projections, a Q8_0 embedding), its packed blocks cut per
    rank, over 2 ranks: a prefill of two tokens, logits and KV caches."""
    from poot.models.loader import open_model
    from poot.models.weights import CheckpointWeights

    ckpt, config = open_model(str(smollm2_gguf), max_seq=8)
    config = replace(config, max_seq=8)
    w = CheckpointWeights(ckpt, config)
    step = build_decoder(config, w, tokens=2, stack_qkv=False, stack_ffn=False)
    labels = {step.graph.meta(v).identity.label for v in step.graph.consts()}
    consts = {k: v for k, v in {**w.arrays, **step.consts}.items() if k in labels}
    rgs = check_sharded(step, consts, 2, {"tokens": np.array([1, 504], np.int32),
                                          "pos": np.array([0], np.int32)},
                        np.random.default_rng(0))
    packed = [e.op.weight for e in rgs[1].graph.eqns() if isinstance(e.op, O.PackedDequant)]
    assert {"gguf:Q4_1", "gguf:Q8_0"} <= {p.format for p in packed}
    assert (config.ffn // 2, config.dim) in {p.shape for p in packed}   # gate/up rows halved


def test_rank_consts_are_views_of_the_source():
    c = replace(SMOL, layers=1, vocab=96)
    w = random_weights(c)
    step = build_decoder(c, w, tokens=1, stack_qkv=False, stack_ffn=False)
    consts = const_inputs(step, w)
    rg = shard_step(step, 2)[1]
    view = rg.consts(consts)["blk.0.attn_q.weight[0:192:576]"]   # KV heads 1, 2
    assert view.shape == (384, 576) and np.shares_memory(view, consts["blk.0.attn_q.weight"])


@pytest.mark.parametrize("sizes, dim", [
    (dict(heads=2, kv_heads=1, ffn=64, vocab=64, ranks=4), "heads"),
    (dict(heads=9, kv_heads=3, ffn=1536, vocab=49153, ranks=2), "vocab"),
    (dict(heads=8, kv_heads=8, ffn=2, vocab=64, ranks=4), "ffn"),
    (dict(heads=9, kv_heads=2, ffn=64, vocab=64, ranks=2), "heads"),
    (dict(heads=8, kv_heads=8, ffn=64, vocab=64, ranks=0), "ranks"),
])
def test_impossible_splits_are_refused_naming_the_dimension(sizes, dim):
    with pytest.raises(ShardError, match=rf"dim={dim}, ranks={sizes['ranks']}") as e:
        plan_layout(head_dim=16, **sizes)
    assert e.value.dim == dim


def test_mixture_of_experts_is_refused():
    c = replace(SMOL, experts=4, experts_used=2, expert_ffn=64)
    with pytest.raises(ShardError, match="experts") as e:
        layout_of(c, 2)
    assert e.value.dim == "experts"


def test_a_packed_split_off_block_boundaries_is_refused():
    """FFN 96 over 2 ranks cuts the Q8_0 down projection at column 48, inside a 32-block."""
    c = replace(SMOL, layers=1, vocab=96, dim=64, heads=4, kv_heads=2, head_dim=16, ffn=96)
    w = random_weights(c, packed_format=lambda name: "gguf:Q8_0" if "ffn_down" in name
                       else None)
    step = build_decoder(c, w, tokens=1, stack_qkv=False, stack_ffn=False)
    with pytest.raises(ShardError, match=r"gguf:Q8_0 source cannot be cut to \(64, 48\)") as e:
        shard_step(step, 2)
    assert e.value.dim == "blk.0.ffn_down.weight"


def test_rank_graphs_with_different_collectives_are_refused():
    def graph(op):
        b = Builder("r", compiler=True)
        x = b.const(TensorType((2,), "f32"), "x")
        b.result(b.eqn(op, x))
        return b.finish()
    x = np.ones(2, np.float32)
    with pytest.raises(GraphError, match="different collectives"):
        evaluate_ranks([graph(O.AllReduce(2)), graph(O.AllGather(2))], [[x], [x]])
    got = evaluate_ranks([graph(O.AllGather(2)), graph(O.AllGather(2))], [[x], [2 * x]])
    np.testing.assert_array_equal(got[1][0], [1, 1, 2, 2])


# -- compiled, planned and run ---------------------------------------------------------
def run_sharded(step, consts, ranks, steps):
    """Each rank compiled, planned and run for `steps` (slot dicts); the result per step."""
    group = LocalGroup(ranks)
    device = get_backend("reference").default_device()

    def rank(rg):
        comm = group.member(rg.rank)
        compiled = poot.compile(rg.graph, "reference", communicator=comm)
        ex = Executor(plan(compiled), rg.consts(consts),
                      runtime=ReferenceRuntime(device, communicator=comm))
        return compiled, [ex.step(s).result for s in steps]
    return run_ranks(group, [lambda rg=rg: rank(rg) for rg in shard_step(step, ranks)])


@pytest.mark.parametrize("config, ranks, kv", [(SMOL, 2, "dense"), (tiny_config(), 3, "paged")],
                         ids=["smollm2-shape-2-dense", "tiny-3-paged"])
def test_compiled_rank_graphs_equal_the_unsharded_model(config, ranks, kv):
    """Two steps (a prefill of two tokens, then one more at the next positions) so the KV
    state each rank keeps is read back."""
    batch = 2 if kv == "paged" else 1
    w = random_weights(config, seed=5)
    pool = config.max_seq * batch if kv == "paged" else None
    step = build_decoder(config, w, tokens=2, batch=batch, kv=kv, pool_slots=pool,
                         stack_qkv=False, stack_ffn=False)
    consts = const_inputs(step, w)
    rng = np.random.default_rng(1)
    first = slots(config, kv, 2, batch, rng)
    second = dict(first, tokens=first["tokens"][::-1].copy())
    second["pos"] = first["pos"] + 2
    if kv == "paged":
        second["write_map"] = first["write_map"] + 2
    state = {k: np.zeros_like(v) for k, v in states(step.graph, rng).items()}
    outs = evaluate(step.graph, {**consts, **first, **state})
    nxt = {step.graph.meta(o.input).identity.label: a
           for o, a in zip(step.graph.outputs(), outs) if o.kind.name == "STATE_NEXT"}
    want = [outs[0], evaluate(step.graph, {**consts, **second, **nxt})[0]]
    got = run_sharded(step, consts, ranks, [first, second])
    for compiled, results in got:
        names = {e.op.name for e in compiled.graph.eqns()}
        # a dense step of several tokens attends token by token (TokenMajorAttention)
        attention = {"PagedAttention"} if kv == "paged" else {"Attention", "TokenMajorAttention"}
        assert {"AllReduce", "AllGather", "FusedRow"} <= names and attention & names
        for g, w_ in zip(results, want, strict=True):
            assert np.abs(g - w_).max() <= 1e-5 * np.abs(w_).max()


@pytest.mark.parametrize("precision", ["exact", "fast"])
def test_rank_stages_keep_packed_contractions_and_fast_equals_unsharded(smollm2_gguf,
                                                                        precision):
    """A weight's dequant belongs to the stage of the contraction that reads it, so every
    rank's projections are packed contractions (int8 rows under `fast`), and the ranks'
    logits equal the unsharded model compiled at the same precision."""
    from poot.compiler import Policy
    from poot.models.loader import open_model
    from poot.models.weights import CheckpointWeights

    ckpt, config = open_model(str(smollm2_gguf), max_seq=8)
    config = replace(config, max_seq=8, layers=2)
    w = CheckpointWeights(ckpt, config)
    step = build_decoder(config, w, tokens=2, stack_qkv=False, stack_ffn=False,
                         kv_dtype="f16" if precision == "fast" else "f32")
    labels = {step.graph.meta(v).identity.label for v in step.graph.consts()}
    consts = {k: v for k, v in {**w.arrays, **step.consts}.items() if k in labels}
    policy = Policy(precision=precision)
    first = {"tokens": np.array([1, 504], np.int32), "pos": np.array([0], np.int32)}
    want = Executor(plan(poot.compile(step.graph, "reference", policy=policy)),
                    consts).step(first).result
    group, device = LocalGroup(2), get_backend("reference").default_device()
    contraction = "Q8PackedContraction" if precision == "fast" else "PackedContraction"

    def rank(rg):
        comm = group.member(rg.rank)
        compiled = poot.compile(rg.graph, "reference", communicator=comm, policy=policy)
        names = [e.op.name for e in compiled.graph.eqns()]
        assert "PackedDequant" not in names and "MatMul" not in names
        assert contraction in names
        ex = Executor(plan(compiled), rg.consts(consts),
                      runtime=ReferenceRuntime(device, communicator=comm))
        return ex.step(first).result
    for got in run_ranks(group, [lambda rg=rg: rank(rg) for rg in shard_step(step, 2)]):
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def rank_graph(consts=False):
    c = replace(tiny_config(), layers=1)
    w = random_weights(c)
    step = build_decoder(c, w, tokens=1, stack_qkv=False, stack_ffn=False)
    rg = shard_step(step, 2)[0]
    return (rg.graph, rg.consts(const_inputs(step, w))) if consts else rg.graph


def test_a_step_with_stacked_qkv_is_refused_by_name():
    c = replace(tiny_config(), layers=1)
    step = build_decoder(c, random_weights(c), tokens=1)     # q|k|v stacked by default
    with pytest.raises(ShardError, match=r"blk.0.attn_q.weight\+blk.0.attn_k.weight\+"
                                         r"blk.0.attn_v.weight stacks several tensors"):
        shard_step(step, 2)


def test_collectives_without_a_communicator_are_refused():
    with pytest.raises(UnsupportedOp, match="AllReduce.* cut between stages"):
        poot.compile(rank_graph(), "reference")
    table = get_backend("reference").capabilities(get_backend("reference").default_device())
    t = TensorType((4, 8), "f32")
    with pytest.raises(UnsupportedOp, match="AllReduce over 2 ranks: no communicator"):
        table.check(O.AllReduce(2), [t], t)
    table.check(O.AllReduce(1), [t], t)       # one rank: the identity


def test_the_communicator_declares_the_collectives_for_its_group_only():
    group = LocalGroup(2)
    ref = get_backend("reference")
    table = ref.capabilities(ref.default_device()).with_communicator(group.member(0))
    t = TensorType((4, 8), "f32")
    table.check(O.AllReduce(2), [t], t)
    table.check(O.AllGather(2, 0), [t], TensorType((8, 8), "f32"))
    with pytest.raises(UnsupportedOp, match="AllReduce over 4 ranks: the runtime's "
                                            "communicator has 2"):
        table.check(O.AllReduce(4), [t], t)
    with pytest.raises(UnsupportedOp, match="AllReduce over 2 ranks"):
        poot.compile(rank_graph(), "reference", communicator=LocalGroup(4).member(0))


def test_a_runtime_without_a_communicator_refuses_a_plan_with_collectives():
    graph, consts = rank_graph(consts=True)
    compiled = poot.compile(graph, "reference", communicator=LocalGroup(2).member(0))
    p = plan(compiled)
    assert [s.lowering.kernel for s in p.steps if s.lowering.extra.get("collective")][:1] == \
        ["AllReduce"]
    with pytest.raises(UnsupportedOp, match=r"needs a communicator of 2 ranks; this runtime "
                                            r"has none \[op=AllReduce, backend=reference"):
        Executor(p, consts, runtime=ReferenceRuntime(get_backend("reference").default_device()))
