"""Where a SmolLM2 (or Gemma 3) step's time goes on the cpu backend, by kernel kind.

The plan's step function is printed again with a barrier and a clock read around every
call (the barriers cost a little, and they take away the overlap of independent calls
that the real step has, so the sum is somewhat above a plain `run()`); the session then
runs its prefill of a 256-token prompt (or decode steps) through it, and the table sums
each call's wall time by kind: packed contractions by shape, attention, and the shared
kernels by op.

    python poot-backend-cpu/bench/step_profile.py [--step prefill|decode] [--repeat 3]
        [--model smollm2|gemma3] [--precision exact|fast] [--kv-dtype f32|f16|q8_0]
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from smollm2_cpu import (  # noqa: E402
    DECODE_TOKENS,
    MODELS,
    PROMPT_TOKENS,
    gguf_path,
    prompt_ids,
)

CALL = re.compile(r"^    (\w+)\((.*)\);  /\* step (\d+) \*/$")

CLOCK = """\
#include <time.h>
static double poot_now(void) {
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
"""


def profiled_source(source: str) -> tuple[str, list[tuple[str, int]]]:
    """`source` with `poot_prof(R, T)`: the step with a barrier and a clock read around
    each call, T[i] += call i's seconds. Returns it and (function, step index) per call."""
    head, _, body = source.partition("void poot_step(char *const *R) {")
    calls, out = [], []
    for line in body.splitlines():
        m = CALL.match(line)
        if m is None:
            out.append(line)
            continue
        i = len(calls)
        calls.append((m.group(1), int(m.group(3))))
        out += ["    poot_barrier(&poot_bar);",
                "    #pragma omp master", "    t0 = poot_now();",
                line,
                "    poot_barrier(&poot_bar);",
                "    #pragma omp master", f"    T[{i}] += poot_now() - t0;"]
    text = "\n".join(out).replace("  poot_bar_t poot_bar = {0};",
                                  "  poot_bar_t poot_bar = {0};\n  double t0 = 0;", 1)
    text = text.replace("  #pragma omp parallel\n", "  #pragma omp parallel firstprivate(t0)\n", 1)
    return head + CLOCK + "void poot_prof(char *const *R, double* T) {" + text, calls


def kind(plan, fn: str, step: int) -> str:
    st = next(s for s in plan.steps if s.index == step)
    op = st.eqn.op
    if fn.endswith("_gemv"):
        ins = st.inputs
        w = op.head.weight if hasattr(op, "head") else op.weight
        rows = 1
        for n in ins[0].type.shape[:-1]:
            rows *= n
        epi = "+epilogue" if hasattr(op, "head") else ""
        return f"packed {w.format.split(':')[-1]} {rows}x{w.shape[0]}x{w.shape[1]}{epi}"
    if fn.endswith("_rows") and type(op).__name__.endswith("Attention"):
        return "attention"
    return type(op).__name__


class Profiler:
    """Runs an executor's step through the profiled function and sums the times."""

    def __init__(self, ex):
        from poot_cpu import compiler

        exe = ex.executable
        source, self.calls = profiled_source(exe.step.source)
        lib = compiler.load(source)
        self.fn = lib.poot_prof
        self.fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self.times = (ctypes.c_double * max(1, len(self.calls)))()
        self.ptrs, self.runs, self.wall = exe._ptrs, 0, 0.0
        exe._fn = self._run

    def _run(self, _ptrs) -> None:
        t0 = time.perf_counter()
        self.fn(self.ptrs, self.times)
        self.wall += time.perf_counter() - t0
        self.runs += 1

    def table(self, plan) -> list[tuple[str, float, int]]:
        total = collections.defaultdict(float)
        count = collections.Counter()
        for (fn, step), t in zip(self.calls, self.times, strict=True):
            k = kind(plan, fn, step)
            total[k] += t
            count[k] += 1
        return sorted(((k, total[k], count[k]) for k in total), key=lambda x: -x[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--step", choices=("prefill", "decode"), default="prefill")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    ap.add_argument("--precision", choices=("exact", "fast"), default="exact")
    ap.add_argument("--kv-dtype", choices=("f32", "f16", "q8_0"), default=None)
    args = ap.parse_args()
    import poot

    model = poot.load(gguf_path(args.model), backend="cpu",
                      max_seq=PROMPT_TOKENS + DECODE_TOKENS + 8, precision=args.precision,
                      kv_dtype=args.kv_dtype)
    ids = prompt_ids(model.tokenize)
    list(model.generate(ids[:8], max_tokens=2))
    session = next(iter(model._sessions.values()))
    key = next(k for k in session.executors if (k[0] > 1) == (args.step == "prefill"))
    ex = session.executors[key]
    prof = Profiler(ex)
    t0 = time.perf_counter()
    for _ in range(args.repeat):
        if args.step == "prefill":
            list(model.generate(ids, max_tokens=1))
        else:
            list(model.generate(ids[:8], max_tokens=DECODE_TOKENS))
    wall = time.perf_counter() - t0
    rows = prof.table(ex.plan)
    summed = sum(t for _, t, _ in rows)
    print(f"# {args.step}: {prof.runs} runs of the {key} plan in {args.repeat} generations "
          f"({wall / args.repeat * 1e3:.0f} ms each, {prof.wall / prof.runs * 1e3:.1f} ms per "
          f"profiled run, calls sum {summed / prof.runs * 1e3:.1f} ms), "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}, "
          f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"{'kind':<42} {'calls/run':>9} {'ms/generation':>14} {'share':>6}")
    for k, t, n in rows:
        print(f"{k:<42} {n:>9} {t / args.repeat * 1e3:>14.2f} {t / summed:>6.1%}")


if __name__ == "__main__":
    main()
