"""Outputs moved off the buffer their batch-mates bind, so wgpu does not order them.

wgpu tracks usage per buffer and per dispatch: a dispatch waits for earlier work when it
binds a buffer an earlier dispatch of the pass bound, unless both bound it read-only. A
plan's values share one arena buffer, so two dispatches that touch disjoint bytes of it
(SmolLM2: each layer's rotation of q beside the writes of its K and V rows, all reading
the q|k|v product) still wait for each other. Cut by byte ranges (the hazard rule the
vulkan backend places its barriers by), those dispatches form one batch; where a
dispatch joins a batch whose earlier dispatch wrote a buffer it binds, or writes a
buffer a batch-mate bound, the writer's output moves, with every later reader, to a bank:
a buffer of its own where no batch-mate binds anything, each moved output at an aligned
offset whose last value has no reader left (so a bank holds a few layers' worth, not
every layer's). What moves, and how far its readers follow it, is the rule every
backend shares (poot.runtime.renaming), so the step computes exactly what it did.
"""
from __future__ import annotations

from dataclasses import dataclass

from poot.runtime.renaming import Access, Op, followers


@dataclass
class Pending:
    """A dispatch before it is bound: its printed kernel, its bound ranges ({buffer,
    offset, size} per binding), which bindings it writes, and the binding of the output
    its step defines anew (None where there is none) with whether it is the step's only
    dispatch."""

    printed: object
    resources: list[dict]
    writes: tuple[bool, ...]
    out: int | None = None
    sole: bool = False

    def accesses(self) -> tuple[Access, ...]:
        return tuple(Access(r["buffer"], r["offset"], r["offset"] + r["size"], w)
                     for r, w in zip(self.resources, self.writes, strict=True))

    def buffers(self) -> set[int]:
        return {id(r["buffer"]) for r in self.resources}

    def written(self) -> set[int]:
        return {id(r["buffer"]) for r, w in zip(self.resources, self.writes, strict=True)
                if w}


class _Bank:
    """Stands for a bank buffer until its size is known; its slots are reused once the
    value in them has no reader left (wgpu orders the new write after the old reads)."""

    def __init__(self):
        self.top = 0
        self.slots: list[list[int]] = []  # [offset, bytes, the op reading it last]

    def place(self, nbytes: int, first: int, last: int) -> int:
        """The offset of `nbytes` for a value written by op `first`, read up to op `last`."""
        for slot in self.slots:
            if slot[2] < first and slot[1] >= nbytes:
                slot[2] = last
                return slot[0]
        self.slots.append([self.top, nbytes, last])
        self.top += nbytes
        return self.slots[-1][0]


def _clash(accesses, pending) -> bool:
    return any(a.overlaps(p.buffer, p.start, p.end) and (a.writes or p.writes)
               for a in accesses for p in pending)


def bank_outputs(ops: list[Pending], align: int, alloc, kept: list[Access]) -> list:
    """Move outputs of `ops` (in place) to banks where that saves wgpu a wait (module
    doc); `kept` are the ranges read after them (the plan's outputs and copy sources);
    `alloc(nbytes)` makes a bank's buffer. Returns the buffers made."""
    banks: list[_Bank] = []
    batch: list[int] = []
    for i, op in enumerate(ops):
        if batch and _clash(op.accesses(), [a for j in batch for a in ops[j].accesses()]):
            batch = []
        mates = batch + [i]
        for j in batch:  # a batch-mate that wrote a buffer this one binds
            if ops[j].written() & op.buffers():
                _move(ops, j, mates, banks, align, kept)
        if batch and op.written() & {b for j in batch for b in ops[j].buffers()}:
            _move(ops, i, mates, banks, align, kept)
        batch = mates
    made = []
    for bank in banks:
        if bank.top:
            buf = alloc(bank.top)
            made.append(buf)
            for op in ops:
                for r in op.resources:
                    if r["buffer"] is bank:
                        r["buffer"] = buf.gpu
    return made


def _move(ops: list[Pending], i: int, mates: list[int], banks: list[_Bank], align: int,
          kept: list[Access]) -> None:
    """Op i's output and its readers to a bank no other op of the batch `mates` binds, and
    where op i is not the batch's first (so wgpu would order a write to a buffer used
    before), one no earlier op binds; only where the shared rule allows the move."""
    moves = followers([Op(o.accesses(), o.out, o.sole) for o in ops], i, align, kept)
    if moves is None:
        return
    others = [j for j in mates if j != i] + (list(range(i)) if i != mates[0] else [])
    bound = {b for j in others for b in ops[j].buffers()}
    bank = next((b for b in banks if id(b) not in bound), None)
    if bank is None:
        bank = _Bank()
        banks.append(bank)
    out = ops[i].resources[ops[i].out]
    at = bank.place(-(-out["size"] // align) * align, i, max(j for j, _ in moves))
    for j, k in moves:
        r = ops[j].resources[k]
        ops[j].resources[k] = dict(r, buffer=bank, offset=at + r["offset"] - out["offset"])


__all__ = ["Pending", "bank_outputs"]
