"""The KV cache on the host side: which cache rows each token of each sequence uses.

Two forms, both held on the device as State (the graph builder declares them):
- dense: one State per layer [Hkv, S, D] for one sequence; a step writes its T new rows
  at Pos with DynamicUpdateSlice. `DenseCache` tracks the length and refuses to overrun.
- paged: one block pool per layer [P, Hkv, D] (P token slots, grouped in blocks of B
  consecutive slots) shared by every sequence. A step writes new rows with ScatterUpdate
  through a WriteMap slot (the pool slot of each new token, -1 for padding) and reads a
  sequence's rows with Gather through a SlotMap slot (the pool slot of each position).
  `BlockAllocator` hands out blocks per sequence, frees a finished sequence's blocks for
  reuse, and raises CapacityError when the pool has no free block. With a prefix cache
  (poot.runtime.prefix_cache) the full blocks whose tokens are known stay registered by the
  hash of their prefix: a new sequence starts with the cached blocks of its prompt
  (`reuse`), shared read-only, and a finished sequence's registered blocks wait in an LRU
  until the pool is short. The slot map of every layer and every State of a layer (a q8_0
  cache's codes and scales) is the same, so a shared block is shared by all of them.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from poot.errors import CapacityError
from poot.runtime.prefix_cache import PrefixCache, chain, root


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

    def rollback(self, n: int) -> None:
        """Drop the last `n` positions: the next step writes over their rows."""
        if not 0 <= n <= self.length:
            raise CapacityError(f"dense KV cache holds {self.length} positions; {n} cannot "
                                f"be dropped")
        self.length -= n


@dataclass
class _Sequence:
    slots: np.ndarray             # the slot map, [capacity] I32: filled as positions are claimed
    blocks: list[int] = field(default_factory=list)
    length: int = 0
    key: str = ""                 # what besides the tokens makes its KV rows (prefix cache)
    ids: list[int] = field(default_factory=list)      # token id per position, -1: unknown
    digests: list[bytes] = field(default_factory=list)   # of its first full blocks


class BlockAllocator:
    """Blocks of a paged pool of `pool_slots` token slots, `block` slots per block.

    Each sequence may grow to `capacity` positions (the width of the SlotMap).
    Freed blocks are handed out again before untouched ones (last freed, first reused),
    and before cached blocks no sequence holds (least recently used first).
    """

    def __init__(self, pool_slots: int, block: int, capacity: int,
                 prefix_cache: bool = False):
        if block < 1 or pool_slots % block:
            raise CapacityError(f"a pool of {pool_slots} slots does not split into blocks of "
                                f"{block}")
        self.pool_slots, self.block, self.capacity = pool_slots, block, capacity
        self.free_blocks: list[int] = list(range(pool_slots // block - 1, -1, -1))
        self.seqs: dict[object, _Sequence] = {}
        self.cache: PrefixCache | None = PrefixCache() if prefix_cache else None

    def use_prefix_cache(self, on: bool) -> None:
        """Turn prefix caching on (an empty cache) or off, with no sequence open."""
        if self.seqs:
            raise CapacityError(f"the prefix cache changes only with no sequence open; "
                                f"{len(self.seqs)} are")
        self.free_blocks = list(range(self.pool_slots // self.block - 1, -1, -1))
        self.cache = PrefixCache() if on else None

    # -- sequences --------------------------------------------------------------------
    def open(self, seq, key: str = "") -> None:
        """Open a sequence; `key` names what besides its tokens makes its KV rows (the
        LoRA adapter): only sequences of the same key share cached blocks."""
        if seq in self.seqs:
            raise CapacityError(f"sequence {seq!r} is already open")
        self.seqs[seq] = _Sequence(np.zeros(self.capacity, np.int32), key=key)

    def close(self, seq, tokens=None) -> None:
        """Finish a sequence: its private blocks go back to the pool for the next
        sequences, its cached ones to the LRU once no sequence holds them. `tokens` (its
        ids so far, prompt and answer) lets the cache keep the full blocks whose KV the
        steps wrote; leave it out where a step failed (its rows may be unwritten)."""
        s = self._seq(seq)
        if tokens is not None and self.cache is not None:
            n = min(len(tokens), s.length)
            s.ids[:n] = [int(t) for t in tokens[:n]]
            self.seal(seq)
        del self.seqs[seq]
        for b in reversed(s.blocks):      # the last block first: a chain's tail goes first
            if self.cache is not None and self.cache.registered(b):
                self.cache.release(b)
            else:
                self.free_blocks.append(b)

    def reusable(self, key: str, tokens) -> tuple[int, int]:
        """For a prompt not yet opened: how many cached blocks `reuse` would give it, and
        how many of them no sequence holds now (they leave the free count)."""
        if self.cache is None:
            return 0, 0
        found = self.cache.match(key, tokens, self.block, (len(tokens) - 1) // self.block)
        return len(found), sum(self.cache.refs[b] == 0 for _, b in found)

    def reuse(self, seq, tokens) -> int:
        """Start a new sequence with the cached blocks of its prompt's first whole blocks,
        keeping at least the prompt's last token to feed (its logits start the answer, and
        its row goes to a block of its own); returns the positions it now holds."""
        s = self._seq(seq)
        if s.length:
            raise CapacityError(f"sequence {seq!r} already holds {s.length} positions")
        if self.cache is None:
            return 0
        found = self.cache.match(s.key, tokens, self.block, (len(tokens) - 1) // self.block)
        for _, b in found:
            self.cache.acquire(b)
        n = len(found) * self.block
        s.digests, s.blocks, s.length = [d for d, _ in found], [b for _, b in found], n
        s.ids = [int(t) for t in tokens[:n]]
        if n:
            s.slots[:n] = self._slots(s, np.arange(n))
        self.cache.queried_tokens += len(tokens)
        self.cache.hit_tokens += n
        return n

    def seal(self, seq) -> None:
        """Register the full blocks of `seq` whose tokens are all known (after the step
        that wrote them), in order, up to the first with a token not known."""
        s = self._seq(seq)
        if self.cache is None:
            return
        blk = self.block
        while len(s.digests) < s.length // blk:
            i = len(s.digests)
            toks = s.ids[i * blk: (i + 1) * blk]
            if min(toks) < 0:
                return
            s.digests.append(chain(s.digests[-1] if s.digests else root(s.key), toks))
            self.cache.register(s.digests[-1], s.blocks[i])

    def length(self, seq) -> int:
        return self._seq(seq).length

    def blocks(self, seq) -> list[int]:
        return list(self._seq(seq).blocks)

    @property
    def free(self) -> int:
        """Blocks the pool can hand out: free ones and cached ones no sequence holds."""
        return len(self.free_blocks) + (self.cache.evictable if self.cache else 0)

    def _seq(self, seq) -> _Sequence:
        try:
            return self.seqs[seq]
        except KeyError:
            raise CapacityError(f"sequence {seq!r} is not open") from None

    # -- slots ------------------------------------------------------------------------
    def reserve(self, seq, n: int, tokens=None) -> np.ndarray:
        """Claim the next `n` positions of `seq` for these token ids (None: not known to
        the host, e.g. fed on the device); returns their pool slots (the WriteMap rows of
        these tokens). Nothing changes when the pool or the sequence is full."""
        s = self._seq(seq)
        if s.length + n > self.capacity:
            raise CapacityError(f"sequence {seq!r} would reach {s.length + n} positions; "
                                f"its slot map holds {self.capacity}")
        need = -(-(s.length + n) // self.block) - len(s.blocks)
        if need > self.free:
            raise CapacityError(f"KV pool out of blocks: sequence {seq!r} needs {need} more "
                                f"blocks of {self.block} slots, {self.free} are "
                                f"free; finish a sequence or plan a larger pool")
        for _ in range(need):
            s.blocks.append(self.free_blocks.pop() if self.free_blocks else self.cache.evict())
        if self.cache is not None:
            s.ids.extend([-1] * n if tokens is None else [int(t) for t in tokens])
        start, blk = s.length, self.block
        if n == 1:     # a decode step's token: plain ints (the arrays cost more per row)
            s.slots[start] = s.blocks[start // blk] * blk + start % blk
        else:
            s.slots[start: start + n] = self._slots(s, np.arange(start, start + n))
        s.length = start + n
        return s.slots[start: start + n]      # claimed slots never change while it is open

    def rollback(self, seq, n: int) -> None:
        """Drop the last `n` positions of `seq` (tokens a step wrote and the caller
        rejected: speculative decoding's verification). Blocks left empty go back to the
        pool; the rows of the kept positions stay as written. Positions in blocks the
        prefix cache registered cannot be dropped: seal only after a step's rows are kept."""
        s = self._seq(seq)
        if not 0 <= n <= s.length - len(s.digests) * self.block:
            raise CapacityError(f"sequence {seq!r} holds {s.length} positions, "
                                f"{len(s.digests) * self.block} of them in cached blocks; "
                                f"{n} cannot be dropped")
        s.length -= n
        keep = -(-s.length // self.block)
        self.free_blocks.extend(reversed(s.blocks[keep:]))
        del s.blocks[keep:]
        if self.cache is not None:
            del s.ids[s.length:]

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
