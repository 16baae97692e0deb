"""Which later bindings follow a step's output when a backend moves it to other bytes.

A GPU backend moves an output off the bytes the planner gave it where sharing them would
order two dispatches that do not depend on each other (poot_vulkan.rename: a
write-after-read barrier; poot_wgpu.banks: wgpu's per-buffer usage tracking). The move is
sound only where it is provably the same computation, which is decided here on plain
accesses, the same way for every backend:

- the writer is its step's only dispatch and defines the step's output anew (`Op.out`,
  `Op.sole`: every byte written, not in place, not an update of an aliased buffer), and
  reads nothing of that range through another binding;
- every later access of the range is a dispatch's read inside it (at an offset from its
  start that is a multiple of `align`, the moved place's alignment), up to the first
  dispatch that defines a new output there: the planner places a value only on dead bytes,
  so readers after that want the new value;
- that redefinition comes before the end of the operations, or the caller names what the
  host or the next step reads after them (`kept`) and the range is none of it: an arena
  value lives from its eqn to its last reader, so bytes no later operation rewrites are
  dead at the end unless the plan reads them out;
- an operation that is not a dispatch (`Op.opaque`: a buffer copy) touching the range
  stops the move.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Access:
    buffer: object
    start: int
    end: int
    writes: bool

    def overlaps(self, buffer, start: int, end: int) -> bool:
        return self.buffer is buffer and self.start < end and start < self.end


@dataclass(frozen=True)
class Op:
    """One operation's accesses in binding order; `out` the binding of the output its step
    defines anew (None where there is none); `sole` where it is its step's only dispatch;
    `opaque` for an operation that is not a dispatch."""

    accesses: tuple[Access, ...]
    out: int | None = None
    sole: bool = False
    opaque: bool = False


def followers(ops: Sequence[Op], i: int, align: int = 1,
              kept: Sequence[Access] | None = None) -> list[tuple[int, int]] | None:
    """The (operation, binding) places that move with op i's output (its own first), or
    None where the move would not be the same computation (module doc). `kept`: the ranges
    read after the operations (None: any byte may be)."""
    op = ops[i]
    if op.out is None or not op.sole:
        return None
    out = op.accesses[op.out]
    buf, start, end = out.buffer, out.start, out.end
    if any(a.overlaps(buf, start, end) for k, a in enumerate(op.accesses) if k != op.out):
        return None
    moves = [(i, op.out)]
    for j in range(i + 1, len(ops)):
        later = ops[j]
        if later.opaque:
            if any(a.overlaps(buf, start, end) for a in later.accesses):
                return None
            continue
        redefined = False
        for k, a in enumerate(later.accesses):
            if not a.overlaps(buf, start, end):
                continue
            if a.writes:
                if k != later.out:
                    return None
                redefined = True
                continue
            if a.start < start or a.end > end or (a.start - start) % align:
                return None
            moves.append((j, k))
        if redefined:
            return moves
    if kept is None or any(a.overlaps(buf, start, end) for a in kept):
        return None
    return moves


__all__ = ["Access", "Op", "followers"]
