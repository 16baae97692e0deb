"""Scan: the recurrence as one kernel that loops over the steps, the body evaluated per
carry element as a region (poot.codegen.region), every step's carry stored as it goes.

* A body that only combines elements in place (elementwise ops, broadcasts, iotas)
  reads the carry at the element it writes: one thread per carry element keeps it in
  a register, over as many workgroups as the carry needs.
* A body that moves elements (reshape, transpose, slice, concat) reads the carry at
  other elements: one workgroup holds the carry in shared memory, each step computed
  into registers first and written back between barriers.
A body eqn a region cannot hold (a reduction, a contraction, a gather) is refused
with UnsupportedOp naming it.
"""
from __future__ import annotations

import math

from poot.codegen import index as ix
from poot.codegen.expr import Const, Expr, Load, i32
from poot.codegen.lower.base import Sig, lowers
from poot.codegen.lower.pointwise import WORKGROUP
from poot.codegen.program import KernelProgram, local_index
from poot.codegen.region import POINTWISE, RegionEval
from poot.dtypes import DType
from poot.errors import LimitExceeded, UnsupportedOp
from poot.ir.graph import Lit
from poot.ir.ops import Broadcast, Concat, Iota, Reshape, Scan, Slice, Transpose

IN_PLACE = (*POINTWISE, Broadcast, Iota)
MOVING = (Reshape, Transpose, Slice, Concat)
SHARED_BYTES = 16 * 1024   # the carry of a moving body stays within this (WebGPU: 16 KiB+)


def _xs_reader(sig: Sig, i: int, step: Expr):
    """Operand i (a sequence [length, ...]) at coordinates of its step-`step` slice."""
    x = sig.ins[i]
    if isinstance(x, Lit):
        return lambda c: Const(x.value, x.dtype)
    inner = x.shape[1:]
    size = math.prod(inner)
    return lambda c: Load(f"in{i}", ix.add(ix.mul(step, size), ix.ravel(c, inner)), x.dtype)


def _body_kind(op: Scan) -> str:
    """"in_place" or "moving"; refuses an eqn no region can evaluate."""
    kinds = {type(e.op) for e in op.body.eqns()}
    bad = sorted(k.__name__ for k in kinds if not issubclass(k, IN_PLACE + MOVING))
    if bad:
        raise UnsupportedOp(f"Scan body holds {', '.join(bad)}: a Scan kernel evaluates "
                            "elementwise and data-movement steps only", op="Scan")
    return "in_place" if all(issubclass(k, IN_PLACE) for k in kinds) else "moving"


@lowers(Scan)
def lower_scan(sig: Sig) -> KernelProgram:
    carry = sig.type(0)
    if isinstance(sig.ins[0], Lit):
        raise UnsupportedOp("Scan's initial carry must be a tensor", op="Scan")
    if _body_kind(sig.op) == "in_place":
        return KernelProgram((_in_place(sig, carry),))
    return KernelProgram((_moving(sig, carry),))


def _in_place(sig: Sig, carry):
    n = carry.size
    grid, flat = ix.launch_1d(n, WORKGROUP)
    kb = sig.builder(grid, (WORKGROUP,))
    sig.declare_all(kb)
    i = kb.let("i", flat)
    with kb.if_(ix.lt(i, i32(n))):
        coords = [kb.let(f"c{d}", c) if not isinstance(c, Const) else c
                  for d, c in enumerate(ix.unravel(i, carry.shape))]
        state = kb.var("carry", Load("in0", i, carry.dtype))
        with kb.for_("step", 0, sig.op.length) as step:
            # the carry param is read only where its shape is the result's: at `coords`
            params = [lambda c: state] + [_xs_reader(sig, j, step)
                                          for j in range(1, len(sig.ins))]
            nxt = RegionEval(kb, sig.op.body, params).result_at(coords)
            kb.assign(state, nxt)
            kb.store("out", ix.add(ix.mul(step, n), i), state)
    return kb.finish()


def _held(dtype: DType) -> DType:
    """The dtype a carry element is held in shared memory as (exactly)."""
    if dtype.is_float:
        return DType.F32
    if dtype in (DType.I32, DType.U32):
        return dtype
    raise UnsupportedOp(f"a Scan body that moves {dtype} elements has no shared-memory form",
                        op="Scan", dtype=str(dtype))


def _moving(sig: Sig, carry):
    n, held = carry.size, _held(carry.dtype)
    if 4 * n > SHARED_BYTES:
        raise LimitExceeded(f"Scan carry {carry} is read across elements and must fit one "
                            f"workgroup's shared memory ({SHARED_BYTES} bytes)", op="Scan",
                            dtype=str(carry.dtype))
    wg = ix.pow2_at_least(n)
    per = math.ceil(n / wg)
    kb = sig.builder((1,), (wg,))
    sig.declare_all(kb)
    cur = kb.shared("s_carry", held, n)
    nxt = kb.local("nxt", held, per)
    with kb.for_("e", local_index(), n, wg) as e:
        kb.store(cur, e, Load("in0", e, carry.dtype).cast(held))
    kb.barrier()
    with kb.for_("step", 0, sig.op.length) as step:
        params = [lambda c: cur[ix.ravel(c, carry.shape)].cast(carry.dtype)]
        params += [_xs_reader(sig, j, step) for j in range(1, len(sig.ins))]
        ev = RegionEval(kb, sig.op.body, params)
        for p in range(per):
            e = kb.let("e", ix.add(local_index(), p * wg))
            with kb.if_(ix.lt(e, i32(n))):
                ev.push()
                value = kb.let("value", ev.result_at(ix.unravel(e, carry.shape)))
                ev.pop()
                kb.store(nxt, p, value.cast(held))
                kb.store("out", ix.add(ix.mul(step, n), e), value)
        kb.barrier()
        for p in range(per):
            e = kb.let("e", ix.add(local_index(), p * wg))
            with kb.if_(ix.lt(e, i32(n))):
                kb.store(cur, e, nxt[p])
        kb.barrier()
    return kb.finish()
