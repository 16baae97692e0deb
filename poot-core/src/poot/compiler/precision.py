"""Precision levels and KV cache dtypes: their names, and what a target must declare to run
each (docs/ir.md section 15). `check` refuses, in one line, a name nobody knows or one the
target cannot run, naming what it supports, before anything is traced or planned."""
from __future__ import annotations

from poot.capability import CapabilityTable
from poot.compiler.policy import PRECISIONS, PrecisionError
from poot.dtypes import DType
from poot.ir import ops as O
from poot.ir.types import TensorType
from poot.ops.kv import KV_DTYPES

F32, F16, I8, I32 = DType.F32, DType.F16, DType.I8, DType.I32


def default_kv_dtype(precision: str) -> str:
    """The KV dtype a level uses unless one is given: f16 for fast, else f32."""
    return "f16" if precision == "fast" else "f32"


def _t(dtype: DType, *shape: int) -> TensorType:
    return TensorType(shape, dtype)


def _needs_quantize() -> list[tuple]:
    return [(O.QuantizeI8(), [_t(F32, 1, 32), _t(F32, 1, 1)], _t(I8, 1, 32)),
            (O.Cast(F32), [_t(I8, 1, 32)], _t(F32, 1, 32))]


def _needs_stored(dtype: DType) -> list[tuple]:
    """A cache of `dtype` is written in place (dense and paged), gathered (paged) and
    concatenated (a sliding layer's ring)."""
    base, rows, pos = _t(dtype, 4, 8, 32), _t(dtype, 2, 8, 32), _t(I32, 1)
    return [(O.DynamicUpdateSlice(1), [_t(dtype, 2, 4, 32), _t(dtype, 2, 1, 32), pos],
             _t(dtype, 2, 4, 32)),
            (O.ScatterUpdate(), [base, rows, _t(I32, 2)], base),
            (O.Gather(0), [base, _t(I32, 3)], _t(dtype, 3, 8, 32)),
            (O.Concat(0), [base, rows], _t(dtype, 6, 8, 32))]


def _requirements(what: str) -> list[tuple]:
    if what == "exact" or what == "f32":
        return []
    if what == "fast":
        return _needs_quantize()
    if what == "f16":
        return [(O.Cast(F16), [_t(F32, 32)], _t(F16, 32)),
                (O.Cast(F32), [_t(F16, 32)], _t(F32, 32))] + _needs_stored(F16)
    return _needs_quantize() + _needs_stored(I8) + _needs_stored(F32)   # q8_0


def refusal(table: CapabilityTable, what: str) -> str | None:
    """Why the target cannot run a precision level or KV dtype (None: it can)."""
    for op, ins, out in _requirements(what):
        err = table.refusal(op, ins, out)
        if err is not None:
            return str(err).rsplit(" [op=", 1)[0]
    return None


def supported(table: CapabilityTable, names=PRECISIONS) -> list[str]:
    """The levels (or, given KV_DTYPES, the KV dtypes) the target can run."""
    return [n for n in names if refusal(table, n) is None]


def check(table: CapabilityTable, precision: str, kv_dtype: str | None = None) -> str:
    """Refuse an unknown or unrunnable level or KV dtype with one line naming what the
    target supports; returns the KV dtype to use (the level's default when None)."""
    kv_dtype = default_kv_dtype(precision) if kv_dtype is None else kv_dtype
    for name, known, what in ((precision, PRECISIONS, "precision"),
                              (kv_dtype, KV_DTYPES, "KV dtype")):
        if name not in known:
            raise PrecisionError(f"unknown {what} {name!r}; the {what}s are "
                                 f"{', '.join(known)}")
        why = refusal(table, name)
        if why is not None:
            raise PrecisionError(
                f"{table.backend} on {table.device} cannot run {what} {name!r} ({why}); it "
                f"supports {what}s {', '.join(supported(table, known))}")
    return kv_dtype


__all__ = ["KV_DTYPES", "PRECISIONS", "PrecisionError", "check", "default_kv_dtype",
           "refusal", "supported"]
