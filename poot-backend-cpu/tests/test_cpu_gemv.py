"""The packed contraction kernels (poot_cpu.gemv) for every declared block format, both
activation codings and every instruction-set path, against float64 evaluations of their
definitions: the exact coding (a PackedContraction) at the conformance threshold of
contractions, the q8 coding (Q8PackedContraction: GGUF's q8_0 activation rule, then the
contraction) within f32 rounding of the sum, its codes and scales bit for bit."""
from __future__ import annotations

import ctypes
import functools

import numpy as np
import pytest
from poot.formats import get_format
from poot_cpu import compiler
from poot_cpu.blocks import BLOCKS, Field, block_of
from poot_cpu.gemv import (
    I16,
    LOCAL_BYTES,
    PANEL_BYTES,
    PANEL_ROWS,
    Q8,
    amx_panel,
    kernel_source,
)
from poot_cpu.printer import HostCPrinter

FORMATS = sorted(BLOCKS)
CODINGS = {"i16": I16, "q8": Q8}
K = 512
# (rows, weight rows): the decode tile with two weight rows at a time, the decode tile and
# a rest with one, the prefill panel with a part panel
SHAPES = [(1, 36), (5, 37), (13, 37)]

# the paths of the dot products, each compiled by turning the host's wider features off
# (-march=native is the host's cpuid; the compiler may target less than the host has), with
# the CPU flags a host needs to run it
NO_AMX = ("-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16")
ISAS = {
    "amx": ((), {"avx512bw", "avx512vl", "avx512_vnni", "amx_tile", "amx_int8"}),
    "avx512-vnni": (NO_AMX, {"avx512bw", "avx512vl", "avx512_vnni"}),
    "avx512": (("-mno-avx512vnni", "-mno-avxvnni", *NO_AMX), {"avx512bw", "avx512vl"}),
    "avx-vnni": (("-mno-avx512f", *NO_AMX), {"avx_vnni", "avx2", "fma", "f16c"}),
    "avx2": (("-mno-avx512f", "-mno-avxvnni", *NO_AMX), {"avx2", "fma", "f16c"}),
    "scalar": (("-mno-avx2", *NO_AMX), set()),
}
# what each path defines: (POOT_VL, POOT_DOT8_BIAS, POOT_AMX), None without AVX2
PROBE = {"amx": (16, 128, 1), "avx512-vnni": (16, 128, 0), "avx512": (16, 0, 0),
         "avx-vnni": (8, 128, 0), "avx2": (8, 0, 0), "scalar": None}


def _flags(isa: str):
    extra, needs = ISAS[isa]
    missing = needs - compiler.cpu_flags()
    if missing:
        pytest.skip(f"this CPU has no {', '.join(sorted(missing))}: the {isa} path cannot run")
    return compiler.FLAGS + extra


#: the formats whose q8 prefill panel has an AMX path (the others compile to the VNNI one)
AMX_FORMATS = tuple(f for f in FORMATS if amx_panel(block_of(f), Q8))


def _runs(isa: str) -> bool:
    return ISAS[isa][1] <= compiler.cpu_flags()


def _widest(coding: str = "q8", fmt: str = AMX_FORMATS[0]) -> str | None:
    """The widest path this CPU runs for `fmt`, which every other SIMD path must match bit
    for bit."""
    if coding == "q8" and fmt in AMX_FORMATS and _runs("amx"):
        return "amx"
    return "avx512-vnni" if _runs("avx512-vnni") else None


def _native() -> str:
    return _widest() or "avx2"


def q8_round(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes int8, scales f32 per 32, f32(q) * d) of rows x by the q8_0 rule, each step an
    f32 operation (docs/ir.md 10.8)."""
    xb = x.reshape(*x.shape[:-1], -1, 32).astype(np.float32)
    d = (np.abs(xb).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
        y = (xb * inv).astype(np.float32)
    q = np.clip(np.rint(np.nan_to_num(y, nan=0.0, posinf=127, neginf=-127)), -127, 127)
    return q.astype(np.int8), d[..., 0], (q.astype(np.float32) * d).reshape(x.shape)


def _weights(fmt: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return get_format(fmt).quantize(rng.standard_normal((n, K)).astype(np.float32))[0]


def _activations(m: int, seed: int) -> np.ndarray:
    """Random rows, with a block of zeros, a block whose scale is 1 and whose values are
    halves (ties round to even), and a block too small for a scale (d rounds to 0)."""
    x = np.random.default_rng(seed + 1).standard_normal((m, K)).astype(np.float32)
    x[0, 32:64] = 0.0
    x[-1, 64:96] = np.arange(-15.5, 16.5, dtype=np.float32)
    x[-1, 64] = 127.0
    x[-1, 96:128] = np.float32(1e-44)
    return x


@functools.cache
def _library(isa: str, coding: str, shapes: tuple, formats: tuple = tuple(FORMATS)) -> ctypes.CDLL:
    """One library of kernels g_<format>_<m>_<n> for every format and shape, compiled for
    `isa`."""
    src = [HostCPrinter().prelude(simd=True)]
    for fmt in formats:
        for m, n in shapes:
            name = f"g_{fmt.split(':')[1].lower()}_{m}_{n}"
            src.append(kernel_source(name, fmt, CODINGS[coding], m, n, K))
            src.append(f"void run_{name}(const float* x, const unsigned char* w, float* y, "
                       f"unsigned char* s) {{\n  #pragma omp parallel\n  {name}(x, w, y, s);\n}}\n")
    src.append("int probe(void) {\n#ifdef POOT_AVX2\n  return POOT_VL * 1000 + POOT_DOT8_BIAS"
               "\n#ifdef POOT_AMX\n    + 100000 * poot_amx_ready()\n#endif\n  ;\n"
               "#else\n  return -1;\n#endif\n}\n")
    return compiler.load("".join(src), _flags(isa))


def _call(lib, fmt: str, coding, x: np.ndarray, w: np.ndarray, n: int):
    m = x.shape[0]
    fn = getattr(lib, f"run_g_{fmt.split(':')[1].lower()}_{m}_{n}")
    fn.argtypes = [ctypes.c_void_p] * 4
    y = np.zeros((m, n), np.float32)
    scratch = np.zeros(coding.scratch_bytes(m, K), np.uint8)
    fn(x.ctypes.data, w.ctypes.data, y.ctypes.data, scratch.ctypes.data)
    return y, scratch


def _check(fmt: str, coding, x, w, y):
    """y against the definition: exact, NMSE under the contraction threshold; q8, every
    output within 8 f32 roundings of the sum of |products|."""
    n = w.shape[0]
    wd = np.asarray(get_format(fmt).dequantize([w], (n, K)), np.float64)
    a = q8_round(x)[2] if coding is Q8 else x
    want = a.astype(np.float64) @ wd.T
    if coding is Q8:
        bound = np.abs(a.astype(np.float64)) @ np.abs(wd).T
        worst = float((np.abs(y - want) / bound).max())
        assert worst <= 8 * np.finfo(np.float32).eps, worst
    else:
        nmse = float(((y - want) ** 2).sum() / (want ** 2).sum())
        assert nmse < 3.7e-9, nmse


def _check_codes(x, scratch):
    """The q8 scratch of a call that quantized into it: codes and scales bit for bit, and
    the integer code sums of each 16."""
    m = x.shape[0]
    q, d, _ = q8_round(x)
    blocks = m * K // 32
    got_q = scratch[:m * K].view(np.int8).reshape(q.shape)
    got_d = scratch[m * K:m * K + 4 * blocks].view(np.float32).reshape(d.shape)
    qh = scratch[m * K + 8 * blocks:m * K + 16 * blocks].view(np.int32).reshape(-1, 2)
    assert np.array_equal(got_q, q)
    assert np.array_equal(got_d.view(np.uint32), d.view(np.uint32))
    halves = q.reshape(-1, 2, 16).astype(np.int32).sum(-1)
    assert np.array_equal(qh, halves)


def test_block_declarations_agree_with_their_formats():
    assert all(block_of(name) is BLOCKS[name] for name in BLOCKS)


# a field, a scale kind or a scale's storage off by one place each
WRONG = [("gguf:Q5_0", dict(centre=15)),
         ("gguf:Q2_K", dict(sub_at=1)),
         ("gguf:Q3_K", dict(sub_at=84)),
         ("gguf:Q3_K", dict(high=Field("bytes", (0,) * 8, tuple(range(1, 9)), bits=1))),
         ("gguf:MXFP4", dict(d_kind="f16"))]


@pytest.mark.parametrize("fmt,change", WRONG, ids=[f"{f}-{next(iter(c))}" for f, c in WRONG])
def test_a_wrong_declaration_is_not_used(monkeypatch, fmt, change):
    from dataclasses import replace

    from poot_cpu import blocks

    wrong = replace(BLOCKS[fmt], **change)
    monkeypatch.setitem(blocks.BLOCKS, fmt, wrong)
    blocks.block_of.cache_clear()
    try:
        assert blocks.block_of(fmt) is None
    finally:
        monkeypatch.undo()
        blocks.block_of.cache_clear()


@pytest.mark.parametrize("coding", sorted(CODINGS))
@pytest.mark.parametrize("fmt", FORMATS)
def test_kernels_match_their_definition_at_each_shape(cpu_backend, fmt, coding):
    lib = _library(_native(), coding, tuple(SHAPES))
    for seed, (m, n) in enumerate(SHAPES):
        x, w = _activations(m, seed), _weights(fmt, n, seed)
        y, scratch = _call(lib, fmt, CODINGS[coding], x, w, n)
        _check(fmt, CODINGS[coding], x, w, y)
        if coding == "q8" and m >= 8:      # the panel's rows quantized into the scratch
            _check_codes(x, scratch)


# AMX runs q8 rows only: its i16 build would be the avx512-vnni one
PATHS = [(isa, c) for isa in sorted(ISAS) for c in sorted(CODINGS) if (isa, c) != ("amx", "i16")]


@pytest.mark.parametrize("isa,coding", PATHS, ids=[f"{i}-{c}" for i, c in PATHS])
def test_every_instruction_set_path(cpu_backend, isa, coding):
    """Each path compiles to what it names (its vector width and byte dot product; AMX
    granted by the kernel where compiled), meets the definition for every format (AMX: those
    it runs), and the SIMD paths give the bits of the widest one: the same integer sums and
    float operations per output (the plain C loops round the scale's product and sum apart
    where the vectors fuse them)."""
    shapes = ((1, 36), (21, 37))   # the panel: two blocks of 16 rows for AMX, a part one
    formats = AMX_FORMATS if isa == "amx" else tuple(FORMATS)
    lib = _library(isa, coding, shapes, formats)
    lib.probe.restype = ctypes.c_int
    want = PROBE[isa]
    assert lib.probe() == (-1 if want is None else
                           want[0] * 1000 + want[1] + 100000 * want[2])
    for fmt in formats:
        wide = _widest(coding, fmt)
        widest = None if wide is None else _library(
            wide, coding, shapes, AMX_FORMATS if wide == "amx" else tuple(FORMATS))
        for seed, (m, n) in enumerate(shapes):
            x, w = _activations(m, seed), _weights(fmt, n, seed)
            y, scratch = _call(lib, fmt, CODINGS[coding], x, w, n)
            _check(fmt, CODINGS[coding], x, w, y)
            if coding == "q8" and m >= 8:
                _check_codes(x, scratch)
            if widest is not None and isa != "scalar":
                assert np.array_equal(y, _call(widest, fmt, CODINGS[coding], x, w, n)[0])


def test_q8_rows_with_a_non_finite_value_are_nan(cpu_backend):
    """A NaN or an infinity makes its block's scale NaN (the definition's d, or its product
    0 * inf): that row's outputs are NaN, the other rows' unchanged."""
    lib = _library(_native(), "q8", tuple(SHAPES))
    for m, n in SHAPES:
        x, w = _activations(m, 0), _weights("gguf:Q4_K", n, 0)
        clean = _call(lib, "gguf:Q4_K", Q8, x, w, n)[0]
        x[m - 1, 5] = np.nan if m > 1 else np.inf
        y = _call(lib, "gguf:Q4_K", Q8, x, w, n)[0]
        assert np.isnan(y[m - 1]).all() and np.array_equal(y[:m - 1], clean[:m - 1])


@pytest.mark.parametrize("coding", [I16, Q8], ids=["i16", "q8"])
def test_activations_quantized_once_for_all_threads(cpu_backend, coding):
    """Activations over the per-thread stack budget are quantized once into the step's
    scratch, behind a barrier."""
    m, k = 5, 32 * 1024
    assert m * k * coding.width > LOCAL_BYTES
    _single(coding, "gguf:Q4_0", m, 4, k)


@pytest.mark.parametrize("coding", [I16, Q8], ids=["i16", "q8"])
def test_many_rows_whose_panel_would_not_fit_the_stack(cpu_backend, coding):
    """Rows of K over PANEL_BYTES / (PANEL_ROWS x code bytes) take the row tiles instead
    of the panel kernel."""
    k = (PANEL_BYTES // (coding.width * PANEL_ROWS) // 256 + 1) * 256
    _single(coding, "gguf:Q6_K", 8, 3, k)


def _single(coding, fmt: str, m: int, n: int, k: int):
    rng = np.random.default_rng(3)
    w = get_format(fmt).quantize(rng.standard_normal((n, k)).astype(np.float32))[0]
    x = rng.standard_normal((m, k)).astype(np.float32)
    src = HostCPrinter().prelude(simd=True) + kernel_source("g", fmt, coding, m, n, k) + (
        "void run(const float* x, const unsigned char* w, float* y, unsigned char* s) {\n"
        "  #pragma omp parallel\n  g(x, w, y, s);\n}\n")
    fn = compiler.load(src).run
    fn.argtypes = [ctypes.c_void_p] * 4
    y = np.zeros((m, n), np.float32)
    scratch = np.zeros(coding.scratch_bytes(m, k), np.uint8)
    fn(x.ctypes.data, w.ctypes.data, y.ctypes.data, scratch.ctypes.data)
    wd = np.asarray(get_format(fmt).dequantize([w], (n, k)), np.float64)
    a = q8_round(x)[2] if coding is Q8 else x
    want = a.astype(np.float64) @ wd.T
    assert float(((y - want) ** 2).sum() / (want ** 2).sum()) < 3.7e-9
