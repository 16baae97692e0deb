"""The KV cache on the host side: which cache rows each token of each sequence uses.

Two forms, both held on the device as State (the graph builder declares them):
- dense: one State per layer [Hkv, S, D] for one sequence; a step writes its T new rows
  at Pos with DynamicUpdateSlice. `DenseCache` tracks the length and refuses to overrun.
- paged: one block pool per layer [P, Hkv, D] (P token slots, grouped in blocks of B
  consecutive slots) shared by every sequence. A step writes new rows with ScatterUpdate
  through a WriteMap slot (the pool slot of each new token, -1 for padding) and reads a
  sequence's rows with Gather through a SlotMap slot (the pool slot of each position).
  `BlockAllocator` hands out blocks per sequence, frees a finished sequence's blocks for
  reuse, and raises CapacityError when the pool has no free block.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from poot.errors import CapacityError


@dataclass
class DenseCache:
    """The length of the one sequence a dense cache of `capacity` positions holds."""

    capacity: int
    length: int = 0

    def reserve(self, n: int) -> int:
        """Claim the next `n` positions; returns the first (the step's Pos)."""
        if self.length + n > self.capacity:
            raise CapacityError(f"dense KV cache holds {self.capacity} positions; "
                                f"{self.length} are used and {n} more were asked")
        start, self.length = self.length, self.length + n
        return start

    def reset(self) -> None:
        self.length = 0


@dataclass
class _Sequence:
    slots: np.ndarray             # the slot map, [capacity] I32: filled as positions are claimed
    blocks: list[int] = field(default_factory=list)
    length: int = 0


class BlockAllocator:
    """Blocks of a paged pool of `pool_slots` token slots, `block` slots per block.

    Each sequence may grow to `capacity` positions (the width of the SlotMap).
    Freed blocks are handed out again before untouched ones (last freed, first reused).
    """

    def __init__(self, pool_slots: int, block: int, capacity: int):
        if block < 1 or pool_slots % block:
            raise CapacityError(f"a pool of {pool_slots} slots does not split into blocks of "
                                f"{block}")
        self.pool_slots, self.block, self.capacity = pool_slots, block, capacity
        self.free_blocks: list[int] = list(range(pool_slots // block - 1, -1, -1))
        self.seqs: dict[object, _Sequence] = {}

    # -- sequences --------------------------------------------------------------------
    def open(self, seq) -> None:
        if seq in self.seqs:
            raise CapacityError(f"sequence {seq!r} is already open")
        self.seqs[seq] = _Sequence(np.zeros(self.capacity, np.int32))

    def close(self, seq) -> None:
        """Finish a sequence: its blocks go back to the pool for the next sequences."""
        s = self._seq(seq)
        self.free_blocks.extend(reversed(s.blocks))
        del self.seqs[seq]

    def length(self, seq) -> int:
        return self._seq(seq).length

    def blocks(self, seq) -> list[int]:
        return list(self._seq(seq).blocks)

    @property
    def free(self) -> int:
        """Free blocks left in the pool."""
        return len(self.free_blocks)

    def _seq(self, seq) -> _Sequence:
        try:
            return self.seqs[seq]
        except KeyError:
            raise CapacityError(f"sequence {seq!r} is not open") from None

    # -- slots ------------------------------------------------------------------------
    def reserve(self, seq, n: int) -> np.ndarray:
        """Claim the next `n` positions of `seq`; returns their pool slots (the WriteMap
        rows of these tokens). Nothing changes when the pool or the sequence is full."""
        s = self._seq(seq)
        if s.length + n > self.capacity:
            raise CapacityError(f"sequence {seq!r} would reach {s.length + n} positions; "
                                f"its slot map holds {self.capacity}")
        need = -(-(s.length + n) // self.block) - len(s.blocks)
        if need > len(self.free_blocks):
            raise CapacityError(f"KV pool out of blocks: sequence {seq!r} needs {need} more "
                                f"blocks of {self.block} slots, {len(self.free_blocks)} are "
                                f"free; finish a sequence or plan a larger pool")
        for _ in range(need):
            s.blocks.append(self.free_blocks.pop())
        start, blk = s.length, self.block
        if n == 1:     # a decode step's token: plain ints (the arrays cost more per row)
            s.slots[start] = s.blocks[start // blk] * blk + start % blk
        else:
            s.slots[start: start + n] = self._slots(s, np.arange(start, start + n))
        s.length = start + n
        return s.slots[start: start + n]      # claimed slots never change while it is open

    def blocks_needed(self, counts: Mapping) -> int:
        """Blocks the pool must hand out for these new tokens (sequence -> count)."""
        blk, need = self.block, 0
        for seq, n in counts.items():
            s = self._seq(seq)
            need += -(-(s.length + n) // blk) - len(s.blocks)
        return need

    def slot_map(self, seq) -> np.ndarray:
        """The pool slot of every position [0, capacity) of `seq` (I32). Positions past
        its length point at slot 0: the causal mask hides them, and SlotMap values must
        lie in [0, pool_slots)."""
        return self.slot_map_view(seq).copy()

    def slot_map_view(self, seq) -> np.ndarray:
        """slot_map(seq) as the allocator keeps it, updated in place as positions are
        claimed (read it, do not write it): a step copies it into its slot array."""
        return self._seq(seq).slots

    def _slots(self, s: _Sequence, positions: np.ndarray) -> np.ndarray:
        blocks = np.asarray(s.blocks, np.int64)[positions // self.block]
        return (blocks * self.block + positions % self.block).astype(np.int32)


__all__ = ["BlockAllocator", "DenseCache"]
