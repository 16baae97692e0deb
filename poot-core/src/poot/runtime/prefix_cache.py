"""Prefix caching: full KV blocks of a paged pool kept by the hash of the tokens before them.

A block that holds `block` tokens whose KV is written is named by a digest of its parent's
digest, its own token ids and the sequence's key (the LoRA adapter, the KV dtype: anything
that changes the rows a token writes), so a digest names the whole prefix up to the block's
end. Sequences that start with the same tokens under the same key then read the same
blocks: each holds a reference, and nobody writes a registered block (a sequence writes
only past its last full block). A block whose last reference goes stays registered, in a
least-recently-used order, until the pool needs a block: then the oldest is evicted (its
digest forgotten) and handed out again. The allocator (poot.runtime.kv.BlockAllocator)
owns the blocks; this keeps which of them are registered, their references and the LRU.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from poot.digest import blake2b

#: bytes of a block digest
DIGEST = 16


def root(key: str) -> bytes:
    """The digest a sequence's first block chains from: its key alone."""
    return blake2b(key.encode(), digest_size=DIGEST).digest()


def chain(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The digest of the block holding `tokens` after the prefix named by `parent`."""
    h = blake2b(parent, digest_size=DIGEST)
    h.update(np.asarray(tokens, np.int64).tobytes())
    return h.digest()


class PrefixCache:
    """Registered blocks of one pool: digest -> block, references, and the LRU of those
    no sequence holds (evictable). Counts its look-ups for /stats."""

    def __init__(self):
        self.by_digest: dict[bytes, int] = {}
        self.digest_of: dict[int, bytes] = {}
        self.refs: dict[int, int] = {}
        #: registered blocks with no reference, least recently used first
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.queried_tokens = 0     # prompt tokens looked up
        self.hit_tokens = 0         # of them, found in cached blocks
        self.evicted = 0

    @property
    def blocks(self) -> int:
        """Registered blocks, held or not."""
        return len(self.digest_of)

    @property
    def evictable(self) -> int:
        return len(self.lru)

    def registered(self, block: int) -> bool:
        return block in self.digest_of

    def match(self, key: str, tokens: Sequence[int], size: int,
              limit: int) -> list[tuple[bytes, int]]:
        """(digest, block) of the registered blocks holding the first whole blocks of
        `tokens` (of `size` tokens) under `key`, at most `limit`, in order; nothing is
        acquired."""
        found, digest = [], root(key)
        for i in range(min(limit, len(tokens) // size)):
            digest = chain(digest, tokens[i * size: (i + 1) * size])
            block = self.by_digest.get(digest)
            if block is None:
                break
            found.append((digest, block))
        return found

    def acquire(self, block: int) -> None:
        """One more sequence reads a registered block (no longer evictable)."""
        self.refs[block] += 1
        self.lru.pop(block, None)

    def register(self, digest: bytes, block: int) -> bool:
        """Name a block its holder has filled (its one reference); False where another
        block already holds this prefix (this one stays private to its sequence)."""
        if digest in self.by_digest:
            return False
        self.by_digest[digest], self.digest_of[block], self.refs[block] = block, digest, 1
        return True

    def release(self, block: int) -> None:
        """A sequence lets go of a registered block; with no reference left it becomes the
        most recently used evictable block."""
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.lru[block] = None

    def evict(self) -> int | None:
        """Forget the least recently used unreferenced block and return it (None: none)."""
        if not self.lru:
            return None
        block, _ = self.lru.popitem(last=False)
        del self.by_digest[self.digest_of.pop(block)], self.refs[block]
        self.evicted += 1
        return block

    def stats(self) -> dict:
        q = self.queried_tokens
        return {"prefix_cache_blocks": self.blocks, "prefix_cache_evictable": self.evictable,
                "prefix_cache_queried_tokens": q, "prefix_cache_hit_tokens": self.hit_tokens,
                "prefix_cache_hit_rate": round(self.hit_tokens / q, 6) if q else 0.0,
                "prefix_cache_evicted": self.evicted}


__all__ = ["PrefixCache", "chain", "root"]
