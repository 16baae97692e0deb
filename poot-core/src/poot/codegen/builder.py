"""A small builder that writes kernel programs with Python blocks.

    kb = KernelBuilder("add", grid=(g,), workgroup=(256,))
    x = kb.buffer("in0", F32, Access.READ, n, operand=0)
    i = kb.let("i", global_id())
    with kb.if_(lt(i, i32(n))):
        kb.store("out", i, x[i] + x[i])
    kernel = kb.finish()
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence

from poot.codegen.expr import Const, Expr, Load, Var, children, i32
from poot.codegen.program import (
    Access,
    Assign,
    AwaitInputs,
    Barrier,
    BufferParam,
    CoopReduce,
    CoopReduceScatter,
    CopyAsync,
    CopyCommit,
    CopyWait,
    For,
    GroupBarrier,
    If,
    Kernel,
    Let,
    LoadWide,
    LocalArray,
    MmaTile,
    SharedArray,
    Stmt,
    Store,
    StoreWide,
    TensorMap,
)
from poot.dtypes import DType
from poot.ir.ops.reduce import ReduceOp


class ArrayRef:
    """A declared array; `ref[index]` is a Load expression."""

    def __init__(self, name: str, dtype: DType, count: int):
        self.name, self.dtype, self.count = name, dtype, count

    def __getitem__(self, index) -> Load:
        return Load(self.name, i32(index), self.dtype)


def _key(v, merged: dict[int, Expr]):
    """A hashable stand-in for one field of an expression node (children by the identity
    of their merged node; floats by repr, so 0.0 and -0.0 stay apart)."""
    if isinstance(v, Expr):
        return id(merged[id(v)])
    return (type(v).__name__, repr(v)) if isinstance(v, float) else v


def _with_children(e: Expr, kids: list[Expr]) -> Expr:
    """`e` over new children (itself when they are unchanged)."""
    old = children(e)
    if all(a is b for a, b in zip(old, kids, strict=True)):
        return e
    swap = dict(zip(map(id, old), kids, strict=True))
    return dataclasses.replace(e, **{f.name: swap[id(getattr(e, f.name))]
                                     for f in dataclasses.fields(e)
                                     if isinstance(getattr(e, f.name), Expr)})


def _merged(values: Sequence[Expr]) -> tuple[list[Expr], dict[tuple, Expr], dict[int, int]]:
    """`values` with structurally equal nodes merged: (roots, every distinct node children
    first, uses of each by id)."""
    canon: dict[tuple, Expr] = {}
    of: dict[int, Expr] = {}
    uses: dict[int, int] = {}

    def merge(e: Expr) -> Expr:
        if id(e) not in of:
            kids = [merge(c) for c in children(e)]
            key = (type(e), *(_key(getattr(e, f.name), of) for f in dataclasses.fields(e)))
            c = canon.get(key)
            if c is None:
                c = canon[key] = _with_children(e, kids)
                for kid in kids:
                    uses[id(kid)] = uses.get(id(kid), 0) + 1
            of[id(e)] = c
        return of[id(e)]

    roots = [merge(v) for v in values]
    for r in roots:
        uses[id(r)] = uses.get(id(r), 0) + 1
    return roots, canon, uses


class KernelBuilder:
    def __init__(self, name: str, grid, workgroup):
        self.name = name
        self.grid = tuple(int(g) for g in grid)
        self.workgroup = tuple(int(w) for w in workgroup)
        self._buffers: list[BufferParam] = []
        self._shared: list[SharedArray] = []
        self._locals: list[LocalArray] = []
        self._tensor_maps: list[TensorMap] = []
        self._blocks: list[list[Stmt]] = [[]]
        self._names: dict[str, int] = {}

    # -- declarations -------------------------------------------------------------
    def buffer(self, name: str, dtype: DType, access: Access, count: int,
               operand: int | None = None) -> ArrayRef:
        self._buffers.append(BufferParam(name, dtype, access, int(count), operand))
        return ArrayRef(name, dtype, count)

    def shared(self, name: str, dtype: DType, count: int, align: int = 16) -> ArrayRef:
        self._shared.append(SharedArray(name, dtype, int(count), align))
        return ArrayRef(name, dtype, count)

    def tensor_map(self, tm: TensorMap) -> str:
        """Declare a tensor map parameter (TmaLoad's source); returns its name."""
        self._tensor_maps.append(tm)
        return tm.name

    def local(self, name: str, dtype: DType, count: int) -> ArrayRef:
        self._locals.append(LocalArray(name, dtype, int(count)))
        return ArrayRef(name, dtype, count)

    def array(self, name: str) -> ArrayRef:
        """The declared buffer, shared or local array `name`."""
        for a in (*self._buffers, *self._shared, *self._locals):
            if a.name == name:
                return ArrayRef(a.name, a.dtype, a.count)
        raise KeyError(name)

    def fresh(self, base: str) -> str:
        """A variable name not used yet in this kernel (names are unique per kernel)."""
        n = self._names.get(base, 0)
        self._names[base] = n + 1
        return base if n == 0 else f"{base}_{n}"

    # -- statements -----------------------------------------------------------------
    def emit(self, stmt: Stmt) -> None:
        self._blocks[-1].append(stmt)

    def let(self, name: str, value: Expr, mutable: bool = False) -> Var:
        s = Let(self.fresh(name), value, mutable)
        self.emit(s)
        return s.var

    def load_wide(self, name: str, array: ArrayRef | str, index, count: int) -> list[Var]:
        """`count` (2 or 4) consecutive 32-bit elements from `index` (a multiple of
        `count`) in one load (program.LoadWide; the target must declare WIDE_LOADS)."""
        ref = array if isinstance(array, ArrayRef) else self.array(array)
        s = LoadWide(tuple(self.fresh(name) for _ in range(count)), ref[index])
        self.emit(s)
        return s.vars

    def var(self, name: str, value: Expr) -> Var:
        return self.let(name, value, mutable=True)

    def let_shared(self, name: str, values: Sequence[Expr]) -> list[Expr]:
        """`values` with common subexpressions computed once. Structurally equal nodes are
        merged (decode programs rebuild the same word load per element); every Load, and
        every other node used more than once, is bound by a Let, loads first so that they
        are all in flight before the arithmetic. Returns the values over those variables."""
        roots, canon, uses = _merged(values)
        bound: dict[int, Expr] = {}

        def emit(e: Expr) -> Expr:
            if id(e) not in bound:
                rebuilt = _with_children(e, [emit(c) for c in children(e)])
                shared = uses.get(id(e), 0) > 1 or isinstance(e, Load)
                bound[id(e)] = self.let(name, rebuilt) if shared and not isinstance(
                    e, (Const, Var)) else rebuilt
            return bound[id(e)]

        for e in canon.values():    # insertion order is children first
            if isinstance(e, Load):
                emit(e)
        return [emit(r) for r in roots]

    def hold(self, name: str, values: Sequence[Expr]) -> tuple[list[Expr], Callable[[], None]]:
        """`values` over variables that hold their loads: every distinct Load (merged as in
        `let_shared`) is read into a mutable variable here. Returns (the values over those
        variables, reload), where reload() emits their reads again, each index evaluated
        then: a pipeline reads the next step's operands into the variables (the index
        expressions naming variables it has advanced) while it computes with this one's."""
        roots, canon, _ = _merged(values)
        over: dict[int, Expr] = {}
        reads: list[tuple[Var, Expr]] = []
        for e in canon.values():    # children first: a load's index is over held loads
            rebuilt = _with_children(e, [over[id(c)] for c in children(e)])
            if isinstance(e, Load):
                var = self.var(name, rebuilt)
                reads.append((var, rebuilt))
                rebuilt = var
            over[id(e)] = rebuilt

        def reload() -> None:
            for var, load in reads:
                self.assign(var, load)
        return [over[id(r)] for r in roots], reload

    def assign(self, var: Var, value: Expr) -> None:
        self.emit(Assign(var.name, value))

    def store(self, array: str | ArrayRef, index, value: Expr) -> None:
        name = array.name if isinstance(array, ArrayRef) else array
        self.emit(Store(name, i32(index), value))

    def store_wide(self, array: str | ArrayRef, index, values: Sequence[Expr]) -> None:
        """values[i] -> array[index + i] in one store (program.StoreWide; `index` a multiple
        of len(values); the target must declare WIDE_LOADS)."""
        name = array.name if isinstance(array, ArrayRef) else array
        self.emit(StoreWide(name, i32(index), tuple(values)))

    def barrier(self) -> None:
        self.emit(Barrier())

    def group_barrier(self, width: int) -> None:
        """A barrier of each aligned group of `width` threads (program.GroupBarrier)."""
        self.emit(GroupBarrier(width))

    def await_inputs(self) -> None:
        """Wait for the kernels before this one here (program.AwaitInputs): only loads of
        constants come before, so their latency overlaps the previous kernel's work."""
        self.emit(AwaitInputs())

    def reduce(self, name: str, op: ReduceOp, value: Expr, width: int | None = None) -> Var:
        s = CoopReduce(self.fresh(name), op, value, width)
        self.emit(s)
        return s.var

    def reduce_scatter(self, name: str, op: ReduceOp, values: Sequence[Expr],
                       width: int) -> Var:
        """CoopReduceScatter (the target must declare REDUCE_SCATTER)."""
        s = CoopReduceScatter(self.fresh(name), op, tuple(values), width)
        self.emit(s)
        return s.var

    def copy_async(self, dst: ArrayRef, dst_index, src: ArrayRef, src_index, valid) -> None:
        self.emit(CopyAsync(dst.name, i32(dst_index), src.name, i32(src_index), i32(valid)))

    def copy_commit(self) -> None:
        self.emit(CopyCommit())

    def copy_wait(self, pending: int) -> None:
        self.emit(CopyWait(pending))

    def mma(self, tile: MmaTile) -> None:
        self.emit(tile)

    @contextlib.contextmanager
    def for_(self, name: str, start, stop, step=1) -> Iterator[Var]:
        var = self.fresh(name)
        self._blocks.append([])
        yield Var(var)
        body = self._blocks.pop()
        self.emit(For(var, i32(start), i32(stop), i32(step), tuple(body)))

    @contextlib.contextmanager
    def if_(self, cond: Expr) -> Iterator[None]:
        self._blocks.append([])
        yield
        self.emit(If(cond, tuple(self._blocks.pop())))

    @contextlib.contextmanager
    def else_(self) -> Iterator[None]:
        """Attach an else block to the If just emitted."""
        last = self._blocks[-1].pop()
        if not isinstance(last, If) or last.orelse:
            raise RuntimeError("else_ must follow an if_ block")
        self._blocks.append([])
        yield
        self.emit(If(last.cond, last.then, tuple(self._blocks.pop())))

    def finish(self) -> Kernel:
        if len(self._blocks) != 1:
            raise RuntimeError("unclosed block")
        return Kernel(self.name, tuple(self._buffers), self.grid, self.workgroup,
                      tuple(self._blocks[0]), tuple(self._shared), tuple(self._locals),
                      tuple(self._tensor_maps)).validate()
