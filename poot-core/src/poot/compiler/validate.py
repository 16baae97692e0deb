"""Translation validation: the oracle on a compiled graph equals it on the source graph.

`random_inputs` draws fresh inputs for every binder from a seeded Generator (never
zeros): floats from a normal, slot values inside their declared range, packed
sources from the format's own quantizer so that they decode to finite weights.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from poot.dtypes import DType
from poot.errors import PootError
from poot.ir.graph import Graph
from poot.ir.types import StorageClass


class ValidationError(PootError):
    """The compiled graph computes something other than its source graph."""


def random_inputs(graph: Graph, rng: np.random.Generator,
                  given: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """An input for every non-Computed binder of `graph`, by label (`given` wins)."""
    given = dict(given or {})
    packed = _packed_sources(graph, rng)
    out = {}
    for v in graph.inputs():
        meta = graph.meta(v)
        label = meta.identity.label
        if meta.storage.cls is StorageClass.COMPUTED:
            continue
        if label is None:
            raise ValidationError(f"binder {v!r} has no label to bind it by")
        if label in given:
            out[label] = given[label]
        elif v in packed:
            out[label] = packed[v]
        elif meta.storage.cls is StorageClass.SLOT:
            lo, hi = meta.storage.slot.valid_range()
            hi = hi if hi is not None else max(1, (lo or 0) + 8)
            out[label] = rng.integers(lo or 0, hi, meta.aval.shape).astype(np.int32)
        else:
            out[label] = _draw(meta.aval.shape, meta.aval.dtype, rng)
    return out


def _draw(shape, dtype: DType, rng) -> np.ndarray:
    if dtype.is_float:
        return rng.standard_normal(shape).astype(dtype.numpy)
    info = np.iinfo(dtype.numpy)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), shape).astype(dtype.numpy)


def _packed_sources(graph: Graph, rng) -> dict:
    """Sources of every PackedDequant-like eqn that reads binders, quantized from random
    weights by the format (formats without a quantizer get random words)."""
    out = {}
    for e in graph.eqns():
        weight = getattr(e.op, "weight", None)
        if weight is None:
            continue
        srcs = [x.id for x in e.inputs][-len(weight.sources()):]
        if any(s in out for s in srcs):
            continue
        fmt = weight.get_format()
        w = (rng.standard_normal(weight.shape) / np.sqrt(weight.shape[1])).astype(np.float32)
        arrays = list(fmt.quantize(w, **weight.attr_dict)) if hasattr(fmt, "quantize") else [
            _draw(s.type.shape, s.type.dtype, rng) for s in weight.sources()]
        for s, a, spec in zip(srcs, arrays, weight.sources(), strict=True):
            out[s] = np.asarray(a).reshape(spec.type.shape).view(spec.type.dtype.numpy) \
                if np.asarray(a).dtype != spec.type.dtype.numpy else np.asarray(a)
    return out


def compare(source: Graph, compiled: Graph, inputs, rtol: float = 1e-5) -> None:
    """Evaluate both graphs on `inputs` and raise ValidationError where an output differs."""
    from poot.oracle import evaluate

    want = evaluate(source, inputs)
    got = evaluate(compiled, inputs)
    for o, a, b in zip(source.outputs(), want, got, strict=True):
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        finite = np.isfinite(a64)
        scale = float(np.abs(a64[finite]).max()) if finite.any() else 1.0
        same_special = np.array_equal(np.where(finite, 0, a64), np.where(finite, 0, b64),
                                      equal_nan=True)
        err = float(np.abs(a64 - b64)[finite].max()) if finite.any() else 0.0
        if a.shape != b.shape or not same_special or err > rtol * max(scale, 1e-30) + 1e-30:
            raise ValidationError(f"{source.name}: output {o!r} differs after compile: max "
                                  f"error {err:.3g} against a scale of {scale:.3g}")


def validate(source: Graph, compiled: Graph, seed: int = 0, trials: int = 2,
             given: Mapping[str, np.ndarray] | None = None, rtol: float = 1e-5) -> None:
    """Compare the two graphs on `trials` fresh random input sets."""
    rng = np.random.default_rng(seed)
    for _ in range(trials):
        compare(source, compiled, random_inputs(source, rng, given), rtol)


def validated_pass(graph: Graph, name: str, target="reference", *, policy=None, seed: int = 0,
                   given: Mapping[str, np.ndarray] | None = None):
    """Run pass `name` alone and validate it; returns (graph, its PassRecord)."""
    from poot.compiler.pipeline import run_pass

    out, record = run_pass(graph, name, target, policy=policy)
    validate(graph, out, seed=seed, given=given)
    return out, record
