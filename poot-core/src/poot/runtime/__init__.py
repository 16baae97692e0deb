"""poot.runtime: runs a Plan on a backend's Runtime, step after step.

The Runtime, Executable and DeviceBuffer protocols a backend implements are in
`poot.contract`.
`Executor(plan, consts)` (executor.py) binds weights once through a `WeightCache`,
rewrites slots in place after checking them, keeps donated state, and runs steps.
`BlockAllocator` / `DenseCache` (kv.py) hand out KV cache rows per sequence, and
`Session` (session.py) prefills and decodes sequences through plans of one graph builder.
"""
from __future__ import annotations

_LAZY = {
    "Executor": "poot.runtime.executor",
    "load": "poot.runtime.executor",
    "StepResult": "poot.runtime.executor",
    "WeightCache": "poot.runtime.weights",
    "StateStore": "poot.runtime.executor",
    "BlockAllocator": "poot.runtime.kv",
    "DenseCache": "poot.runtime.kv",
    "Session": "poot.runtime.session",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'poot.runtime' has no attribute {name!r}")


__all__ = list(_LAZY)
