"""The CPU source builders against the oracle at model shapes, the compile cache, and the
step function's barriers."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from poot.formats import get_format
from poot_cpu import compiler
from poot_cpu.gemv import (
    LAYOUTS,
    LOCAL_BYTES,
    PANEL_BYTES,
    PANEL_ROWS,
    gemv_source,
    layout_of,
    scratch_bytes,
)
from poot_cpu.printer import HostCPrinter
from poot_cpu.step import Hazards


def _gemv(fmt: str, m: int, n: int, k: int, seed: int = 0, flags=compiler.FLAGS):
    layout = LAYOUTS[fmt]
    rng = np.random.default_rng(seed)
    w = get_format(fmt).quantize(rng.standard_normal((n, k)).astype(np.float32))[0]
    x = rng.standard_normal((m, k)).astype(np.float32)
    src = HostCPrinter().prelude(simd=True) + gemv_source("g", layout, m, n, k) + (
        "void run(const float* x, const unsigned char* w, float* y, unsigned char* s) {\n"
        "  #pragma omp parallel\n  g(x, w, y, s);\n}\n")
    fn = compiler.load(src, flags).run
    fn.argtypes = [ctypes.c_void_p] * 4
    y = np.zeros((m, n), np.float32)
    scratch = np.zeros(scratch_bytes(m, k, layout), np.uint8)
    fn(x.ctypes.data, w.ctypes.data, y.ctypes.data, scratch.ctypes.data)
    want = x.astype(np.float64) @ get_format(fmt).dequantize([w], (n, k)).astype(np.float64).T
    return y, want


@pytest.mark.parametrize("fmt", sorted(LAYOUTS))
@pytest.mark.parametrize("m", [5, 9])   # the decode tile (4 rows) and a rest; the panel kernel
@pytest.mark.parametrize("n", [67, 68])  # odd: one weight row at a time; even: two; a part panel
def test_packed_gemv_matches_the_oracle_at_model_shapes(cpu_backend, fmt, m, n):
    y, want = _gemv(fmt, m, n, 576)
    nmse = float(((y - want) ** 2).sum() / (want ** 2).sum())
    assert nmse < 3.7e-9          # the conformance threshold of contractions


# the panel kernel's vector widths and dot products, where the host has them: AVX-512 with
# VNNI, AVX2 with and without VNNI (the compiler may target less than the host has), and
# the plain C loops
ISA_FLAGS = {"native": (), "avx2+vnni": ("-mno-avx512f",),
             "avx2": ("-mno-avx512f", "-mno-avxvnni"), "scalar": ("-mno-avx2",)}


@pytest.mark.parametrize("fmt", sorted(LAYOUTS))
@pytest.mark.parametrize("isa", sorted(ISA_FLAGS))
def test_packed_gemv_panel_on_each_instruction_set(cpu_backend, fmt, isa):
    """The panel kernel matches the oracle at every width, and its SIMD widths give the same
    bits (the same integer sums and float operations per output; the plain C loops round
    the scale's product and sum apart where the vectors fuse them)."""
    y, want = _gemv(fmt, 13, 37, 576, flags=compiler.FLAGS + ISA_FLAGS[isa])
    assert float(((y - want) ** 2).sum() / (want ** 2).sum()) < 3.7e-9
    if isa not in ("native", "scalar"):
        assert np.array_equal(y, _gemv(fmt, 13, 37, 576)[0])


def test_packed_gemv_with_activations_quantized_once_for_all_threads(cpu_backend):
    """Activations over the per-thread stack budget are quantized once into the step's
    scratch, behind a barrier."""
    m, k = 9, 7680
    assert m * k * 2 > LOCAL_BYTES
    y, want = _gemv("gguf:Q4_1", m, 4, k)
    assert float(((y - want) ** 2).sum() / (want ** 2).sum()) < 3.7e-9


def test_packed_gemv_of_many_rows_whose_panel_would_not_fit_the_stack(cpu_backend):
    """Rows of K over PANEL_BYTES / (2 * PANEL_ROWS) take the row tiles instead of the
    panel kernel."""
    k = PANEL_BYTES // (2 * PANEL_ROWS) + 32
    y, want = _gemv("gguf:Q8_0", 8, 3, k)
    assert float(((y - want) ** 2).sum() / (want ** 2).sum()) < 3.7e-9


def test_block_layouts_agree_with_their_formats():
    assert all(layout_of(name) == layout for name, layout in LAYOUTS.items())


def test_libraries_are_cached_by_source_flags_and_compiler(cpu_backend, tmp_path,
                                                           monkeypatch):
    monkeypatch.setenv("POOT_CACHE", str(tmp_path))
    src = "int poot_answer(void) { return 42; }\n"
    first = compiler.build(src)
    assert first.parent == tmp_path / "cpu" and compiler.build(src) == first
    assert compiler.build(src, compiler.FLAGS + ("-DX",)) != first
    assert compiler.build(src + "\n") != first


def test_compile_errors_are_typed(cpu_backend, tmp_path, monkeypatch):
    monkeypatch.setenv("POOT_CACHE", str(tmp_path))
    with pytest.raises(compiler.CompileError, match="failed"):
        compiler.build("int broken(void) { return }\n")


def test_barriers_only_between_dependent_calls():
    h = Hazards()
    h.add([(0, 0, 64)], [(0, 64, 128)])
    assert not h.conflicts([(0, 0, 64)], [(0, 128, 192)])      # same input, new output
    assert h.conflicts([(0, 100, 110)], [(0, 256, 300)])       # reads what was written
    assert h.conflicts([(1, 0, 8)], [(0, 32, 40)])             # overwrites an input


def test_step_barrier_lets_no_thread_pass_early(cpu_backend):
    """Each thread publishes its round number, waits, and must see the other's; with a
    thread that sleeps now and then, waits end by spinning and by the futex."""
    from poot_cpu.step import BARRIER_SOURCE

    src = BARRIER_SOURCE + (
        "#include <time.h>\n"
        "int run(int rounds) {\n"
        "  poot_bar_t poot_bar = {0};\n"
        "  volatile int seen[2] = {-1, -1};\n"
        "  int bad = 0;\n"
        "  #pragma omp parallel num_threads(2) reduction(+:bad)\n"
        "  {\n"
        "    const int t = omp_get_thread_num(), n = omp_get_num_threads();\n"
        "    for (int i = 0; i < rounds && n == 2; ++i) {\n"
        "      if (t == i % 2 && i % 97 == 0) {\n"
        "        struct timespec d = {0, 200000}; nanosleep(&d, NULL); }\n"
        "      seen[t] = i;\n"
        "      poot_barrier(&poot_bar);\n"
        "      bad += seen[1 - t] != i;\n"
        "      poot_barrier(&poot_bar);\n"
        "    }\n"
        "  }\n"
        "  return bad;\n"
        "}\n")
    fn = compiler.load(src).run
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    assert fn(3000) == 0
