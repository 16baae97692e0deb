"""Random case inputs: drawn fresh from a seeded Generator; zeros only where planted.

Each case input names a *domain* that keeps the oracle's result meaningful:
"any" (signed values), "positive" (Log, Sqrt), "away" (divisors, |x| >= 0.5),
"small" (Exp; |x| < 100 for integers), "words" (random 32-bit patterns for bit ops), "shift" (shift
amounts, some >= 32 to check the spec's rule), "int" (small exact integers held
in a float dtype), ("index", n) (indices in [0, n)), ("slots", n) (ScatterUpdate
rows: in range, one -1 and one repeated slot), and "special" (like "any", with
+Inf and -Inf planted where the dtype has them, and in larger inputs the values whose
results IEEE defines exactly: +0, -0, the largest finite values, and for F16 the
subnormals and the smallest normal). F32 and BF16 subnormals are left out: GPU APIs
allow flushing them (an F32 subnormal is flushed on many devices, and a BF16 one is an
F32 one), so the IR does not define those results.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from poot.dtypes import DType
from poot.ir.types import TensorType

#: float dtypes that can hold +-Inf
HAS_INF = (DType.F32, DType.F16, DType.BF16, DType.F8E5M2)


@dataclass(frozen=True)
class Arg:
    """One case input: its type and the domain its values are drawn from."""

    type: TensorType
    domain: object = "any"


def draw_all(rng: np.random.Generator, args, fixed=None) -> list[np.ndarray]:
    """Fresh values for every input of a case; `fixed` (index -> array) overrides.
    The sources of one packed weight come from one quantization of random weights."""
    fixed = fixed or {}
    packed: dict = {}
    out = []
    for i, arg in enumerate(args):
        if i in fixed:
            out.append(fixed[i])
        elif isinstance(arg.domain, tuple) and arg.domain[0] == "packed":
            _, weight, role = arg.domain
            if weight not in packed:
                w = rng.standard_normal(weight.shape).astype(np.float32)
                packed[weight] = weight.get_format().quantize(w, **weight.attr_dict)
            out.append(np.ascontiguousarray(packed[weight][role]))
        else:
            out.append(draw(rng, arg))
    return out


def draw(rng: np.random.Generator, arg: Arg) -> np.ndarray:
    """Fresh values for one input, in the input's dtype and domain (zero only where a
    "special" domain plants it)."""
    t, dom = arg.type, arg.domain
    if isinstance(dom, tuple):
        return _indices(rng, t, *dom)
    if dom in ("words", "shift"):
        return _words(rng, t, dom)
    if t.dtype.is_int:
        return _ints(rng, t, 100 if dom == "small" else 2**31)
    return _floats(rng, t, dom)


def _indices(rng, t: TensorType, what: str, n: int) -> np.ndarray:
    idx = rng.integers(0, n, size=t.shape, dtype=np.int64)
    if what == "slots" and idx.size >= 3:
        flat = rng.permutation(n)[: idx.size] if idx.size <= n else idx.reshape(-1)
        flat = np.array(flat, np.int64)
        flat[1] = -1                 # writes nothing
        flat[-1] = flat[0]           # two rows name one slot: the later row wins
        idx = flat.reshape(t.shape)
    return idx.astype(t.dtype.numpy)


def _words(rng, t: TensorType, dom: str) -> np.ndarray:
    if dom == "shift":
        vals = rng.integers(1, 40, size=t.shape)
    else:
        vals = rng.integers(1, 2**32, size=t.shape, dtype=np.uint64)
    return vals.astype(np.uint32).view(np.int32).astype(t.dtype.numpy) \
        if t.dtype is DType.I32 else vals.astype(np.uint32).astype(t.dtype.numpy)


def _ints(rng, t: TensorType, span: int) -> np.ndarray:
    info = np.iinfo(t.dtype.numpy)
    lo, hi = max(int(info.min), -span), min(int(info.max), span - 1)
    vals = rng.integers(lo, hi, size=t.shape, endpoint=True, dtype=np.int64)
    return np.where(vals == 0, 1, vals).astype(t.dtype.numpy)


def _floats(rng, t: TensorType, dom: str) -> np.ndarray:
    if t.dtype is DType.F8E8M0:  # powers of two only: no zero, no sign
        return np.exp2(rng.integers(-6, 7, size=t.shape)).astype(t.dtype.numpy)
    if dom == "int":
        x = rng.integers(-4, 5, size=t.shape).astype(np.float32)
        x[x == 0] = 1
    elif dom == "small":
        x = rng.uniform(-3, 3, size=t.shape)
    else:
        x = rng.standard_normal(size=t.shape) * 2
        if dom == "positive":
            x = np.abs(x) + 0.25
        elif dom == "away":
            x = np.sign(x) * (np.abs(x) + 0.5)
    a = np.asarray(x, np.float32).astype(t.dtype.numpy)
    a[a.astype(np.float32) == 0] = 1
    if dom == "special" and a.size >= 4:
        plant = special_values(t.dtype, many=a.size >= 16)
        if plant.size:
            flat = a.reshape(-1)
            flat[rng.choice(flat.size, plant.size, replace=False)] = plant
    return a


def special_values(dtype: DType, many: bool = True) -> np.ndarray:
    """The edge values planted in a "special" input of `dtype` (see the module doc)."""
    vals = [np.inf, -np.inf] if dtype in HAS_INF else []
    if many and dtype in (DType.F32, DType.F16, DType.BF16):
        big = float(ml_dtypes.finfo(dtype.numpy).max)
        vals += [0.0, -0.0, big, -big]
        if dtype is DType.F16:  # smallest and largest subnormal, smallest normal
            vals += [2.0**-24, -(2.0**-14 - 2.0**-24), 2.0**-14]
    return np.array(vals, np.float64).astype(dtype.numpy)


def nan_payload(dtype: DType) -> np.ndarray:
    """Two distinct quiet NaNs with payload bits, to check a bit-for-bit move."""
    bits = {DType.F32: (np.uint32, [0x7FC12345, 0xFFC00001]),
            DType.F16: (np.uint16, [0x7E15, 0xFE01]),
            DType.BF16: (np.uint16, [0x7FC5, 0xFFC1])}
    if dtype not in bits:
        return np.array([np.nan, np.nan], np.float32).astype(dtype.numpy)
    u, vals = bits[dtype]
    return np.array(vals, u).view(dtype.numpy)


__all__ = ["Arg", "draw", "nan_payload", "HAS_INF", "draw_all", "special_values"]
