"""The kernel program and its interpreter: validation refusals and the execution-model
checks (races, missing barriers, divergent reductions, bounds)."""
from __future__ import annotations

import numpy as np
import pytest
from poot.codegen.builder import KernelBuilder
from poot.codegen.expr import Const, Load, Var, f32, i32
from poot.codegen.index import eq, lt
from poot.codegen.interp import KernelFault, run
from poot.codegen.program import (
    OUT,
    Access,
    Assign,
    AwaitInputs,
    For,
    GroupBarrier,
    Kernel,
    Let,
    LoadWide,
    Store,
    StoreWide,
    local_index,
)
from poot.dtypes import DType
from poot.errors import IRError
from poot.ir.ops import ReduceOp

F32, I32 = DType.F32, DType.I32
WG = 16


def neighbour_kernel(with_barrier: bool) -> Kernel:
    """Each thread publishes its value in shared memory and reads its neighbour's."""
    kb = KernelBuilder("neighbour", (2,), (WG,))
    x = kb.buffer("in0", F32, Access.READ, 2 * WG, operand=0)
    kb.buffer("out", F32, Access.WRITE, 2 * WG, operand=OUT)
    tile = kb.shared("tile", F32, WG)
    g = kb.let("g", Var("global_id_x"))
    kb.store(tile, local_index(), x[g])
    if with_barrier:
        kb.barrier()
    kb.store("out", g, tile[local_index() ^ i32(1)])
    return kb.finish()


def test_shared_memory_exchange_after_a_barrier():
    x = np.random.default_rng(0).standard_normal(2 * WG).astype(np.float32)
    out = np.zeros_like(x)
    run(neighbour_kernel(True), {"in0": x, "out": out})
    assert np.array_equal(out, x.reshape(-1, 2)[:, ::-1].reshape(-1))


def test_missing_barrier_is_a_race():
    x = np.ones(2 * WG, np.float32)
    with pytest.raises(KernelFault, match="missing Barrier"):
        run(neighbour_kernel(False), {"in0": x, "out": np.zeros_like(x)})


def async_kernel(waits: list[int]) -> Kernel:
    """Two committed batches of 16-byte copies (4 words a thread) into two tiles, then
    `waits`, a barrier and a read of the second tile."""
    kb = KernelBuilder("copies", (1,), (WG,))
    kb.buffer("in0", DType.U32, Access.READ, 8 * WG, operand=0)
    kb.buffer("out", DType.U32, Access.WRITE, WG, operand=OUT)
    tiles = [kb.shared(f"t{i}", DType.U32, 4 * WG) for i in range(2)]
    at = kb.let("at", local_index() * i32(4))
    for i, tile in enumerate(tiles):
        kb.copy_async(tile, at, kb.array("in0"), at + i32(4 * WG * i), i32(1))
        kb.copy_commit()
    for pending in waits:
        kb.copy_wait(pending)
    kb.barrier()
    kb.store("out", local_index(), tiles[1][(local_index() * i32(4) + i32(5)) & i32(4 * WG - 1)])
    return kb.finish()


@pytest.mark.parametrize("waits, lands", [([0], True), ([1], False), ([1, 0], True), ([], False)])
def test_async_copies_land_at_the_wait_that_covers_their_batch(waits, lands):
    """A read of a tile is legal once a CopyWait leaves none of its batch in flight: wait 1
    after two batches covers only the first."""
    x = np.arange(8 * WG, dtype=np.uint32)
    out = np.zeros(WG, np.uint32)
    if not lands:
        with pytest.raises(KernelFault, match="no CopyWait"):
            run(async_kernel(waits), {"in0": x, "out": out})
        return
    run(async_kernel(waits), {"in0": x, "out": out})
    assert np.array_equal(out, x[4 * WG:][(np.arange(WG) * 4 + 5) % (4 * WG)])


def test_reduction_widths_and_divergence():
    kb = KernelBuilder("groups", (1,), (WG,))
    x = kb.buffer("in0", I32, Access.READ, WG, operand=0)
    kb.buffer("out", I32, Access.WRITE, WG, operand=OUT)
    s = kb.reduce("s", ReduceOp.Sum, x[local_index()], 4)
    kb.store("out", local_index(), s)
    x0 = np.arange(WG, dtype=np.int32) * 3 - 7
    out = np.zeros(WG, np.int32)
    run(kb.finish(), {"in0": x0, "out": out})
    assert np.array_equal(out, np.repeat(x0.reshape(-1, 4).sum(1), 4))

    kb = KernelBuilder("divergent", (1,), (WG,))
    x = kb.buffer("in0", F32, Access.READ, WG, operand=0)
    kb.buffer("out", F32, Access.WRITE, 1, operand=OUT)
    with kb.if_(lt(local_index(), i32(8))):
        m = kb.reduce("m", ReduceOp.Max, x[local_index()])
        with kb.if_(eq(local_index(), i32(0))):
            kb.store("out", 0, m)
    with pytest.raises(KernelFault, match="part of a workgroup"):
        run(kb.finish(), {"in0": np.ones(WG, np.float32), "out": np.zeros(1, np.float32)})


@pytest.mark.parametrize("values, width, op", [(32, 32, ReduceOp.Sum), (8, 32, ReduceOp.Max),
                                               (1, 16, ReduceOp.Sum), (4, 8, ReduceOp.Sum)])
def test_reduce_scatter_leaves_each_sum_on_its_threads(values, width, op):
    """Thread t of a group of `width` gets the reduction of value (t % width) // (width //
    values) over its group; the kernel's 2 workgroups of 32 threads hold 64 / width
    groups."""
    threads = 32
    kb = KernelBuilder("scatter", (2,), (threads,))
    x = kb.buffer("in0", I32, Access.READ, 2 * threads * values, operand=0)
    kb.buffer("out", I32, Access.WRITE, 2 * threads, operand=OUT)
    g = kb.let("g", Var("global_id_x"))
    s = kb.reduce_scatter("s", op, [x[g * values + i] for i in range(values)], width)
    kb.store("out", g, s)
    x0 = np.random.default_rng(values).integers(-99, 99, 2 * threads * values).astype(np.int32)
    out = np.zeros(2 * threads, np.int32)
    run(kb.finish(), {"in0": x0, "out": out})
    per_group = x0.reshape(-1, width, values)
    fold = per_group.sum(1) if op is ReduceOp.Sum else per_group.max(1)     # [groups, values]
    pick = np.arange(width) // (width // values)
    assert np.array_equal(out, fold[:, pick].reshape(-1))


def test_reduce_scatter_refuses_more_values_than_threads():
    kb = KernelBuilder("too_many", (1,), (WG,))
    kb.buffer("in0", F32, Access.READ, WG, operand=0)
    kb.buffer("out", F32, Access.WRITE, WG, operand=OUT)
    s = kb.reduce_scatter("s", ReduceOp.Sum, [kb.let("v", Var("global_id_x").cast(F32))] * 8, 4)
    kb.store("out", local_index(), s)
    with pytest.raises(IRError, match="8 values over 4 threads"):
        kb.finish()


def test_double_store_and_out_of_range_are_refused():
    kb = KernelBuilder("same_slot", (1,), (WG,))
    kb.buffer("out", F32, Access.WRITE, WG, operand=OUT)
    kb.store("out", 0, Var("global_id_x").cast(F32))
    with pytest.raises(KernelFault, match="two threads"):
        run(kb.finish(), {"out": np.zeros(WG, np.float32)})

    kb = KernelBuilder("past_end", (1,), (WG,))
    x = kb.buffer("in0", F32, Access.READ, WG, operand=0)
    kb.buffer("out", F32, Access.WRITE, WG, operand=OUT)
    kb.store("out", local_index(), x[local_index() + i32(1)])
    with pytest.raises(KernelFault, match="out of range"):
        run(kb.finish(), {"in0": np.ones(WG, np.float32), "out": np.zeros(WG, np.float32)})


def _kernel(body, buffers=None) -> Kernel:
    from poot.codegen.program import BufferParam

    bufs = buffers or (BufferParam("in0", F32, Access.READ, 4, 0),
                       BufferParam("out", F32, Access.WRITE, 4, OUT))
    return Kernel("k", tuple(bufs), (1,), (4,), tuple(body))


def test_validation_refuses_malformed_programs():
    x = Var("x", F32)
    with pytest.raises(IRError, match="outside its scope"):
        _kernel([Store("out", i32(0), x)]).validate()
    with pytest.raises(IRError, match="read-only"):
        _kernel([Store("in0", i32(0), Var("local_id_x").cast(F32))]).validate()
    with pytest.raises(IRError, match="immutable"):
        _kernel([Let("x", i32(1).cast(F32)), Assign("x", i32(2).cast(F32))]).validate()
    with pytest.raises(IRError, match="declared twice"):
        _kernel([Let("x", i32(1)), Let("x", i32(2))]).validate()
    with pytest.raises(IRError, match="expected an f32"):
        _kernel([Store("out", i32(0), i32(1))]).validate()


def test_wide_loads_read_aligned_runs_of_words():
    """LoadWide: 4 consecutive elements a thread, from a buffer (before AwaitInputs: an
    early read) or a shared array; a misaligned start is a fault, 3 names or a local
    array a validation error."""
    kb = KernelBuilder("wide", (1,), (WG,))
    x = kb.buffer("in0", F32, Access.READ, 4 * WG, operand=0)
    kb.buffer("out", F32, Access.WRITE, 4 * WG, operand=OUT)
    tile = kb.shared("tile", F32, 4 * WG)
    first = kb.let("first", local_index() * i32(4))
    got = kb.load_wide("v", x, first, 4)
    kb.await_inputs()
    for j, v in enumerate(got):
        kb.store(tile, first + i32(j), v)
    kb.barrier()
    back = kb.load_wide("t", tile, i32(4 * (WG - 1)) - first, 4)
    for j, v in enumerate(back):
        kb.store("out", first + i32(j), v * 2.0)
    k = kb.finish()
    assert k.early_reads() == frozenset({0})
    data = np.arange(4 * WG, dtype=np.float32)
    out = np.zeros_like(data)
    run(k, {"in0": data, "out": out})
    assert np.array_equal(out, 2 * data.reshape(WG, 4)[::-1].reshape(-1))

    kb = KernelBuilder("misaligned", (1,), (WG,))
    x = kb.buffer("in0", F32, Access.READ, 4 * WG + 2, operand=0)
    kb.buffer("out", F32, Access.WRITE, WG, operand=OUT)
    kb.store("out", local_index(), kb.load_wide("v", x, local_index() * i32(4) + i32(2), 4)[0])
    with pytest.raises(KernelFault, match="misaligned"):
        run(kb.finish(), {"in0": np.zeros(4 * WG + 2, np.float32),
                          "out": np.zeros(WG, np.float32)})
    with pytest.raises(IRError, match="LoadWide of 3"):
        _kernel([LoadWide(("a", "b", "c"), Load("in0", i32(0), F32))]).validate()


def test_wide_stores_write_aligned_runs_of_elements():
    """StoreWide: 2 consecutive elements a thread to a buffer, 4 to a shared array; a
    misaligned start is a fault; 3 values, 2 bytes in all or a store before AwaitInputs a
    validation error."""
    kb = KernelBuilder("wide_store", (1,), (WG,))
    x = kb.buffer("in0", F32, Access.READ, 4 * WG, operand=0)
    kb.buffer("out", F32, Access.WRITE, 2 * WG, operand=OUT)
    tile = kb.shared("tile", F32, 4 * WG)
    four = kb.let("four", local_index() * i32(4))
    kb.store_wide(tile, four, [x[four + i32(3 - j)] for j in range(4)])
    kb.barrier()
    two = kb.let("two", local_index() * i32(2))
    kb.store_wide("out", two, [tile[four] + tile[four + i32(1)],
                               tile[four + i32(2)] * tile[four + i32(3)]])
    data = np.arange(4 * WG, dtype=np.float32)
    out = np.zeros(2 * WG, np.float32)
    run(kb.finish(), {"in0": data, "out": out})
    q = data.reshape(WG, 4)
    assert np.array_equal(out.reshape(WG, 2), np.stack([q[:, 3] + q[:, 2], q[:, 1] * q[:, 0]], 1))

    kb = KernelBuilder("misaligned_store", (1,), (WG,))
    kb.buffer("out", F32, Access.WRITE, 2 * WG + 1, operand=OUT)
    kb.store_wide("out", local_index() * i32(2) + i32(1), [f32(1.0), f32(2.0)])
    with pytest.raises(KernelFault, match="misaligned"):
        run(kb.finish(), {"out": np.zeros(2 * WG + 1, np.float32)})
    from poot.codegen.program import BufferParam

    one = Const(1.0, F32)
    bytes_out = (BufferParam("out", DType.U8, Access.WRITE, 4, OUT),)
    with pytest.raises(IRError, match="StoreWide of 3"):
        _kernel([StoreWide("out", i32(0), (one,) * 3)]).validate()
    with pytest.raises(IRError, match="StoreWide of 2"):
        _kernel([StoreWide("out", i32(0), (Const(1, DType.U8),) * 2)], bytes_out).validate()
    with pytest.raises(IRError, match="before AwaitInputs"):
        _kernel([StoreWide("out", i32(0), (one, one)), AwaitInputs()]).validate()


def test_group_barriers_are_reached_by_whole_groups():
    """GroupBarrier(width): a width not dividing the workgroup is refused; one reached by
    part of a group faults; after one, a thread reads what its group wrote."""
    with pytest.raises(IRError, match="group barrier width 3"):
        _kernel([GroupBarrier(3)]).validate()
    kb = KernelBuilder("half", (1,), (WG,))
    kb.buffer("out", F32, Access.WRITE, WG, operand=OUT)
    with kb.if_(lt(local_index(), i32(WG // 4))):
        kb.group_barrier(WG // 2)
    with pytest.raises(KernelFault, match="only part of a group"):
        run(kb.finish(), {"out": np.zeros(WG, np.float32)})
    kb = KernelBuilder("pairs", (1,), (WG,))
    x = kb.buffer("in0", F32, Access.READ, WG, operand=0)
    kb.buffer("out", F32, Access.WRITE, WG, operand=OUT)
    tile = kb.shared("tile", F32, WG)
    kb.store(tile, local_index(), x[local_index()])
    kb.group_barrier(2)
    kb.store("out", local_index(), tile[local_index() ^ i32(1)])
    data = np.arange(WG, dtype=np.float32)
    out = np.zeros_like(data)
    run(kb.finish(), {"in0": data, "out": out})
    assert np.array_equal(out, data.reshape(-1, 2)[:, ::-1].reshape(-1))


def test_await_inputs_names_what_is_loaded_before_it():
    """Before AwaitInputs a kernel only loads; early_reads names those operands (the
    runtime overlaps the launch only where they are all constants)."""
    from poot.codegen.program import BufferParam

    bufs = (BufferParam("in0", F32, Access.READ, 4, 0), BufferParam("in1", F32, Access.READ, 4, 1),
            BufferParam("out", F32, Access.WRITE, 4, OUT))
    w = Let("w", Load("in1", local_index(), F32))
    store = Store("out", local_index(), Var("w", F32) + Load("in0", local_index(), F32))
    k = _kernel([w, AwaitInputs(), store], bufs).validate()
    assert k.early_reads() == frozenset({1})
    assert _kernel([w, store], bufs).validate().early_reads() is None
    out = np.zeros(4, np.float32)
    run(k, {"in0": np.full(4, 2, np.float32), "in1": np.arange(4, dtype=np.float32), "out": out})
    assert out.tolist() == [2, 3, 4, 5]
    with pytest.raises(IRError, match="before AwaitInputs"):
        _kernel([w, store, AwaitInputs()], bufs).validate()
    with pytest.raises(IRError, match="waits once"):
        _kernel([AwaitInputs(), w, AwaitInputs(), store], bufs).validate()
    with pytest.raises(IRError, match="top-level"):
        _kernel([For("i", i32(0), i32(1), i32(1), (AwaitInputs(),)), w, store], bufs).validate()


def test_lowering_refuses_buffers_past_32_bit_indices():
    from poot.codegen.lower import lower
    from poot.errors import LimitExceeded
    from poot.ir.ops import Unary, UnaryOp
    from poot.ir.types import TensorType

    t = TensorType((2**16, 2**15 + 1), F32)
    with pytest.raises(LimitExceeded, match="32-bit"):
        lower(Unary(UnaryOp.Exp), [t], t)


def test_arrays_bound_by_name_are_each_buffers_dtype_and_count():
    from poot.codegen.program import BufferParam, check_arrays
    from poot.errors import BindError

    k = Kernel("k", (BufferParam("x", F32, Access.READ, 4, 0),
                     BufferParam("y", I32, Access.WRITE, 2, OUT)), (1,), (1,), ())
    check_arrays([k], {"x": np.zeros(4, np.float32), "y": np.zeros(2, np.int32)})
    for bad, why in (({"x": np.zeros(4, np.float32)}, "'y' wants 2 x i32, got None"),
                     ({"x": np.zeros(4, np.float64), "y": np.zeros(2, np.int32)}, "'x'"),
                     ({"x": np.zeros(4, np.float32), "y": np.zeros(3, np.int32)}, "'y'")):
        with pytest.raises(BindError, match=why):
            check_arrays([k], bad)
