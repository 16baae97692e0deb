"""The reference runtime: buffers are host numpy bytes; a step runs each planned eqn.

Every kernel is prepared in `load`: numpy views of its operands and result at their
planned places (strided views where the plan says so) and one callable per step. A step
calls them in order. Kernels compute exactly what the oracle (`poot.oracle.apply`)
computes: the hot F32 ops call the same numpy routine the oracle's rule calls, writing
into the planned place (`out=`); every other op goes through `apply` itself.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from poot.contract import ALIGN, Device, Place, Plan, Step
from poot.dtypes import DType
from poot.errors import CapacityError, OutOfRange, UnsupportedOp
from poot.ir import ops as O
from poot.ir.graph import Lit
from poot.oracle import apply
from poot.oracle import scalar as S
from poot.oracle.rules import contiguous
from poot.runtime.blas import single_thread

Kernel = Callable[[], None]

#: rows of a MatMul (multiply-adds per element of its strided weight) up to which the weight's
#: C-contiguous copy is kept rather than made each step
KEEP_ROWS = 16


@dataclass(eq=False)
class HostBuffer:
    """A Buffer of the reference runtime: 256-aligned host bytes that never move."""

    data: np.ndarray
    nbytes: int
    label: str
    #: host writes so far (ReferenceRuntime.write), and C-contiguous copies of strided
    #: views of a weight's bytes, by (offset, shape, strides): (writes when copied, copy)
    writes: int = 0
    copies: dict = field(default_factory=dict)


class ReferenceExecutable:
    recorded = False     # the reference runtime runs the plan directly, never records

    def __init__(self, kernels: list[Kernel]):
        self.kernels = kernels

    def run(self) -> None:
        with np.errstate(all="ignore"), single_thread():
            for k in self.kernels:
                k()


class ReferenceRuntime:
    """The Runtime of the reference backend (see poot.contract.Runtime)."""

    def __init__(self, device: Device, limit_bytes: int | None = None, communicator=None):
        """`communicator`: this rank's membership of a tensor-parallel group over host
        arrays (`all_reduce(src, out)`, `all_gather(src, out)`; poot.parallel.local), for
        plans holding collectives."""
        self.device = device
        self.limit_bytes = limit_bytes
        self.communicator = communicator
        self.allocated = 0
        self.allocs = 0          # calls of alloc, so tests can check steps allocate nothing

    def alloc(self, nbytes: int, label: str) -> HostBuffer:
        if self.limit_bytes is not None and self.allocated + nbytes > self.limit_bytes:
            raise CapacityError(f"{self.device}: allocating {nbytes} bytes for {label} exceeds "
                                f"the runtime's limit of {self.limit_bytes} bytes "
                                f"({self.allocated} in use)")
        raw = np.empty(nbytes + ALIGN, np.uint8)
        skip = (-raw.ctypes.data) % ALIGN
        self.allocs += 1
        self.allocated += nbytes
        return HostBuffer(raw[skip: skip + nbytes], nbytes, label)

    def write(self, buf: HostBuffer, offset: int, array: np.ndarray) -> None:
        src = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        buf.data[offset: offset + src.size] = src
        buf.writes += 1

    def read(self, buf: HostBuffer, offset: int, nbytes: int) -> np.ndarray:
        return buf.data[offset: offset + nbytes].copy()

    def load(self, plan: Plan, buffers: Mapping[str, HostBuffer]) -> ReferenceExecutable:
        view = _Views(buffers, {name: r.kind for name, r in plan.regions.items()})
        kernels = [self._collective(step, view) if step.lowering.extra.get("collective")
                   else _kernel(step, view) for step in plan.steps]
        kernels += [_copy(view(c.src), view(c.dst)) for c in plan.copies]
        return ReferenceExecutable(kernels)


    def _collective(self, step: Step, view: _Views) -> Kernel:
        op = step.eqn.op
        src, out = view(step.inputs[0]), view(step.out)
        if self.communicator is None and op.ranks == 1:
            return _copy(src, out)   # a group of one: the sum and the gather are the tensor
        if self.communicator is None or self.communicator.ranks != op.ranks:
            have = "none" if self.communicator is None else self.communicator.ranks
            raise UnsupportedOp(f"{op!r} needs a communicator of {op.ranks} ranks; this "
                                f"runtime has {have}",
                                op=op.name, backend="reference", device=str(self.device))
        run = self.communicator.all_reduce if isinstance(op, O.AllReduce) else \
            self.communicator.all_gather
        return lambda: run(src, out)


class _Views:
    """numpy views of planned places, made once at load."""

    def __init__(self, buffers: Mapping[str, HostBuffer], kinds: Mapping[str, str]):
        self.buffers = buffers
        self.kinds = kinds

    def __call__(self, place: Place) -> np.ndarray:
        t = place.type
        dt = t.dtype.numpy
        strides = None if place.strides is None else tuple(s * dt.itemsize for s in place.strides)
        return np.ndarray(t.shape, dtype=dt, buffer=self.buffers[place.region].data,
                          offset=place.offset, strides=strides)

    def contiguous(self, place: Place, keep: bool) -> Callable[[], np.ndarray]:
        """A getter of the value at `place` as a C-contiguous array. With `keep`, a strided
        view of a weight (a transposed matrix) is copied once and the copy kept with the
        weight's buffer until the host writes that buffer again."""
        x = self(place)
        if x.flags.c_contiguous:
            return lambda: x
        if not keep or self.kinds.get(place.region) != "weight":
            return lambda: contiguous(x)
        buf, key = self.buffers[place.region], (place.offset, x.shape, x.strides)

        def kept():
            got = buf.copies.get(key)
            if got is None or got[0] != buf.writes:
                got = buf.copies[key] = (buf.writes, contiguous(x))
            return got[1]
        return kept


def _copy(src: np.ndarray, dst: np.ndarray) -> Kernel:
    return lambda: np.copyto(dst, src)


def _kernel(step: Step, view: _Views) -> Kernel:
    op = step.eqn.op
    args = [np.asarray(x.value, x.dtype.numpy) if isinstance(x, Lit) else view(x)
            for x in step.inputs]
    out = view(step.out)
    if step.inplace:
        return (_dus_in_place if isinstance(op, O.DynamicUpdateSlice) else _scatter_in_place)(
            op, args, out)
    in_types = [x.type for x in step.inputs]
    dense = None
    if isinstance(op, O.MatMul):
        # a product of few rows (a decode step) costs less than copying its strided weight:
        # that copy is kept; a long prefill's products dwarf the copy, made each step
        work = out.size * args[0].shape[-1]
        dense = [(lambda a=a: a) if isinstance(x, Lit) else
                 view.contiguous(x, keep=work <= KEEP_ROWS * a.size)
                 for x, a in zip(step.inputs, args, strict=True)]
    fast = _fast_kernel(op, args, in_types, out, dense)
    if fast is not None:
        return fast
    out_type = step.out.type

    def generic():
        out[...] = apply(op, args, in_types, out_type)
    return generic


_F32_UNARY = {O.UnaryOp.Exp: np.exp, O.UnaryOp.Sqrt: np.sqrt, O.UnaryOp.Neg: np.negative,
              O.UnaryOp.Log: np.log, O.UnaryOp.Tanh: np.tanh}


def _fast_kernel(op, args, in_types, out, dense=None) -> Kernel | None:
    """The oracle's own numpy routine written into `out`, for the ops a decoder spends its
    time in. Only F32, where the oracle's rule computes in the operand dtype directly.
    `dense`: a MatMul's getters of its operands as C-contiguous arrays (_Views.contiguous)."""
    f32 = all(t.dtype is DType.F32 for t in in_types) and out.dtype == np.float32
    if isinstance(op, O.Binary) and f32 and op.op in S.FLOAT_BINARY:
        fn, (a, b) = S.FLOAT_BINARY[op.op], args
        return lambda: fn(a, b, out=out)
    if isinstance(op, O.Unary) and f32 and op.op in _F32_UNARY:
        fn, (a,) = _F32_UNARY[op.op], args
        return lambda: fn(a, out=out)
    if isinstance(op, O.MatMul) and f32:
        a, b = dense

        # on contiguous operands, as the oracle's rule (rules._contract): the same sums
        # whatever layout the plan gave them
        if out.flags.c_contiguous:
            return lambda: np.matmul(a(), b(), out=out)
        return lambda: np.copyto(out, np.matmul(a(), b()))
    if isinstance(op, O.Reduce) and f32:
        (x,) = args
        axis, keep = op.axis, op.keepdim
        if op.op is O.ReduceOp.Max:
            return lambda: np.max(x, axis=axis, keepdims=keep, out=out)
        return lambda: np.sum(x, axis=axis, keepdims=keep, dtype=np.float32, out=out)
    if isinstance(op, O.Gather):
        src, idx = args
        axis = op.axis % src.ndim
        size = src.shape[axis]

        def gather():
            _check_index(idx, size, "Gather")
            np.take(src, idx, axis=axis, out=out, mode="clip")  # checked above; unbuffered
        return gather
    moved = _moved_view(op, args)
    if moved is not None:
        return lambda: np.copyto(out, moved)
    if isinstance(op, O.Concat):
        axis = op.axis
        return lambda: np.concatenate(args, axis=axis, out=out)
    if isinstance(op, O.Select) and out.dtype == args[1].dtype == args[2].dtype:
        cond, if_true, if_false = args

        def select():  # moves the chosen element bit for bit, as the oracle's np.where
            np.copyto(out, if_false)
            np.copyto(out, if_true, where=cond != 0)
        return select
    return None


def _moved_view(op, args) -> np.ndarray | None:
    """Data movement ops as a view of their operand, made once: a step copies it out."""
    if isinstance(op, O.Transpose):
        return args[0].transpose(op.perm)
    if isinstance(op, O.Slice):
        x = args[0]
        sl = [slice(None)] * x.ndim
        sl[op.axis % x.ndim] = slice(op.start, op.end)
        return x[tuple(sl)]
    if isinstance(op, O.Broadcast):
        return np.broadcast_to(args[0], op.shape)
    return None


def _check_index(idx: np.ndarray, size: int, what: str, allow_minus_one: bool = False) -> None:
    if idx.size == 0:
        return
    lo = -1 if allow_minus_one else 0
    low, high = int(idx.min()), int(idx.max())
    if low < lo or high >= size:
        bad = low if low < lo else high
        raise OutOfRange(f"{what}: index {bad} outside [{lo}, {size})")


def _dus_in_place(op: O.DynamicUpdateSlice, args, state: np.ndarray) -> Kernel:
    """Write the update into the donated state at the clamped index (the oracle's rule)."""
    _, upd, index = args
    axis = op.axis % state.ndim
    limit = state.shape[axis] - upd.shape[axis]
    n = upd.shape[axis]
    flat = index.reshape(-1)

    def dus():
        start = min(max(int(flat[0]), 0), limit)
        sl = [slice(None)] * state.ndim
        sl[axis] = slice(start, start + n)
        state[tuple(sl)] = upd
    return dus


def _scatter_in_place(op: O.ScatterUpdate, args, pool: np.ndarray) -> Kernel:
    """Rows of src into the donated pool at their slots; -1 skips; the later row wins."""
    _, src, slots = args
    size = pool.shape[0]

    def scatter():
        _check_index(slots, size, "ScatterUpdate", allow_minus_one=True)
        keep = slots >= 0
        where = slots[keep]
        rows = src[keep]
        if np.unique(where).size != where.size:
            _, last = np.unique(where[::-1], return_index=True)
            pick = where.size - 1 - last
            where, rows = where[pick], rows[pick]
        pool[where] = rows
    return scatter


__all__ = ["ReferenceRuntime", "ReferenceExecutable", "HostBuffer"]
