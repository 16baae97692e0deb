"""How contraction kernels write their results: the flat store most problems use, and one
lane's part of a tensor-core accumulator tile through any problem's store."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from poot.codegen import index as ix
from poot.codegen.expr import Expr, i32
from poot.codegen.target import MMA_M16N8K16
from poot.dtypes import DType


@dataclass(frozen=True)
class FlatStore:
    """Stores out[(b*M + m)*N + n] = acc cast to the output dtype, through `epilogue`
    (flat index, acc) -> value when given; called as a Problem's `store`."""

    dtype: DType
    m: int
    n: int
    epilogue: Callable | None = None

    def _at(self, kb, b, m, n):
        return kb.let("o", ix.add(ix.mul(ix.add(ix.mul(b, self.m), m), self.n), n))

    def _value(self, kb, idx, acc):
        return acc.cast(self.dtype) if self.epilogue is None else self.epilogue(kb, idx, acc)

    def __call__(self, kb, b, m, n, acc):
        idx = self._at(kb, b, m, n)
        kb.store("out", idx, self._value(kb, idx, acc))

    def widens(self, count: int) -> bool:
        """Whether `wide` may store `count` columns at once: N a multiple of it, 4 to 16
        bytes in all."""
        return self.n % count == 0 and count * self.dtype.itemsize in (4, 8, 16)

    def wide(self, kb, b, m, n, accs):
        """Columns n .. n + len(accs) - 1 (n a multiple of their count; `widens` holds) in
        one StoreWide (the caller's target has WIDE_LOADS)."""
        idx = self._at(kb, b, m, n)
        kb.store_wide("out", idx, [self._value(kb, ix.add(idx, i), a)
                                   for i, a in enumerate(accs)])


def store_flat(sig, m_count: int, n_count: int, epilogue=None) -> FlatStore:
    return FlatStore(sig.out.dtype, m_count, n_count, epilogue)


def store_fragment(kb, p, b, m, n, values: list[Expr], wide: bool) -> None:
    """One lane's four values of a 16 x 8 accumulator tile (MMA_M16N8K16's layout: rows m
    and m + 8, columns n and n + 1; n even) through `p.store`, rows past M and columns past
    N skipped. With `wide` (the target has WIDE_LOADS) and a FlatStore over an even N, each
    row's two columns go in one store: half the store instructions, whole 32-bit words."""
    pairs = wide and isinstance(p.store, FlatStore) and p.store.widens(2)
    for r in range(0, 4, 2 if pairs else 1):
        dr, dc = MMA_M16N8K16.coords(0, r)
        row = kb.let("m", ix.add(m, dr))
        col = kb.let("n", ix.add(n, dc))
        with kb.if_(ix.both(ix.lt(row, i32(p.m)), ix.lt(col, i32(p.n)))):
            if pairs:                   # n even and N even: n + 1 < N as well
                p.store.wide(kb, b, row, col, values[r:r + 2])
            else:
                p.store(kb, b, row, col, values[r])
