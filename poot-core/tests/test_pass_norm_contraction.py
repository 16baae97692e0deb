"""norm_contraction: an RMSNorm read only as the activation of weight contractions of a
decode step goes into each of them (NormedPackedContraction, NormedDenseContraction); any
other reader, a wide step or a target that does not declare the op keeps the norm's own
FusedRow."""
from __future__ import annotations

from collections import Counter

import poot
import pytest
from poot.compiler import LimitedBackend, Policy
from poot.compiler.validate import validate
from poot.models.llama import build_decoder, const_inputs, random_weights, tiny_config
from poot.plugin import get_backend


def compiled_step(fmt="gguf:Q4_0", tokens=1, target="reference", stack_qkv=True,
                  stack_ffn=True, **kw):
    config = tiny_config(layers=1)
    weights = random_weights(config, seed=3, dtype="f32", packed_format=fmt)
    step = build_decoder(config, weights, tokens=tokens, stack_qkv=stack_qkv,
                         stack_ffn=stack_ffn)
    return step, weights, poot.compile(step.graph, target, **kw)


def test_a_decode_steps_norms_go_into_its_packed_contractions():
    step, weights, compiled = compiled_step()
    ops = Counter(e.op.name for e in compiled.graph.eqns())
    heads = Counter(e.op.head.name for e in compiled.graph.eqns()
                    if e.op.name == "ContractionEpilogue")
    # q|k|v, gate|up and the head take their norm (gate and up apart: both take it, up
    # as its epilogue's head)
    assert ops["NormedPackedContraction"] == 3 and not heads["NormedPackedContraction"]
    assert not {"FusedRow", "PackedContraction"} & set(ops)
    validate(step.graph, compiled.graph, seed=1, trials=2, given=const_inputs(step, weights))
    step, weights, compiled = compiled_step(stack_ffn=False)
    ops = Counter(e.op.name for e in compiled.graph.eqns())
    heads = Counter(e.op.head.name for e in compiled.graph.eqns()
                    if e.op.name == "ContractionEpilogue")
    assert ops["NormedPackedContraction"] == 3 and heads["NormedPackedContraction"] == 1
    validate(step.graph, compiled.graph, seed=1, trials=2, given=const_inputs(step, weights))


def test_the_pass_can_be_turned_off():
    _, _, compiled = compiled_step(policy=Policy(disable={"norm_contraction"}))
    ops = Counter(e.op.name for e in compiled.graph.eqns())
    assert ops["FusedRow"] == 3 and "NormedPackedContraction" not in ops


def test_dense_weights_take_the_norm_too():
    step, weights, compiled = compiled_step(None)
    ops = Counter(e.op.name for e in compiled.graph.eqns())
    assert ops["NormedDenseContraction"] == 3 and not {"FusedRow", "DenseContraction"} & set(ops)
    validate(step.graph, compiled.graph, seed=1, trials=2, given=const_inputs(step, weights))


@pytest.mark.parametrize("fmt", [None, "gguf:Q4_0"])
def test_wide_steps_keep_the_norm(fmt):
    _, _, compiled = compiled_step(fmt, 8)                # a prefill chunk's norm
    ops = Counter(e.op.name for e in compiled.graph.eqns())
    assert ops["FusedRow"] == 3 and not {"NormedPackedContraction",
                                         "NormedDenseContraction"} & set(ops)
    assert "8 rows" in compiled.explain()


def test_a_norm_of_more_than_two_readers_stays_a_kernel():
    """q, k and v apart: a K/V projection that splits K would run the norm apart once
    each; the FFN's norm still goes into gate and up."""
    _, _, compiled = compiled_step(stack_qkv=False)
    ops = Counter(e.op.name for e in compiled.graph.eqns())
    assert ops["FusedRow"] == 1 and ops["PackedContraction"] == 3
    assert "3 readers" in compiled.explain()


def test_a_target_that_does_not_declare_it_keeps_the_norm():
    ref = get_backend("reference")
    target = (LimitedBackend(ref, {"NormedPackedContraction"}), None)
    _, _, compiled = compiled_step(target=target)
    ops = Counter(e.op.name for e in compiled.graph.eqns())
    assert ops["FusedRow"] == 3 and "NormedPackedContraction" not in ops
    assert "target refuses" in compiled.explain()


class _NormsUnelected(LimitedBackend):
    """The reference backend with the normed contractions declared but not elected."""

    def capabilities(self, device):
        from dataclasses import replace

        return replace(super().capabilities(device), unelected=NORMS)


NORMS = frozenset({"NormedPackedContraction", "NormedDenseContraction"})


@pytest.mark.parametrize("stack_ffn", [True, False], ids=["gate_up", "up_as_epilogue_head"])
def test_an_unelected_norm_is_formed_only_where_the_policy_asks(stack_ffn):
    target = (_NormsUnelected(get_backend("reference"), ()), None)
    _, _, plain = compiled_step(target=target, stack_ffn=stack_ffn)
    ops = Counter(e.op.name for e in plain.graph.eqns())
    assert ops["FusedRow"] == 3 and not NORMS & set(ops)
    assert "NormedPackedContraction is declared but not elected" in plain.explain()
    step, weights, asked = compiled_step(target=target, stack_ffn=stack_ffn,
                                         policy=Policy(fuse=NORMS))
    ops = Counter(e.op.name for e in asked.graph.eqns())
    heads = Counter(e.op.head.name for e in asked.graph.eqns()
                    if e.op.name == "ContractionEpilogue")
    assert "FusedRow" not in ops and ops["NormedPackedContraction"] == 3
    assert heads["NormedPackedContraction"] == (not stack_ffn)
    validate(step.graph, asked.graph, seed=1, trials=2, given=const_inputs(step, weights))


def test_a_policy_cannot_ask_for_an_unknown_op():
    from poot.compiler import PolicyError

    with pytest.raises(PolicyError, match="Nonsense"):
        Policy(fuse={"NormedPackedContraction", "Nonsense"})


def test_the_op_refuses_operands_it_cannot_type():
    from poot.dtypes import DType
    from poot.errors import ShapeError
    from poot.formats import PackedWeight
    from poot.ir.ops import NormedPackedContraction
    from poot.ir.types import TensorType

    w = PackedWeight("dense:f16words", (8, 64))
    op, src = NormedPackedContraction(w, 1e-5), [s.type for s in w.sources()]
    f32 = lambda *shape: TensorType(shape, DType.F32)  # noqa: E731
    for ins, why in (([f32()], "takes x, g"), ([f32(64), f32(64), *src], "rank >= 2"),
                     ([f32(1, 64), f32(32), *src], r"norm weight must be f32\[64\]")):
        with pytest.raises(ShapeError, match=why):
            op.infer(ins)
    assert op.infer([f32(1, 64), f32(64), *src]) == f32(1, 8)
