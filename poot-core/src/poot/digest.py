"""Content digests for cache keys and names, from CPython's own BLAKE2 module.

`import hashlib` imports `_hashlib`, which maps OpenSSL's libcrypto into the process for
the rest of its life (a few MiB resident) even where only BLAKE2 is used, and BLAKE2
never comes from OpenSSL. Code on a model run's path hashes through here; code that
needs another algorithm (a download's published SHA-256) imports hashlib where it hashes.
"""
from __future__ import annotations

try:
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - an interpreter without CPython's module
    from hashlib import blake2b


def hexdigest(*parts: bytes | str, size: int = 16) -> str:
    """The hex BLAKE2b digest (`size` bytes) of `parts`, each ended by a NUL byte so that
    no two different part lists hash alike."""
    h = blake2b(digest_size=size)
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()


__all__ = ["blake2b", "hexdigest"]
