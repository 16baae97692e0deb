"""The backend-neutral kernel program: what every backend's printer prints.

A `Kernel` is one dispatch: a launch grid of workgroups, a workgroup shape,
buffer parameters, workgroup-shared arrays, per-thread arrays and a body of
statements. Scalar arithmetic is `poot.codegen.expr` trees; the statements here
add what a kernel needs around it: variables, stores, loops, branches,
barriers and cooperative reductions.

Conventions every printer and the interpreter (`poot.codegen.interp`) share:

* Builtin index variables are `Var`s with reserved names (`BUILTINS`), all I32:
  `local_id_x|y|z`, `group_id_x|y|z`, `global_id_x|y|z` (= group * workgroup +
  local) and `local_index` (the linear thread index in its workgroup,
  x fastest). Workgroup and grid sizes are static (`Kernel.workgroup`,
  `Kernel.grid`), so printers emit them as constants.
* `Load(name, index, dtype)` and `Store(name, index, value)` address a buffer
  parameter, a shared array or a local array by name, in elements of its
  declared dtype. A load's dtype equals the array's dtype.
* A `Let` declares a scalar variable (immutable unless `mutable`); `Assign`
  changes a mutable one. `For` declares its I32 counter. Names are unique per
  kernel (no shadowing), which keeps every printer's scoping trivial.
* `If.cond` and `Sel.cond` are I32: nonzero is true.
* `Barrier` synchronizes the workgroup and makes its shared and global writes
  visible to it. It, and every `CoopReduce`, must be reached by all threads of
  the workgroup (uniform control flow). `GroupBarrier(width)` (targets declaring
  WIDE_LOADS, where `width` is their subgroup) does the same for each aligned group of
  `width` consecutive threads alone; every thread of a group reaches it or none does.
* `CoopReduce(name, op, value, width)` declares `name`: the Sum or Max of `value`
  over each aligned group of `width` consecutive threads (by `local_index`);
  every thread of the group receives the result. `width=None` means the whole
  workgroup. Printers map it to subgroup/warp primitives and, across
  subgroups, to shared memory and barriers of their own; they must leave shared
  arrays of the kernel untouched. Floats reduce in F32, integers in I32.
* `CoopReduceScatter(name, op, values, width)` (targets declaring REDUCE_SCATTER) reduces
  V = len(values) values at once over each aligned group of `width` threads (V a power
  of two, at most `width`; `width` at most the target's subgroup): thread t of the group
  receives the reduction of values[(t mod width) // (width // V)], so each of the V
  results lands on width // V consecutive threads. Printers halve the set at each xor
  shuffle (V - 1 shuffles in all, not V log2(width)); see `scatter_order`.

* `LoadWide(names, load)` (targets declaring WIDE_LOADS) declares 2, 4 or 8 variables
  from consecutive elements in one 4-, 8- or 16-byte load (more bytes in flight per
  instruction; 16-byte shared reads spread over all banks).

* `StoreWide(array, index, values)` (targets declaring WIDE_LOADS) stores 2, 4 or 8
  consecutive elements of a buffer or shared array in one 4-, 8- or 16-byte store:
  fewer, whole-word writes where each thread holds neighbouring outputs. Both take an
  index that is a multiple of their count (aligned to their size).

* `AwaitInputs()` (at most one, in the kernel's top-level body): where the kernel waits
  for the kernels before it, on targets whose launches may overlap their predecessor's
  work (CUDA's programmatic dependent launch); without it a kernel waits at its entry.
  Before it the kernel may only load: `Kernel.early_reads()` names the operands those
  loads read, and a runtime lets the launch overlap only where every one of them is a
  constant of the plan (never written by a step). Elsewhere it prints as nothing.

Matrix-unit statements, for targets that declare the features (poot.codegen.target);
a lowering emits them only when its target has them, and printers without them refuse:

* `CopyAsync` copies 16 bytes from a buffer into a shared array, possibly in the
  background; `CopyCommit` closes the batch of copies this thread issued since the
  last commit, and `CopyWait(pending)` waits until at most `pending` of this
  thread's batches are still in flight. A Barrier after the wait makes the copies
  visible to the workgroup (the interpreter copies at once, a legal schedule).
* `MmaTile` is cooperative over the lanes of its matrix unit (`MmaTile.unit`, the
  target's `MatrixUnit`: every thread of each group of `unit.lanes` reaches it, with
  group-uniform operands): acc += A . B^T over `unit.k` values of K, 16-bit floats
  (BF16 or F16) read from shared U32 words, F32 accumulate. See its docstring.

Bulk tensor copies and warpgroup products (target features TMA and WGMMA):

* A `TensorMap` of the kernel describes one buffer as a 2-D row-major tensor that
  `TmaLoad` copies boxes of into shared memory, 128-byte swizzled (the host builds it
  once the buffer's address is known and passes it by value). A TmaLoad completes on an
  mbarrier: `MbarInit` (one thread, then a Barrier) sets the arrivals a phase takes,
  `MbarArrive` arrives (optionally announcing bytes of copies still to land), and
  `MbarWait(parity)` waits until the phase of that parity has completed.
* `Wgmma` is cooperative over a warpgroup (4 consecutive warps from a multiple of 4):
  acc (64 x n) += A (64 x 16) . B (16 x n), both read from swizzled shared tiles
  (`SmemTile`), issued asynchronously (`Wgmma.fence` on the first product that reads
  accumulators other statements wrote); `WgmmaCommit` closes a batch and
  `WgmmaWait(pending)` waits until at most `pending` batches are in flight (then the
  accumulators and the shared tiles of the finished ones are free).
* `RegisterBudget` moves a warpgroup's register allocation up or down (producer and
  consumer warpgroups of one workgroup); every warp of the warpgroup reaches it.
"""
from __future__ import annotations

import enum
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from poot.codegen.expr import Expr, Load, Var, walk
from poot.dtypes import DType
from poot.errors import BindError, IRError
from poot.ir.ops.reduce import ReduceOp

if TYPE_CHECKING:  # pragma: no cover
    from poot.codegen.target import MatrixUnit

I32 = DType.I32
AXES = ("x", "y", "z")

#: reserved Var names -> (kind, axis); kind is "local", "group", "global" or "index"
BUILTINS: dict[str, tuple[str, int]] = {
    **{f"{kind}_id_{a}": (kind, i) for kind in ("local", "group", "global")
       for i, a in enumerate(AXES)},
    "local_index": ("index", 0),
}


def local_id(axis: int = 0) -> Var:
    return Var(f"local_id_{AXES[axis]}", I32)


def group_id(axis: int = 0) -> Var:
    return Var(f"group_id_{AXES[axis]}", I32)


def global_id(axis: int = 0) -> Var:
    return Var(f"global_id_{AXES[axis]}", I32)


def local_index() -> Var:
    return Var("local_index", I32)


class Access(enum.Enum):
    READ = "read"
    WRITE = "write"
    READ_WRITE = "read_write"

    @property
    def readable(self) -> bool:
        return self is not Access.WRITE

    @property
    def writable(self) -> bool:
        return self is not Access.READ


@dataclass(frozen=True)
class BufferParam:
    """A buffer parameter: `count` elements of `dtype` in device memory.

    `operand` says what the planner binds: the index of the eqn's tensor
    operand (0, 1, ...), `OUT` (-1) for the eqn's output, or `SCRATCH` (None)
    for a temporary the lowering asks for (`KernelProgram.scratch`).
    """

    name: str
    dtype: DType
    access: Access
    count: int
    operand: int | None = None

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize


OUT = -1
SCRATCH = None


@dataclass(frozen=True)
class SharedArray:
    """A workgroup-shared array (one copy per workgroup), starting on an `align`-byte
    boundary (swizzled tiles need 1024)."""

    name: str
    dtype: DType
    count: int
    align: int = 16


#: bytes of a shared row that TmaLoad swizzles and Wgmma reads (the 128-byte swizzle)
SWIZZLE_BYTES = 128
#: bytes of one swizzle pattern: 8 rows of SWIZZLE_BYTES
SWIZZLE_SPAN = 8 * SWIZZLE_BYTES


@dataclass(frozen=True)
class TensorMap:
    """Buffer `buffer` seen as `rows` x `cols` row-major elements of its dtype, copied by
    TmaLoad in boxes of `box_rows` x `box_cols` (box_cols * itemsize = SWIZZLE_BYTES):
    a box lands in shared memory as box_rows rows of SWIZZLE_BYTES, the 16-byte chunks of
    row r permuted by r % 8 (the 128-byte swizzle). Elements past the edges read as 0."""

    name: str
    buffer: str
    rows: int
    cols: int
    box_rows: int
    box_cols: int


@dataclass(frozen=True)
class LocalArray:
    """A per-thread array (registers or private memory), indexed like a buffer."""

    name: str
    dtype: DType
    count: int


# -- statements -------------------------------------------------------------------
class Stmt:
    """Base of every statement."""


@dataclass(frozen=True, eq=False)
class Let(Stmt):
    """Declare scalar variable `name` of `value.dtype`; `mutable` allows Assign."""

    name: str
    value: Expr
    mutable: bool = False

    @property
    def var(self) -> Var:
        return Var(self.name, self.value.dtype)


@dataclass(frozen=True, eq=False)
class LoadWide(Stmt):
    """Declare names[i] = load.array[load.index + i] for each i: one load of 2, 4 or 8
    consecutive elements (4, 8 or 16 bytes; load.index a multiple of their count, so the
    load is aligned to its size), on targets that declare WIDE_LOADS."""

    names: tuple[str, ...]
    load: Load

    @property
    def vars(self) -> list[Var]:
        return [Var(n, self.load.dtype) for n in self.names]


@dataclass(frozen=True, eq=False)
class Assign(Stmt):
    name: str
    value: Expr


@dataclass(frozen=True, eq=False)
class Store(Stmt):
    """array[index] = value (a buffer, shared or local array; index is I32)."""

    array: str
    index: Expr
    value: Expr


@dataclass(frozen=True, eq=False)
class StoreWide(Stmt):
    """array[index + i] = values[i] for each i: one store of 2, 4 or 8 consecutive
    elements (4, 8 or 16 bytes; index a multiple of their count, so the store is aligned
    to its size), on targets that declare WIDE_LOADS."""

    array: str
    index: Expr
    values: tuple[Expr, ...]


@dataclass(frozen=True, eq=False)
class For(Stmt):
    """for (var = start; var < stop; var += step) body. I32 counter, step > 0."""

    var: str
    start: Expr
    stop: Expr
    step: Expr
    body: tuple[Stmt, ...]


@dataclass(frozen=True, eq=False)
class If(Stmt):
    cond: Expr
    then: tuple[Stmt, ...]
    orelse: tuple[Stmt, ...] = ()


@dataclass(frozen=True, eq=False)
class Barrier(Stmt):
    """Workgroup barrier with shared and global memory visibility."""


@dataclass(frozen=True, eq=False)
class GroupBarrier(Stmt):
    """`Barrier` for each aligned group of `width` consecutive threads alone (see module)."""

    width: int


@dataclass(frozen=True, eq=False)
class AwaitInputs(Stmt):
    """The kernel's wait for the kernels before it (see module)."""


@dataclass(frozen=True, eq=False)
class CoopReduce(Stmt):
    """Declare `name` = op-reduction of `value` over groups of `width` threads (see module)."""

    name: str
    op: ReduceOp
    value: Expr
    width: int | None = None

    @property
    def var(self) -> Var:
        return Var(self.name, self.value.dtype)


@dataclass(frozen=True, eq=False)
class CoopReduceScatter(Stmt):
    """Declare `name`: the op-reduction over each group of `width` threads of the value
    of `values` that the thread's place in its group picks (see module)."""

    name: str
    op: ReduceOp
    values: tuple[Expr, ...]
    width: int

    @property
    def var(self) -> Var:
        return Var(self.name, self.values[0].dtype)


def scatter_order(v: int, width: int) -> list[tuple[int, int]]:
    """The xor shuffles of a CoopReduceScatter of `v` values over `width` lanes, in order:
    (offset, values kept). While more than one value is left, the lanes whose `offset` bit
    is set keep the upper half of their values and send the lower, the others the reverse,
    each adding what its partner sent to what it kept; then one value's butterfly."""
    out, off = [], width // 2
    while off >= 1:
        v = max(v // 2, 1)
        out.append((off, v))
        off //= 2
    return out


@dataclass(frozen=True, eq=False)
class CopyAsync(Stmt):
    """Copy 16 bytes: buffer `src` from element `src_index` -> shared `dst` from element
    `dst_index` (both 16-byte aligned). Where `valid` is 0 the 16 bytes are zeros and
    `src` is not read (rows past the edge of a tile)."""

    dst: str
    dst_index: Expr
    src: str
    src_index: Expr
    valid: Expr


@dataclass(frozen=True, eq=False)
class CopyCommit(Stmt):
    """Close this thread's batch of CopyAsync issued since the last commit."""


@dataclass(frozen=True, eq=False)
class CopyWait(Stmt):
    """Wait until at most `pending` of this thread's committed batches are in flight."""

    pending: int


@dataclass(frozen=True, eq=False)
class MmaTile(Stmt):
    """Per group of `unit.lanes` threads, with (m, n, k) the unit's tile shape:
    acc += A[a_row : a_row + m*tiles_m, k0 : k0+k] . B[k0 : k0+k, cols] with
    cols = b_col : b_col + n*tiles_n (F32 accumulate).

    A is row-major in shared U32 words, two 16-bit values per word: element (r, k) at
    word r * a_pitch + a_word + k // 2. B is either [n][k] (`b_trans` False: element
    (k, n) at word n * b_pitch + b_word + k // 2, a weight in checkpoint order) or
    [k][n] (`b_trans` True: at word k * b_pitch + b_word + n // 2). Rows start on
    16-byte boundaries. Lane l of the group holds result (row, col) of tile (i, j) in
    acc[acc_first + 4 * (i * tiles_n + j) + r], r = 0..3, with (row - m i, col - n j) =
    `unit.coords(l, r)`. tiles_n is even. `unit` is the target's (poot.codegen.target).
    """

    acc: str
    acc_first: int
    tiles_m: int
    tiles_n: int
    dtype: DType
    a: str
    a_row: Expr
    a_word: Expr
    a_pitch: int
    b: str
    b_col: Expr
    b_word: Expr
    b_pitch: int
    b_trans: bool = False
    unit: MatrixUnit | None = None


@dataclass(frozen=True, eq=False)
class MbarInit(Stmt):
    """Set mbarrier `index` of shared U32 array `bars` (two words each) to take `count`
    arrivals per phase. One thread runs it; a Barrier follows before any use."""

    bars: str
    index: Expr
    count: int


@dataclass(frozen=True, eq=False)
class MbarArrive(Stmt):
    """Arrive on mbarrier `index` of `bars`; with `tx_bytes` the phase also waits for
    that many bytes of TmaLoads to land."""

    bars: str
    index: Expr
    tx_bytes: int = 0


@dataclass(frozen=True, eq=False)
class MbarWait(Stmt):
    """Wait until the phase of `parity` (0 or 1: phases alternate) of mbarrier `index`
    of `bars` has completed."""

    bars: str
    index: Expr
    parity: Expr


@dataclass(frozen=True, eq=False)
class TmaLoad(Stmt):
    """Copy the box of tensor map `tensor_map` at (row, col) into shared `dst` from
    element `dst_index` (SWIZZLE_SPAN-aligned), completing on mbarrier `bar` of `bars`.
    One thread issues it."""

    tensor_map: str
    dst: str
    dst_index: Expr
    row: Expr
    col: Expr
    bars: str
    bar: Expr


@dataclass(frozen=True, eq=False)
class RegisterBudget(Stmt):
    """Set this warpgroup's registers per thread to `registers` (a multiple of 8 in
    24..256), raising it when `grow`, else lowering it."""

    registers: int
    grow: bool


@dataclass(frozen=True, eq=False)
class WgmmaWait(Stmt):
    """Wait until at most `pending` of this warpgroup's batches are in flight; the
    accumulators `acc` (a local array; "" for none) are read only after it."""

    pending: int
    acc: str = ""


@dataclass(frozen=True)
class SmemTile:
    """A Wgmma operand in shared array `array` as TmaLoad boxes left it (rows of
    SWIZZLE_BYTES, 64 16-bit values), from element `first`. `k_major`: its rows run along
    M (or N), 64 K values each, and `first` is the tile's first row at K offset 0, 16, 32
    or 48. Else its rows run along K, 64 M (or N) values each, `first` the tile's first
    K row, and the next 64 columns are `block_bytes` further on (the next box)."""

    array: str
    first: Expr
    k_major: bool
    block_bytes: int = 0


@dataclass(frozen=True, eq=False)
class Wgmma(Stmt):
    """Per warpgroup: acc (64 x n, F32) += A (64 x 16) . B (16 x n) of `dtype` (BF16 or
    F16), A and B `SmemTile`s. Thread t of the warpgroup (warp w = t / 32, lane l) holds
    (16 w + row, 8 j + col) in acc[4 j + r], r = 0..3, with (row, col) =
    MMA_M16N8K16.coords(l, r) (poot.codegen.target). `fence`: accumulator writes of other
    statements before it are ordered before it (the first product after them)."""

    acc: str
    n: int
    dtype: DType
    a: SmemTile
    b: SmemTile
    fence: bool = False


@dataclass(frozen=True, eq=False)
class WgmmaCommit(Stmt):
    """Close this warpgroup's batch of Wgmmas issued since the last commit."""


#: the statements of the TMA and WGMMA features
TENSOR_ASYNC = (MbarInit, MbarArrive, MbarWait, TmaLoad, Wgmma, WgmmaCommit, WgmmaWait,
                RegisterBudget)


# -- the kernel -------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Kernel:
    name: str
    buffers: tuple[BufferParam, ...]
    grid: tuple[int, ...]
    workgroup: tuple[int, ...]
    body: tuple[Stmt, ...]
    shared: tuple[SharedArray, ...] = ()
    locals: tuple[LocalArray, ...] = ()
    tensor_maps: tuple[TensorMap, ...] = ()

    @property
    def threads_per_group(self) -> int:
        return math.prod(self.workgroup)

    @property
    def groups(self) -> int:
        return math.prod(self.grid)

    def grid3(self) -> tuple[int, int, int]:
        return tuple(self.grid) + (1,) * (3 - len(self.grid))

    def workgroup3(self) -> tuple[int, int, int]:
        return tuple(self.workgroup) + (1,) * (3 - len(self.workgroup))

    def buffer(self, name: str) -> BufferParam:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    def arrays(self) -> dict[str, BufferParam | SharedArray | LocalArray]:
        return {a.name: a for a in (*self.buffers, *self.shared, *self.locals)}

    def statements(self) -> Iterator[Stmt]:
        """Every statement, depth first in program order."""
        return statements_in(self.body)

    def early_reads(self) -> frozenset[int] | None:
        """The operand indices loaded before the kernel's AwaitInputs, or None without
        one (the kernel waits at entry)."""
        for i, s in enumerate(self.body):
            if isinstance(s, AwaitInputs):
                return frozenset(b.operand for b in self.buffers
                                 if b.name in _read_names(self.body[:i]))
        return None

    def reductions(self) -> list[CoopReduce]:
        return [s for s in self.statements() if isinstance(s, CoopReduce)]

    def dtypes(self) -> set[DType]:
        """Every dtype the kernel stores, loads or computes with (what printers check)."""
        out = {a.dtype for a in self.arrays().values()}
        for e in self.expressions():
            out.update(n.dtype for n in walk(e))
        return out

    def expressions(self) -> Iterator[Expr]:
        for s in self.statements():
            yield from _exprs_of(s)

    def validate(self) -> Kernel:
        """Check names, scopes, access and dtypes; an IRError names the first fault. A
        kernel is immutable, so one that passed is not checked again (the builder checks
        what it finishes, the printer what it prints)."""
        if not self.__dict__.get("_valid"):
            _Checker(self).run()
            object.__setattr__(self, "_valid", True)
        return self


def check_arrays(kernels: Sequence[Kernel], arrays: Mapping[str, object]) -> None:
    """Refuse (BindError) host arrays that are not the contents of every buffer of
    `kernels`: one per buffer name, of its dtype and element count (a launcher that runs
    kernels without a plan binds them by name)."""
    for k in kernels:
        for b in k.buffers:
            a = arrays.get(b.name)
            if a is None or a.dtype != b.dtype.numpy or a.size != b.count:
                raise BindError(f"buffer {b.name!r} wants {b.count} x {b.dtype}, got "
                                f"{None if a is None else (a.shape, a.dtype)}")


def statements_in(body: Sequence[Stmt]) -> Iterator[Stmt]:
    """Every statement of `body`, depth first in program order (loops' and ifs' too)."""
    for s in body:
        yield s
        if isinstance(s, For):
            yield from statements_in(s.body)
        elif isinstance(s, If):
            yield from statements_in(s.then)
            yield from statements_in(s.orelse)


def _read_names(body: Sequence[Stmt]) -> set[str]:
    """Arrays the statements load from (expressions and async copies)."""
    names = {n.buffer for s in statements_in(body) for e in _exprs_of(s) for n in walk(e)
             if isinstance(n, Load)}
    return names | {s.src for s in statements_in(body) if isinstance(s, CopyAsync)}


def _exprs_of(s: Stmt) -> tuple[Expr, ...]:
    if isinstance(s, (Let, Assign, CoopReduce)):
        return (s.value,)
    if isinstance(s, LoadWide):
        return (s.load,)
    if isinstance(s, CoopReduceScatter):
        return s.values
    if isinstance(s, Store):
        return (s.index, s.value)
    if isinstance(s, StoreWide):
        return (s.index, *s.values)
    if isinstance(s, For):
        return (s.start, s.stop, s.step)
    if isinstance(s, If):
        return (s.cond,)
    if isinstance(s, CopyAsync):
        return (s.dst_index, s.src_index, s.valid)
    if isinstance(s, MmaTile):
        return (s.a_row, s.a_word, s.b_col, s.b_word)
    if isinstance(s, (MbarInit, MbarArrive)):
        return (s.index,)
    if isinstance(s, MbarWait):
        return (s.index, s.parity)
    if isinstance(s, TmaLoad):
        return (s.dst_index, s.row, s.col, s.bar)
    if isinstance(s, Wgmma):
        return (s.a.first, s.b.first)
    return ()


WIDE_RULE = "2, 4 or 8 elements, 4, 8 or 16 bytes, of a buffer or shared array"


def _wide(count: int, arr) -> bool:
    """Whether LoadWide / StoreWide may move `count` elements of `arr` at once."""
    return (count in (2, 4, 8) and count * arr.dtype.itemsize in (4, 8, 16)
            and not isinstance(arr, LocalArray))


@dataclass
class _Checker:
    kernel: Kernel
    scopes: list[dict[str, tuple[DType, bool]]] = field(default_factory=list)
    declared: set[str] = field(default_factory=set)

    def fail(self, msg: str):
        raise IRError(f"kernel {self.kernel.name}: {msg}")

    def run(self):
        k = self.kernel
        if not 1 <= len(k.grid) <= 3 or not 1 <= len(k.workgroup) <= 3:
            self.fail("grid and workgroup must have 1 to 3 dimensions")
        if min(k.grid) < 1 or min(k.workgroup) < 1:
            self.fail(f"empty grid {k.grid} or workgroup {k.workgroup}")
        names = [a.name for a in (*k.buffers, *k.shared, *k.locals)]
        if len(set(names)) != len(names):
            self.fail(f"duplicate array names in {names}")
        for n in names:
            if n in BUILTINS:
                self.fail(f"array name {n!r} is a reserved builtin")
        for tm in k.tensor_maps:
            self.tensor_map(tm)
        self.scopes.append({n: (I32, False) for n in BUILTINS})
        self.await_inputs()
        self.block(k.body)

    def await_inputs(self):
        k = self.kernel
        waits = [i for i, s in enumerate(k.body) if isinstance(s, AwaitInputs)]
        if sum(isinstance(s, AwaitInputs) for s in k.statements()) > len(waits):
            self.fail("AwaitInputs inside a loop or branch; it belongs in the top-level body")
        if len(waits) > 1:
            self.fail(f"{len(waits)} AwaitInputs; a kernel waits once")
        for s in statements_in(k.body[:waits[0]] if waits else ()):
            if isinstance(s, (Store, StoreWide)) and s.array in {b.name for b in k.buffers}:
                self.fail(f"store to buffer {s.array!r} before AwaitInputs; before the wait "
                          f"a kernel only loads")
            if isinstance(s, TENSOR_ASYNC):
                self.fail(f"{type(s).__name__} before AwaitInputs")

    def tensor_map(self, tm: TensorMap):
        buf = {b.name: b for b in self.kernel.buffers}.get(tm.buffer)
        if buf is None or not buf.access.readable:
            self.fail(f"tensor map {tm.name!r} of unknown or write-only buffer {tm.buffer!r}")
        if tm.rows * tm.cols > buf.count or (tm.cols * buf.dtype.itemsize) % 16:
            self.fail(f"tensor map {tm.name!r}: {tm.rows} x {tm.cols} does not fit {tm.buffer!r} "
                      f"in rows of whole 16 bytes")
        if tm.box_cols * buf.dtype.itemsize != SWIZZLE_BYTES or not 1 <= tm.box_rows <= 256:
            self.fail(f"tensor map {tm.name!r}: boxes are rows of {SWIZZLE_BYTES} bytes, "
                      f"at most 256 rows")

    def block(self, body):
        self.scopes.append({})
        for s in body:
            self.stmt(s)
        self.scopes.pop()

    def lookup(self, name: str):
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        self.fail(f"variable {name!r} used outside its scope")

    def declare(self, name: str, dtype: DType, mutable: bool):
        if name in self.declared or name in BUILTINS or name in self.kernel.arrays():
            self.fail(f"name {name!r} declared twice (names are unique per kernel)")
        self.declared.add(name)
        self.scopes[-1][name] = (dtype, mutable)

    def expr(self, e: Expr, want: DType | None = None):
        arrays = self.kernel.arrays()
        for n in walk(e):
            if isinstance(n, Var):
                dt, _ = self.lookup(n.name)
                if dt is not n.dtype:
                    self.fail(f"variable {n.name!r} is {dt}, used as {n.dtype}")
            elif isinstance(n, Load):
                arr = arrays.get(n.buffer)
                if arr is None:
                    self.fail(f"load from unknown array {n.buffer!r}")
                if isinstance(arr, BufferParam) and not arr.access.readable:
                    self.fail(f"load from write-only buffer {n.buffer!r}")
                if arr.dtype is not n.dtype:
                    self.fail(f"load of {n.dtype} from {n.buffer!r} of {arr.dtype}")
                if n.index.dtype is not I32:
                    self.fail(f"index into {n.buffer!r} is {n.index.dtype}, not i32")
        if want is not None and e.dtype is not want:
            self.fail(f"expected an {want} expression, got {e.dtype}")

    def stmt(self, s: Stmt):
        if isinstance(s, Let):
            self.expr(s.value)
            self.declare(s.name, s.value.dtype, s.mutable)
        elif isinstance(s, LoadWide):
            self.load_wide(s)
        elif isinstance(s, Assign):
            dt, mutable = self.lookup(s.name)
            if not mutable:
                self.fail(f"assignment to immutable {s.name!r}")
            self.expr(s.value, dt)
        elif isinstance(s, (Store, StoreWide)):
            arr = self.kernel.arrays().get(s.array)
            if arr is None:
                self.fail(f"store to unknown array {s.array!r}")
            if isinstance(arr, BufferParam) and not arr.access.writable:
                self.fail(f"store to read-only buffer {s.array!r}")
            self.expr(s.index, I32)
            for value in (s.value,) if isinstance(s, Store) else s.values:
                self.expr(value, arr.dtype)
            if isinstance(s, StoreWide) and not _wide(len(s.values), arr):
                self.fail(f"StoreWide of {len(s.values)} x {arr.dtype} to {arr.name!r}: "
                          f"{WIDE_RULE}")
        elif isinstance(s, For):
            for e in (s.start, s.stop, s.step):
                self.expr(e, I32)
            self.scopes.append({})
            self.declare(s.var, I32, False)
            self.block(s.body)
            self.scopes.pop()
        elif isinstance(s, If):
            self.expr(s.cond, I32)
            self.block(s.then)
            self.block(s.orelse)
        elif isinstance(s, (Barrier, CopyCommit, AwaitInputs)):
            pass
        elif isinstance(s, GroupBarrier):
            w, t = s.width, self.kernel.threads_per_group
            if w < 1 or w & (w - 1) or t % w:
                self.fail(f"group barrier width {w} must be a power of two dividing {t}")
        elif isinstance(s, CopyWait):
            if s.pending < 0:
                self.fail("CopyWait pending must be >= 0")
        elif isinstance(s, CopyAsync):
            self.copy_async(s)
        elif isinstance(s, MmaTile):
            self.mma_tile(s)
        elif isinstance(s, TENSOR_ASYNC):
            self.tensor_async(s)
        elif isinstance(s, CoopReduce):
            self.expr(s.value)
            if s.value.dtype not in (DType.F32, I32):
                self.fail(f"cooperative reduction of {s.value.dtype}; reduce in f32 or i32")
            t = self.kernel.threads_per_group
            w = s.width
            if w is not None and (w < 1 or w & (w - 1) or t % w):
                self.fail(f"reduction width {w} must be a power of two dividing {t}")
            self.declare(s.name, s.value.dtype, False)
        elif isinstance(s, CoopReduceScatter):
            self.reduce_scatter(s)
        else:
            self.fail(f"unknown statement {s!r}")

    def reduce_scatter(self, s: CoopReduceScatter):
        dtypes = {v.dtype for v in s.values}
        for v in s.values:
            self.expr(v)
        if len(dtypes) != 1 or not dtypes <= {DType.F32, I32}:
            self.fail(f"reduce-scatter of {sorted(map(str, dtypes))}; one of f32 or i32")
        v, w, t = len(s.values), s.width, self.kernel.threads_per_group
        if w < 1 or w & (w - 1) or t % w or v & (v - 1) or v > w:
            self.fail(f"reduce-scatter of {v} values over {w} threads: both powers of two, "
                      f"the values at most the width, the width dividing {t}")
        self.declare(s.name, s.values[0].dtype, False)


    def load_wide(self, s: LoadWide):
        self.expr(s.load)
        arr = self.kernel.arrays()[s.load.buffer]
        if not _wide(len(s.names), arr):
            self.fail(f"LoadWide of {len(s.names)} x {arr.dtype} from {arr.name!r}: "
                      f"{WIDE_RULE}")
        for n in s.names:
            self.declare(n, s.load.dtype, False)

    def copy_async(self, s: CopyAsync):
        arrays = self.kernel.arrays()
        src, dst = arrays.get(s.src), arrays.get(s.dst)
        if not isinstance(src, BufferParam) or not src.access.readable:
            self.fail(f"CopyAsync source {s.src!r} must be a readable buffer")
        if not isinstance(dst, SharedArray):
            self.fail(f"CopyAsync destination {s.dst!r} must be a shared array")
        for e in (s.dst_index, s.src_index, s.valid):
            self.expr(e, I32)

    def mma_tile(self, s: MmaTile):
        arrays = self.kernel.arrays()
        acc = arrays.get(s.acc)
        if not isinstance(acc, LocalArray) or acc.dtype is not DType.F32:
            self.fail(f"MmaTile accumulator {s.acc!r} must be a local F32 array")
        if s.acc_first < 0 or s.acc_first + 4 * s.tiles_m * s.tiles_n > acc.count:
            self.fail(f"MmaTile accumulators past the end of {s.acc!r}")
        for name in (s.a, s.b):
            arr = arrays.get(name)
            if not isinstance(arr, SharedArray) or arr.dtype is not DType.U32:
                self.fail(f"MmaTile operand {name!r} must be a shared U32 array")
        if s.unit is None:
            self.fail("MmaTile names no matrix unit (the target's, poot.codegen.target)")
        if s.dtype not in (DType.BF16, DType.F16):
            self.fail(f"MmaTile multiplies BF16 or F16, not {s.dtype}")
        if s.tiles_m < 1 or s.tiles_n < 2 or s.tiles_n % 2:
            self.fail("MmaTile needs tiles_m >= 1 and an even tiles_n")
        if s.a_pitch % 4 or s.b_pitch % 4:
            self.fail("MmaTile rows must start on 16-byte boundaries (pitches of 4 words)")
        if self.kernel.threads_per_group % s.unit.lanes:
            self.fail(f"MmaTile needs whole groups of {s.unit.lanes} threads")
        for e in (s.a_row, s.a_word, s.b_col, s.b_word):
            self.expr(e, I32)


    def tensor_async(self, s: Stmt):
        arrays = self.kernel.arrays()

        def shared(name: str, what: str, align: int = 16) -> SharedArray:
            arr = arrays.get(name)
            if not isinstance(arr, SharedArray) or arr.align < align:
                self.fail(f"{type(s).__name__} {what} {name!r} must be a shared array "
                          f"aligned to {align} bytes")
            return arr

        if hasattr(s, "bars"):
            if shared(s.bars, "mbarriers").dtype is not DType.U32:
                self.fail(f"mbarriers {s.bars!r} must be U32 words (two per barrier)")
        if isinstance(s, TmaLoad):
            tm = {t.name: t for t in self.kernel.tensor_maps}.get(s.tensor_map)
            if tm is None:
                self.fail(f"TmaLoad of unknown tensor map {s.tensor_map!r}")
            if shared(s.dst, "destination", SWIZZLE_SPAN).dtype is not \
                    self.kernel.buffer(tm.buffer).dtype:
                self.fail(f"TmaLoad into {s.dst!r} of another dtype than {tm.buffer!r}")
        if isinstance(s, Wgmma):
            acc = arrays.get(s.acc)
            if not isinstance(acc, LocalArray) or acc.dtype is not DType.F32 \
                    or acc.count < s.n // 2:
                self.fail(f"Wgmma accumulator {s.acc!r} must be a local F32 array of "
                          f"{s.n // 2}")
            if s.dtype not in (DType.BF16, DType.F16) or s.n % 8 or not 8 <= s.n <= 256:
                self.fail(f"Wgmma multiplies BF16 or F16 with n in 8..256 (multiples of 8), "
                          f"not {s.dtype} n={s.n}")
            for t in (s.a, s.b):
                if shared(t.array, "operand", SWIZZLE_SPAN).dtype is not s.dtype:
                    self.fail(f"Wgmma operand {t.array!r} is not {s.dtype}")
            if not s.a.k_major:
                self.fail("Wgmma reads A with rows along M (k_major)")
            if self.kernel.threads_per_group % 128:
                self.fail("Wgmma needs whole warpgroups of 128 threads")
        if isinstance(s, WgmmaWait) and (s.pending < 0 or s.acc and not isinstance(
                arrays.get(s.acc), LocalArray)):
            self.fail("WgmmaWait needs pending >= 0 and a local accumulator array (or none)")
        if isinstance(s, RegisterBudget) and (s.registers % 8 or not 24 <= s.registers <= 256):
            self.fail(f"RegisterBudget of {s.registers} registers (multiples of 8, 24..256)")
        for e in _exprs_of(s):
            self.expr(e, I32)


@dataclass(frozen=True, eq=False)
class KernelProgram:
    """What one planned eqn becomes: kernels dispatched in order.

    `scratch` lists temporaries the kernels share by name (BufferParam.operand is
    SCRATCH); the runtime allocates them, and they hold nothing at the program's start
    nor keep anything for a later step (stream runtimes give every step's scratch the
    same memory; its kernels touch it only after they wait for the step before).
    `alias` names the operand index the
    output must share its buffer with: with no kernels the eqn is a pure alias
    (Reshape); with kernels they update that buffer in place (ScatterUpdate,
    DynamicUpdateSlice write only the changed rows of the donated buffer).
    """

    kernels: tuple[Kernel, ...]
    scratch: tuple[BufferParam, ...] = ()
    alias: int | None = None
