"""Fixed arena offsets for values with known lifetimes.

Every value needs bytes [offset, offset + size) from its definition to its last use
(inclusive). Values are placed in order of definition, each at the lowest 256-aligned
offset that no live value overlaps (first fit); a value dies after its last use, so an
eqn's output never shares bytes with an operand it reads.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from poot.contract import ALIGN, align


@dataclass(frozen=True)
class Interval:
    key: object
    start: int       # index of the defining eqn
    end: int         # index of the last eqn that reads it (or the step's end)
    nbytes: int


def assign_offsets(intervals: list[Interval]) -> tuple[dict[object, int], int]:
    """Offsets by key and the arena size; overlapping lifetimes never share bytes."""
    order = sorted(intervals, key=lambda iv: (iv.start, -iv.nbytes))
    live: list[tuple[int, int, int]] = []        # (offset, size, end), sorted by offset
    offsets: dict[object, int] = {}
    peak = 0
    for iv in order:
        live = [blk for blk in live if blk[2] >= iv.start]
        size = align(max(iv.nbytes, 1), ALIGN)
        offset = _first_fit(live, size)
        bisect.insort(live, (offset, size, iv.end))
        offsets[iv.key] = offset
        peak = max(peak, offset + size)
    return offsets, peak


def _first_fit(live: list[tuple[int, int, int]], size: int) -> int:
    cursor = 0
    for offset, blk_size, _ in live:
        if offset - cursor >= size:
            return cursor
        cursor = max(cursor, offset + blk_size)
    return cursor
