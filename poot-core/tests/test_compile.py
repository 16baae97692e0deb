"""The whole pipeline on Llama decoder steps: the oracle agrees before and after compile,
and the composites the spec promises are found (counted)."""
from __future__ import annotations

from collections import Counter

import poot
import pytest
from poot.compiler import PASSES, Compiled, LimitedBackend, Policy, PolicyError, run_pass
from poot.compiler.validate import validate
from poot.errors import UnknownBackend
from poot.models.llama import build_decoder, const_inputs, random_weights, tiny_config
from poot.plugin import get_backend

CASES = [  # tokens, kv, dtype, packed format
    (1, "dense", "f32", None),
    (5, "dense", "f32", None),
    (1, "paged", "f32", None),
    (3, "paged", "bf16", None),
    (1, "dense", "f16", None),
    (2, "dense", "f32", "dense:f16words"),
    (1, "dense", "f32", "gguf:Q8_0"),
    (4, "paged", "f32", "gguf:Q4_0"),
]


def compile_step(layers=1, tokens=1, kv="dense", dtype="f32", fmt=None, **kw):
    config = tiny_config(layers=layers)
    weights = random_weights(config, seed=layers + tokens, dtype=dtype, packed_format=fmt)
    step = build_decoder(config, weights, tokens=tokens, kv=kv, batch=2 if kv == "paged" else 1)
    return step, weights, poot.compile(step.graph, "reference", **kw)


@pytest.mark.parametrize("tokens,kv,dtype,fmt", CASES)
def test_decoder_step_keeps_the_oracle(tokens, kv, dtype, fmt):
    step, weights, compiled = compile_step(2, tokens, kv, dtype, fmt)
    consts = const_inputs(step, weights)
    g = step.graph
    for name, _ in PASSES:                       # after every pass, not only at the end
        g, _ = run_pass(g, name, "reference")
        validate(step.graph, g, seed=tokens, trials=1, given=consts)
    assert str(g) == str(compiled.graph)
    validate(step.graph, compiled.graph, seed=tokens + 1, given=consts)
    ops = Counter(e.op.name for e in compiled.graph.eqns())
    # a paged step reads its KV pool through the slot map inside the attention kernel, and
    # writes its rotated keys straight to the pool
    # a dense one-token step rotates its q and k heads (adjacent rows of one result) at once,
    # and writes k's rows rotated straight to the cache (read before the rotation); a wider
    # one rotates q and k apart and writes k's rows straight to the cache, head by head
    one = tokens == 1 and kv == "dense"
    # (a dense step of several tokens over its query rows as they are: TokenMajorAttention)
    assert ops["PagedAttention" if kv == "paged" else "Attention" if one
               else "TokenMajorAttention"] == 2
    assert (ops["Rope"], ops["RopeScatter"], ops["RopeUpdateSlice"]) == (
        (2, 2, 0) if kv == "paged" else (2, 0, 2))
    assert not {"MatMul", "Reduce", "Concat", "PackedDequant"} & set(ops)
    contraction = "PackedContraction" if fmt and fmt.startswith("gguf") else "DenseContraction"
    normed = "Normed" + contraction
    heads = Counter(e.op.head.name for e in compiled.graph.eqns()
                    if e.op.name == "ContractionEpilogue")
    # the RMSNorms of a step of at most 4 rows go into the contractions reading them, but
    # one that q, k and v read apart (a step of several tokens) stays a kernel
    if one:
        assert ops["FusedRow"] == 0 and ops[normed] == 2 * 2 + 1
        contraction = normed
    elif tokens * (2 if kv == "paged" else 1) <= 4:
        assert ops["FusedRow"] == 2 and ops[normed] + heads[normed] == 2 * 2 + 1
        assert ops[contraction] == 2 * 3                  # q, k, v
    else:
        assert ops["FusedRow"] == 2 * 2 + 1
    # q, k and v read one weight stacked by rows, and so do gate and up: a step of one
    # token computes each stack in one contraction whose rows Slices take (views at plan
    # time: q|k and v, then q and k of the rotated q|k; gate and up, whose SwiGLU the
    # down projection computes as its prologue), a wider step each over its rows of the
    # weight (five Slices of them); o and down (and a wider step's gate) inside epilogues,
    # the head alone. Past 4 rows (the norms apart) gate and up are one GatedContraction
    # over the whole stack again (stacked_gate): three Slices, the SwiGLU in it.
    wide = not one and tokens * (2 if kv == "paged" else 1) > 4
    if one or wide:
        assert ops[contraction] == 2 * (2 if one else 3) + 1
    assert ops["GatedContraction"] == (2 if wide else 0)
    assert ops["Slice"] == 2 * (6 if one else 3 if wide else 5)
    assert ops["ContractionEpilogue"] == 2 * (2 if one or wide else 3)
    assert ops["Fused"] == 1                           # the mask


def layer_counts(layers: int) -> tuple[int, Counter]:
    _, _, compiled = compile_step(layers)
    return len(compiled.graph.eqns()), Counter(e.op.name for e in compiled.graph.eqns())


def test_decoder_layer_counted():
    """One Llama layer: each RMSNorm inside the contraction that reads it, softmax into
    Attention, rotate-half -> one Rope over the q|k heads, then k's rows cut before it and
    rotated into the cache by RopeUpdateSlice (the Rope keeps q's), q|k|v -> one
    contraction over the stacked weight (its rows Slices: q|k and v, then q and k of the
    q|k), gate|up likewise (Slices gate and up, whose SwiGLU down computes in its
    prologue), o and down -> one contraction each with the residual adds in their
    epilogues."""
    (n1, ops1), (n2, ops2) = layer_counts(1), layer_counts(2)
    per_layer = ops2 - ops1
    print(f"\ncompiled decode step: 1 layer {n1} eqns, 2 layers {n2} eqns; one layer adds "
          f"{n2 - n1}: {dict(sorted(per_layer.items()))}")
    assert per_layer["Attention"] == 1
    assert per_layer["Rope"] == 1                   # q's
    assert per_layer["NormedDenseContraction"] == 2  # attn_norm -> q|k|v, ffn_norm -> gate|up
    assert per_layer["Slice"] == 6                  # q|k, v; q, k; gate, up
    assert per_layer["ContractionEpilogue"] == 2    # o + residual, SwiGLU -> down + residual
    assert per_layer["DynamicUpdateSlice"] == 1     # v; k's is RopeUpdateSlice's
    assert per_layer["RopeUpdateSlice"] == 1
    assert not {"MatMul", "Reduce", "Unary", "Concat", "Cast", "Gather"} & set(per_layer)
    # one token: the four head Transposes move only unit axes, so they are Reshapes (k's
    # two go inside RopeUpdateSlice)
    assert per_layer == Counter({"Reshape": 7}) + Counter(
        Attention=1, Rope=1, NormedDenseContraction=2, Slice=6, ContractionEpilogue=2,
        DynamicUpdateSlice=1, RopeUpdateSlice=1)  # the RoPE rows are gathered once (cse)
    assert n2 - n1 == 21 and n1 == 30


def test_epilogue_bodies_hold_the_residual_and_the_gate():
    """A wider step's gate takes the SwiGLU in its epilogue; one token's gate|up halves
    meet in the down projection's prologue (both come from one contraction)."""
    def bodies(tokens: int) -> Counter:
        _, _, compiled = compile_step(1, tokens)
        ops = [eq.op for eq in compiled.graph.eqns() if eq.op.name == "ContractionEpilogue"]
        ops += [op.head for op in ops if op.head.name == "ContractionPrologue"]
        return Counter(tuple(sorted(repr(e.op) for e in op.body.eqns())) for op in ops)
    swiglu = ("Add", "Div", "Exp", "Mul", "Neg")
    assert bodies(2) == Counter({("Add",): 2, swiglu: 1})
    assert bodies(1) == Counter({("Add",): 2, swiglu: 1})


def test_compiled_carries_its_target():
    _, _, compiled = compile_step(1)
    assert isinstance(compiled, Compiled)
    assert compiled.backend.name == "reference" and compiled.device.backend == "reference"
    assert compiled.table.backend == "reference"
    assert compiled.report.passes[0].name == "collectives"
    assert "Attention at" in compiled.report.explain() and "rewritten graph:" in \
        compiled.explain()


def test_target_forms():
    g = compile_step(1)[0].graph
    ref = get_backend("reference")
    assert poot.compile(g, (ref, None)).backend is ref
    assert poot.compile(g, ("reference", ref.default_device())).device == ref.default_device()
    assert poot.compile(g).graph is not None          # best available backend
    with pytest.raises(UnknownBackend, match="no-such"):
        poot.compile(g, "no-such")
    with pytest.raises(UnknownBackend, match="target must be"):
        poot.compile(g, 42)


def test_policy_and_target_decide_attention():
    step, weights, never = compile_step(1, policy=Policy(attention="never"))
    assert "Attention" not in {e.op.name for e in never.graph.eqns()}
    assert "policy.attention is 'never'" in never.report.explain(graph=False)
    validate(step.graph, never.graph, given=const_inputs(step, weights))
    limited = poot.compile(step.graph, "reference", policy=Policy(attention_max_keys=8))
    assert "exceed policy.attention_max_keys=8" in limited.report.explain(graph=False)
    ref = get_backend("reference")
    lacking = poot.compile(step.graph, (LimitedBackend(ref, {"Attention", "Rope"}), None))
    names = {e.op.name for e in lacking.graph.eqns()}
    assert "Attention" not in names and "Rope" not in names
    assert "does not lower Attention" in lacking.report.explain(graph=False)
    validate(step.graph, lacking.graph, given=const_inputs(step, weights))
    with pytest.raises(PolicyError, match="'auto' or 'never'"):
        Policy(attention="sometimes")


def test_disabled_passes_are_reported():
    _, _, compiled = compile_step(1, policy=Policy(disable={"epilogue", "fusion"}))
    names = {e.op.name for e in compiled.graph.eqns()}
    assert "ContractionEpilogue" not in names and "FusedRow" not in names
    assert compiled.report["epilogue"].skipped == "disabled by policy"


def test_the_spec_decode_attention_layer():
    from poot.models.examples import decode_attention_layer

    g = decode_attention_layer()
    compiled = poot.compile(g, "reference")
    validate(g, compiled.graph, seed=9)
    # Pos + Iota, its reshape, the mask (Ge, Select) as one region, then one Attention
    assert [e.op.name for e in compiled.graph.eqns()] == ["Binary", "Reshape", "Fused",
                                                          "Attention"]


def test_packed_moe_block():
    """A top-2 MoE FFN over a Q8_0 expert stack: the router, then one indexed packed
    contraction per routing slot, weighted and summed; the oracle agrees."""
    from poot import ops
    from poot.formats import PackedWeight

    t, d, e, n = 4, 32, 4, 16
    experts = PackedWeight("gguf:Q8_0", (e * n, d))
    src_specs = [poot.spec(s.type.shape, s.type.dtype, name=f"experts.{s.role}")
                 for s in experts.sources()]

    def block(x, router, *src):
        ids, weights = ops.moe_route(ops.linear(x, router), 2)
        stack = ops.transpose(ops.reshape(ops.PackedTensor(experts, src).dequant(), (e, n, d)),
                              (0, 2, 1))
        out = None
        for j in range(2):
            idx = ops.reshape(ops.slice_axis(ids, 1, j, j + 1), (t,))
            y = ops.mul(ops.indexed_matmul(x, stack, idx), ops.slice_axis(weights, 1, j, j + 1))
            out = y if out is None else ops.add(out, y)
        return out

    g = poot.trace(block, poot.spec((t, d), name="x"), poot.spec((e, d), "bf16", name="router"),
                   *src_specs)
    compiled = poot.compile(g, "reference")
    validate(g, compiled.graph, seed=4)
    ops_after = Counter(e.op.name for e in compiled.graph.eqns())
    assert ops_after["IndexedPackedContraction"] == 0 and ops_after["ContractionEpilogue"] == 2
    heads = [q.op.head.name for q in compiled.graph.eqns() if q.op.name == "ContractionEpilogue"]
    assert heads == ["IndexedPackedContraction"] * 2
    assert "PackedDequant" not in ops_after and "IndexedMatMul" not in ops_after
