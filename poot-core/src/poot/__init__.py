"""poot: one Graph IR, many GPU backends.

Public entry points are imported lazily so that `import poot` stays cheap.
"""
from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "trace": ("poot.tracer", "trace"),
    "spec": ("poot.tracer", "spec"),
    "evaluate": ("poot.oracle", "evaluate"),
    "compile": ("poot.compiler", "compile"),
    "load": ("poot.models.runner", "load"),
    "Model": ("poot.models.runner", "Model"),
    "DType": ("poot.dtypes", "DType"),
}


#: subpackages reachable as attributes of `poot` without importing them first
_SUBMODULES = {"ops", "ir", "errors", "dtypes", "oracle", "contract", "models", "plan", "runtime",
               "plugin", "capability", "formats", "codegen", "conformance"}


def __getattr__(name: str):
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"poot.{name}")
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'poot' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the lazy names too, so that an interactive session completes `poot.load`
    return sorted({*globals(), *_LAZY, *_SUBMODULES})
