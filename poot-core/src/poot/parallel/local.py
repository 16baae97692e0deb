"""A tensor-parallel group of ranks in one process (threads over host arrays).

The reference runtime's communicator: each rank's executor steps in its own thread, and
a collective waits for every rank's operand, computes what the N-rank oracle computes
(poot.oracle.ranks.combine) and hands each rank its result. For tests of the planned and
compiled rank graphs on the CPU, and the CPU backends' `--tp` runs.
"""
from __future__ import annotations

import threading

import numpy as np

from poot.dtypes import DType
from poot.ir.ops import AllGather, AllReduce
from poot.oracle.ranks import combine


class LocalGroup:
    processes = False                 # ranks are threads of one process

    def __init__(self, ranks: int):
        self.ranks = ranks
        self.barrier = threading.Barrier(ranks)
        self.parts: list[np.ndarray | None] = [None] * ranks

    def member(self, rank: int, device=None) -> LocalMember:
        return LocalMember(self, rank)


class LocalMember:
    """One rank of a LocalGroup (poot.contract.Communicator over host arrays)."""

    dtypes = frozenset(d for d in DType if d.is_float)

    def __init__(self, group: LocalGroup, rank: int):
        self.group, self.rank, self.ranks = group, rank, group.ranks

    def _run(self, op, src: np.ndarray, out: np.ndarray) -> None:
        g = self.group
        g.parts[self.rank] = np.array(src).reshape(-1)
        g.barrier.wait()              # every rank's operand is in
        out.reshape(-1)[...] = combine(op, g.parts)[self.rank]
        g.barrier.wait()              # every rank has read them: the parts may be reused

    def all_reduce(self, src: np.ndarray, out: np.ndarray) -> None:
        self._run(AllReduce(self.ranks), src, out)

    def all_gather(self, src: np.ndarray, out: np.ndarray) -> None:
        self._run(AllGather(self.ranks, 0), src, out)


def run_ranks(group: LocalGroup, fns) -> list:
    """Call each rank's function in a thread of its own; their results in rank order. A
    rank that fails aborts the group (the others' waits raise BrokenBarrierError) and its
    exception is re-raised here."""
    results: list = [None] * len(fns)
    errors: list = []

    def go(i, fn):
        try:
            results[i] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised below, in the caller's thread
            errors.append(e)
            group.barrier.abort()

    threads = [threading.Thread(target=go, args=(i, f)) for i, f in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)),
                   errors[0])
    return results
