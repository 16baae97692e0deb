"""The packed-weight seam between the IR and the format plugins (poot_quant and others).

The IR carries a `PackedWeight` descriptor (poot.ir.packed) on each PackedDequant (and on
the packed contractions compile forms from it). The descriptor names a format; the
format itself (its numpy decode, its scalar decode program, its quantizer) is
registered by a plugin through the `poot_weight_formats` hook. poot-core never
imports a format package, and the IR never imports this module: importing it installs
`get_format` as the registry the IR's descriptors resolve their format through.

A format is any object with this shape (duck-typed; see `WeightFormat`):

    name: str                                    e.g. "gguf:Q4_K", "gptq:int4"
    roles(shape, attrs) -> list[SourceSpec]      the packed sources, in order
    dequantize(sources, shape, **attrs) -> f32   numpy reference decode [N, K]
    decode_expr(load, n, k, shape, attrs) -> Expr
        the value of W[n, k] as a scalar program (poot.codegen.expr). `load(role,
        word_index)` returns the 32-bit word (U32) at that index of the source
        buffer `role`, whose bytes are viewed as little-endian u32 words (sources
        are padded to a multiple of 4 bytes). Decode programs load only words.
    quantize(w, **attrs) -> list[np.ndarray]     optional, where the format defines one

Optional, for kernels that walk K (the GEMV schedule): a format may decode a *run*
of consecutive elements of one row at once, so that the words and scales they share
are loaded and converted once, and a scale shared by many elements multiplies their
sum instead of each element:

    run_length(shape, attrs) -> int              R, elements per run (default 1)
    decode_run(load, n, k0, shape, attrs) -> list[RunPart]
        W[n, k0 : k0 + R] for k0 a multiple of R (k0 + R <= K), as consecutive parts;
        element i of a part is `scale * values[i] * 2^exponents[i] + offset` (F32; the
        optional exponents let a format leave a field where it lies in its word, see
        RunPart). Only the sum over K must match `decode_expr`; the default is one part
        of `decode_expr` per element.
    word_chunks(shape, attrs) -> {role: (elements, words)}
        the roles whose words lie in K order: every `elements` consecutive k of a row
        (from a multiple of `elements`) are `words` consecutive words, row n starting at
        word n * K / elements * words. A kernel may then copy the words a range of K
        needs with coalesced loads into shared memory and decode runs from that copy
        (`decode_run` of row 0 at the offset into the range, `load` reading the copy).
        Default: none.
    int_run(load, n, k0, shape, attrs) -> list[IntGroup] | None
        W[n, k0 : k0 + R] as groups of 32 elements whose values are integers u (bytes of
        U32 words) times a scale plus an offset, for kernels that multiply them with
        integer activations (`expr.Dot2`); None where the format's run is not so laid out.
        The same `load` contract as `decode_run`. Default: None.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from poot.dtypes import DType
from poot.errors import FormatError
from poot.ir.packed import PackedWeight, SourceSpec, use_formats


@dataclass
class RunPart:
    """Consecutive elements of a decoded run that share a scale and an offset: element i
    is `scale * values[i] * 2^exponents[i] + offset` (F32 expressions; None means 1 and
    0, and exponents None all 0). Kernels may compute `scale * sum_e(2^e * sum(a *
    values)) + offset * sum(a)`, one inner sum per exponent e: a 4-bit field masked where
    it lies in its word becomes a float in one op fewer than one shifted down first."""

    values: list
    scale: Any = None
    offset: Any = None
    exponents: list[int] | None = None


@dataclass
class IntGroup:
    """32 consecutive elements of a run as integers: element 4i + j is `scale * (u - bias)
    + offset` where u is byte j of `quads[i]` (8 U32 words; u < 2^bits), scale and offset
    F32 expressions (offset None: 0), bias an int."""

    quads: list
    bits: int
    bias: int
    scale: Any
    offset: Any = None


class WeightFormat(Protocol):
    """What a format provides (see the module docstring); `run_length` and `decode_run`
    are optional (`run_length` and `decode_run` below give their defaults)."""

    name: str

    def roles(self, shape: tuple[int, int], attrs: dict) -> Sequence[SourceSpec]: ...

    def dequantize(self, sources: Sequence[np.ndarray], shape: tuple[int, int],
                   **attrs) -> np.ndarray: ...

    def decode_expr(self, load: Callable, n, k, shape: tuple[int, int], attrs: dict): ...


def run_length(fmt: WeightFormat, shape: tuple[int, int], attrs: dict) -> int:
    """Elements of one row that `fmt` decodes at once (1 when it declares no runs)."""
    fn = getattr(fmt, "run_length", None)
    return int(fn(shape, attrs)) if fn is not None else 1


def decode_run(fmt: WeightFormat, load: Callable, n, k0, shape: tuple[int, int],
               attrs: dict) -> list[RunPart]:
    """W[n, k0 : k0 + run_length] as RunParts: the format's own `decode_run`, else one
    part of per-element `decode_expr` programs (a kernel builder merges the word loads
    they repeat, `KernelBuilder.let_shared`)."""
    fn = getattr(fmt, "decode_run", None)
    if fn is not None:
        return fn(load, n, k0, shape, attrs)
    from poot.codegen.expr import i32

    return [RunPart([fmt.decode_expr(load, n, k0 + i32(i), shape, attrs)
                     for i in range(run_length(fmt, shape, attrs))])]


def int_run(fmt: WeightFormat, load: Callable, n, k0, shape: tuple[int, int],
            attrs: dict) -> list[IntGroup] | None:
    """The format's `int_run`, or None when it declares none."""
    fn = getattr(fmt, "int_run", None)
    return fn(load, n, k0, shape, attrs) if fn is not None else None


def word_chunks(fmt: WeightFormat, shape: tuple[int, int], attrs: dict) -> dict:
    """{role: (elements, words)} of the roles `fmt` lays out in K order ({} if none)."""
    fn = getattr(fmt, "word_chunks", None)
    return dict(fn(shape, attrs)) if fn is not None else {}


def formats() -> dict[str, WeightFormat]:
    """Every format registered through the plugin seam, by name."""
    from poot.plugin import manager

    return manager().formats()


def get_format(name: str) -> WeightFormat:
    from poot.plugin import manager

    table = formats()
    try:
        return table[name]
    except KeyError:
        known = ", ".join(sorted(table)) or "none (is poot-quant installed?)"
        # a format plugin that failed to import (a missing dependency) is the likely cause
        broken = "; ".join(f"{k}: {v}" for k, v in sorted(manager().broken.items()))
        raise FormatError(f"unknown packed weight format {name!r}; registered: {known}"
                          + (f"; plugins that failed to load: {broken}" if broken else "")) \
            from None


def words_of(source: np.ndarray) -> np.ndarray:
    """A source's bytes as little-endian u32 words, zero-padded to a whole word."""
    raw = np.ascontiguousarray(source).reshape(-1).view(np.uint8)
    pad = (-raw.size) % 4
    if pad:
        raw = np.concatenate([raw, np.zeros(pad, np.uint8)])
    return raw.view("<u4")


# looked up by name at each call, so that a test that swaps this module's get_format for a
# format of its own swaps what the IR's descriptors resolve too
use_formats(lambda name: get_format(name))

__all__ = ["IntGroup", "PackedWeight", "RunPart", "SourceSpec", "WeightFormat", "decode_run",
           "formats", "get_format", "int_run", "run_length", "word_chunks", "words_of", "DType"]
