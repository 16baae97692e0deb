"""rope_fusion: rotate-half chains become Rope; near misses stay, with the reason."""
from __future__ import annotations

import poot
import pytest
from poot import ops
from poot.compiler.validate import validated_pass
from poot.ir.types import SlotKind


def rope_graph(shape, rot, tokens_first=False):
    t = shape[-2] if not tokens_first else shape[-3]

    def fn(x, cos_t, sin_t, pos):
        positions = ops.positions(pos, t)
        if tokens_first:
            positions = ops.reshape(positions, (1, t))
        y = ops.rope_partial(x, cos_t, sin_t, positions, rot, tokens_first=tokens_first)
        return y

    return poot.trace(fn, poot.spec(shape, name="x"), poot.spec((16, rot // 2), name="cos"),
                      poot.spec((16, rot // 2), name="sin"),
                      poot.spec((1,), "i32", name="pos", kind="slot", slot=SlotKind.POS,
                                bound=16 - t + 1))


@pytest.mark.parametrize("shape,rot,tokens_first", [
    ((4, 3, 16), 16, False),        # heads first, whole head
    ((2, 5, 12), 8, False),         # partial rotary: features past rot pass through
    ((1, 3, 4, 16), 16, True),      # tokens first, rows broadcast over heads
])
def test_rope_fusion(shape, rot, tokens_first):
    g = rope_graph(shape, rot, tokens_first)
    out, rec = validated_pass(g, "rope_fusion", seed=rot)
    ropes = [e for e in out.eqns() if e.op.name == "Rope"]
    assert len(ropes) == 1 and ropes[0].op.rot == rot
    assert not {"Concat", "Slice", "Gather"} - {"Gather"} & {e.op.name for e in out.eqns()}
    assert rec.rewrites == 1 and len(out.eqns()) < len(g.eqns())


def test_rope_not_rewritten_when_a_piece_is_read_elsewhere():
    g = poot.trace(lambda x, c, s: ops.witness(ops.concat(
        [ops.sub(ops.mul(ops.slice_axis(x, -1, 0, 4), c), ops.mul(ops.slice_axis(x, -1, 4, 8), s)),
         ops.mul(ops.slice_axis(x, -1, 0, 4), c)], -1), "y"),
        poot.spec((3, 8)), poot.spec((3, 4)), poot.spec((3, 4)))
    out, rec = validated_pass(g, "rope_fusion")
    assert rec.rewrites == 0 and "Rope" not in {e.op.name for e in out.eqns()}
    assert "not Rope's definition" in str(rec.decisions[0])


def test_bf16_rope():
    g = poot.trace(lambda x, c, s: rotate_half(x, ops.cast(c, "bf16"), ops.cast(s, "bf16")),
                   poot.spec((3, 8), "bf16"), poot.spec((3, 4)), poot.spec((3, 4)))
    out, rec = validated_pass(g, "rope_fusion")
    assert rec.rewrites == 1 and str(out.type_of(out.result()).dtype) == "bf16"


def rotate_half(x, c, s, witness_x1=False):
    x1, x2 = ops.slice_axis(x, -1, 0, 4), ops.slice_axis(x, -1, 4, 8)
    if witness_x1:
        ops.witness(x1, "x1")
    return ops.concat([ops.sub(ops.mul(x1, c), ops.mul(x2, s)),
                       ops.add(ops.mul(x1, s), ops.mul(x2, c))], -1)


@pytest.mark.parametrize("witness", [False, True])
def test_a_witness_inside_the_chain_blocks_the_rewrite(witness):
    g = poot.trace(lambda x, c, s: rotate_half(x, c, s, witness),
                   poot.spec((3, 8)), poot.spec((3, 4)), poot.spec((3, 4)))
    out, rec = validated_pass(g, "rope_fusion")
    assert rec.rewrites == (0 if witness else 1)
    if witness:
        assert "also read outside it" in rec.decisions[0].reason
        assert [o.label for o in out.outputs()] == [None, "x1"]


def kv_write_graph(read_rotated: bool):
    """Rotated keys [1, 3, 2, 16] written to a pool [11, 2, 16] at three slots (rope_fusion
    first, as the pipeline runs it); `read_rotated`: the rotated keys are also an output."""
    def fn(pool, x, cos_t, sin_t, pos, slots):
        k = ops.rope_partial(x, cos_t, sin_t, ops.reshape(ops.positions(pos, 3), (1, 3)), 12,
                             tokens_first=True)
        out = ops.kv_write_paged(pool, ops.reshape(k, (3, 2, 16)), slots)
        if read_rotated:
            ops.witness(k, "k")
        return out

    g = poot.trace(fn, poot.spec((11, 2, 16), name="pool"), poot.spec((1, 3, 2, 16), name="x"),
                   poot.spec((16, 6), name="cos"), poot.spec((16, 6), name="sin"),
                   poot.spec((1,), "i32", name="pos", kind="slot", slot=SlotKind.POS, bound=14),
                   poot.spec((3,), "i32", name="slots", kind="slot", slot=SlotKind.WRITE_MAP,
                             bound=11))
    return validated_pass(g, "rope_fusion")[0]


@pytest.mark.parametrize("read_rotated", [False, True])
def test_a_kv_write_of_rotated_keys_becomes_one_rope_scatter(read_rotated):
    g = kv_write_graph(read_rotated)
    out, rec = validated_pass(g, "rope_scatter", seed=3)
    names = [e.op.name for e in out.eqns()]
    if read_rotated:       # the rotated keys are needed apart: nothing fuses
        assert rec.rewrites == 0 and "RopeScatter" not in names
        assert "read elsewhere" in rec.decisions[0].reason
    else:
        assert rec.rewrites == 1 and names.count("RopeScatter") == 1
        assert "Rope" not in names and "ScatterUpdate" not in names
