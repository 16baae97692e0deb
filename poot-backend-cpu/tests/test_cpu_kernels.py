"""The compile cache and the step function's barriers (the packed contraction kernels:
test_cpu_gemv.py)."""
from __future__ import annotations

import ctypes

import pytest
from poot_cpu import compiler
from poot_cpu.step import Hazards


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
