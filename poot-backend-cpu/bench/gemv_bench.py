"""One packed contraction kernel alone: its wall time per call and its CPU time per call,
at the thread count of $OMP_NUM_THREADS, for the decode shapes of SmolLM2 and Gemma 3
(or one given shape), so a kernel change is measured without the rest of a step.

    python poot-backend-cpu/bench/gemv_bench.py [--coding i16|q8] [--calls 50]
        [--shape FORMAT:M:N:K ...]     # e.g. Q8_0:1:262144:640
"""
from __future__ import annotations

import argparse
import ctypes
import time

import numpy as np
from poot.formats import get_format
from poot_cpu import compiler
from poot_cpu.gemv import I16, Q8, kernel_source
from poot_cpu.printer import HostCPrinter

SHAPES = ("Q8_0:1:262144:640", "Q5_0:1:4096:640", "Q5_0:1:1536:640", "Q4_K:1:640:1024",
          "Q6_K:1:640:2048", "Q4_1:1:1536:576", "Q4_1:1:3072:576", "Q8_0:1:49152:576")


def weights(fmt: str, n: int, k: int) -> np.ndarray:
    """Random weights of `fmt` (quantized a slab at a time: repeated rows past the first
    slab keep big heads cheap to make, and the kernel reads every byte anyway)."""
    slab = min(n, 4096)
    rng = np.random.default_rng(0)
    one = get_format(f"gguf:{fmt}").quantize(rng.standard_normal((slab, k)).astype(np.float32))[0]
    one = one.reshape(slab, -1)
    return np.ascontiguousarray(np.tile(one, (-(-n // slab), 1))[:n]).reshape(-1)


def measure(fmt: str, m: int, n: int, k: int, coding, calls: int) -> tuple[float, float]:
    src = HostCPrinter().prelude(simd=True) + kernel_source("g", f"gguf:{fmt}", coding, m, n, k) + (
        "void run(const float* x, const unsigned char* w, float* y, unsigned char* s, int c) {\n"
        "  for (int i = 0; i < c; ++i) {\n  #pragma omp parallel\n  g(x, w, y, s);\n  }\n}\n")
    fn = compiler.load(src).run
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int]
    w = weights(fmt, n, k)
    x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    y = np.zeros((m, n), np.float32)
    s = np.zeros(coding.scratch_bytes(m, k), np.uint8)
    args = (x.ctypes.data, w.ctypes.data, y.ctypes.data, s.ctypes.data)
    fn(*args, 3)
    t0, c0 = time.perf_counter(), time.process_time()
    fn(*args, calls)
    return (time.perf_counter() - t0) / calls, (time.process_time() - c0) / calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--coding", choices=("i16", "q8"), default="i16")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--shape", nargs="*", default=SHAPES)
    args = ap.parse_args()
    coding = I16 if args.coding == "i16" else Q8
    for shape in args.shape:
        fmt, m, n, k = shape.split(":")
        m, n, k = int(m), int(n), int(k)
        wall, cpu = measure(fmt, m, n, k, coding, args.calls)
        print(f"{args.coding} {fmt:<5} {m}x{n}x{k}: {wall * 1e6:9.1f} us wall, "
              f"{cpu * 1e6:9.1f} us cpu, {m * n * k / wall / 1e9:6.1f} GMAC/s", flush=True)


if __name__ == "__main__":
    main()
