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
from collections.abc import Iterator

from poot.codegen.expr import Expr, Load, Var, i32
from poot.codegen.program import (
    Access,
    Assign,
    Barrier,
    Buffer,
    CoopReduce,
    CopyAsync,
    CopyCommit,
    CopyWait,
    For,
    If,
    Kernel,
    Let,
    LocalArray,
    MmaTile,
    SharedArray,
    Stmt,
    Store,
)
from poot.dtypes import DType
from poot.ir.ops.reduce import ReduceOp


class ArrayRef:
    """A declared array; `ref[index]` is a Load expression."""

    def __init__(self, name: str, dtype: DType, count: int):
        self.name, self.dtype, self.count = name, dtype, count

    def __getitem__(self, index) -> Load:
        return Load(self.name, i32(index), self.dtype)


class KernelBuilder:
    def __init__(self, name: str, grid, workgroup):
        self.name = name
        self.grid = tuple(int(g) for g in grid)
        self.workgroup = tuple(int(w) for w in workgroup)
        self._buffers: list[Buffer] = []
        self._shared: list[SharedArray] = []
        self._locals: list[LocalArray] = []
        self._blocks: list[list[Stmt]] = [[]]
        self._names: dict[str, int] = {}

    # -- declarations -------------------------------------------------------------
    def buffer(self, name: str, dtype: DType, access: Access, count: int,
               operand: int | None = None) -> ArrayRef:
        self._buffers.append(Buffer(name, dtype, access, int(count), operand))
        return ArrayRef(name, dtype, count)

    def shared(self, name: str, dtype: DType, count: int) -> ArrayRef:
        self._shared.append(SharedArray(name, dtype, int(count)))
        return ArrayRef(name, dtype, count)

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

    def var(self, name: str, value: Expr) -> Var:
        return self.let(name, value, mutable=True)

    def assign(self, var: Var, value: Expr) -> None:
        self.emit(Assign(var.name, value))

    def store(self, array: str | ArrayRef, index, value: Expr) -> None:
        name = array.name if isinstance(array, ArrayRef) else array
        self.emit(Store(name, i32(index), value))

    def barrier(self) -> None:
        self.emit(Barrier())

    def reduce(self, name: str, op: ReduceOp, value: Expr, width: int | None = None) -> Var:
        s = CoopReduce(self.fresh(name), op, value, width)
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
                      tuple(self._blocks[0]), tuple(self._shared), tuple(self._locals)).validate()
