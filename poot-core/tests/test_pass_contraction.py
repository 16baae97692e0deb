"""Dense and packed contractions: checkpoint weights contracted where they lie."""
from __future__ import annotations

from collections import Counter

import poot
import pytest
from poot import ops
from poot.compiler.validate import validated_pass
from poot.formats import PackedWeight
from poot.ir.types import SlotKind

TOKENS = dict(kind="slot", slot=SlotKind.TOKEN)


def names(g) -> Counter:
    return Counter(e.op.name for e in g.eqns())


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("x_shape", [(3, 16), (2, 3, 16)])
def test_dense_linear(dtype, x_shape):
    g = poot.trace(lambda x, w, b: ops.linear(x, w, b), poot.spec(x_shape, name="x"),
                   poot.spec((12, 16), dtype, name="w"), poot.spec((12,), name="b"))
    out, rec = validated_pass(g, "dense_contraction", seed=len(x_shape))
    n = names(out)
    assert n["DenseContraction"] == 1 and not {"MatMul", "Transpose", "Cast", "Reshape"} & set(n)
    (dc,) = [e for e in out.eqns() if e.op.name == "DenseContraction"]
    assert out.type_of(dc.inputs[1].id).dtype.value == dtype          # no widened copy
    assert out.type_of(dc.out).shape == x_shape[:-1] + (12,)          # x read as [..., M, K]


def test_f16_words_weight():
    w = PackedWeight("dense:f16words", (12, 16))
    g = poot.trace(lambda x, *src: ops.linear(x, ops.PackedTensor(w, src)),
                   poot.spec((3, 16), name="x"), poot.spec((12, 8), "u32", name="words"))
    out, _ = validated_pass(g, "dense_contraction")
    (dc,) = out.eqns()
    assert dc.op.name == "DenseContraction" and str(out.type_of(dc.inputs[1].id).dtype) == "u32"


def test_row_gather_of_a_bf16_table_and_a_tied_head():
    def fn(table, ids):
        rows = ops.embedding(table, ids)                  # Gather + Cast to f32
        return ops.linear(rows, table)                    # the same table as the head

    g = poot.trace(fn, poot.spec((10, 8), "bf16", name="table"),
                   poot.spec((4,), "i32", name="ids", bound=10, **TOKENS))
    out, rec = validated_pass(g, "dense_contraction")
    assert names(out) == Counter({"DenseRowGather": 1, "DenseContraction": 1})


def test_grouped_projection():
    def fn(a, w):
        w3 = ops.transpose(ops.reshape(w, (3, 5, 8)), (0, 2, 1))
        return ops.matmul(a, ops.cast(w3, "f32"))

    g = poot.trace(fn, poot.spec((3, 4, 8), name="a"), poot.spec((15, 8), "bf16", name="w"))
    out, _ = validated_pass(g, "dense_contraction")
    (gc,) = out.eqns()
    assert gc.op.name == "GroupedDenseContraction" and gc.op.groups == 3


def test_not_a_checkpoint_weight_stays():
    g = poot.trace(lambda x, w: ops.linear(x, ops.exp(w)), poot.spec((3, 8)), poot.spec((4, 8)))
    out, rec = validated_pass(g, "dense_contraction")
    assert rec.rewrites == 0 and "not a binder" in rec.decisions[0].reason


def test_shared_widening_stays_for_its_other_reader():
    def fn(x, w):
        wf = ops.cast(w, "f32")
        return ops.add(ops.matmul(x, ops.transpose(wf, (1, 0))), ops.reduce_sum(wf))

    g = poot.trace(fn, poot.spec((3, 8)), poot.spec((4, 8), "bf16"))
    out, rec = validated_pass(g, "dense_contraction")
    n = names(out)
    assert n["DenseContraction"] == 1 and n["Cast"] == 1 and "Transpose" not in n


@pytest.mark.parametrize("fmt", ["gguf:Q4_0", "gguf:Q8_0", "dense:f16words"])
def test_packed_linear_and_embedding(fmt):
    w = PackedWeight(fmt, (8, 64))
    specs = [poot.spec(s.type.shape, s.type.dtype, name=f"w.{s.role}") for s in w.sources()]

    def fn(ids, x, *src):
        table = ops.PackedTensor(w, src)
        rows = ops.reduce_sum(ops.embedding(table, ids), -1, keepdim=True)   # [3, 1]
        return ops.add(ops.linear(x, table), rows)

    g = poot.trace(fn, poot.spec((3,), "i32", name="ids", bound=8, **TOKENS),
                   poot.spec((2, 3, 64), name="x"), *specs)
    out, rec = validated_pass(g, "packed_contraction", seed=7)
    n = names(out)
    assert n["PackedRowGather"] == 1 and n["PackedContraction"] == 1
    assert not {"PackedDequant", "MatMul", "Gather", "Reshape"} & set(n)


def test_packed_moe_expert_stack():
    e, n, k, m = 4, 8, 32, 5
    w = PackedWeight("gguf:Q8_0", (e * n, k))
    specs = [poot.spec(s.type.shape, s.type.dtype, name=f"experts.{s.role}") for s in w.sources()]

    def fn(x, idx, *src):
        stack = ops.reshape(ops.PackedTensor(w, src).dequant(), (e, n, k))
        return ops.indexed_matmul(x, ops.transpose(stack, (0, 2, 1)), idx)

    g = poot.trace(fn, poot.spec((m, k), name="x"),
                   poot.spec((m,), "i32", name="idx", bound=e, **TOKENS), *specs)
    out, _ = validated_pass(g, "packed_contraction")
    (ipc,) = out.eqns()
    assert ipc.op.name == "IndexedPackedContraction" and ipc.op.experts == e
