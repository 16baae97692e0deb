"""One plan as one translation unit: every distinct kernel function once, then
`void poot_step(char *const *R)` that runs the whole step inside one OpenMP parallel
region: each kernel's workgroups are shared out among the threads (`omp for nowait`),
a barrier goes only between calls that depend on each other (`Hazards`; the step's own
spin-then-futex barrier, BARRIER_SOURCE), copies run on one thread.

`R` holds the base address of every buffer the plan binds (regions, then the step's
scratch), in `StepSource.buffers` order; every offset is a constant of the source, so
the same plan always prints the same source and reuses its cached library.
"""
from __future__ import annotations

from dataclasses import dataclass

from poot.codegen.program import OUT
from poot.errors import UnsupportedOp
from poot.ir.graph import Lit
from poot.kernel_backend import CompiledProgram

from poot_cpu.printer import HostCPrinter

SCRATCH_ALIGN = 256
BARRIER = "    poot_barrier(&poot_bar);"

# the barrier between dependent calls: a thread that arrives early spins for a while
# before it sleeps on a futex, and the spin adapts per thread: a wait that ends within it
# doubles it (up to SPIN_MAX_NS), a wait that outlasts it quarters it (down to
# SPIN_MIN_NS). On a quiet machine the other thread arrives within tens of microseconds
# and no one sleeps (libgomp's passive barrier puts a thread to sleep at each of a decode
# step's hundreds of barriers, and a futex wake costs more than the wait); on a loaded
# one, where the other thread is often descheduled, the spin shrinks to almost nothing,
# as passive waiting. The spin is timed by the clock, not counted in pauses, whose length
# differs between cores: a budget of pauses that fit one machine's waits slept through
# most of another's (docs/performance.md, 2026-12-04). Where there is no futex, it is
# OpenMP's barrier.
BARRIER_SOURCE = """\
#include <omp.h>
#define NOINLINE __attribute__((noinline))
#if defined(__linux__)
#include <limits.h>
#include <stdatomic.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <time.h>
enum { POOT_SPIN_MIN_NS = 1000, POOT_SPIN_MAX_NS = 100000 };
typedef struct { _Atomic int count, gen, sleepers; } poot_bar_t;
static long long poot_spin[64];
static inline long long poot_clock_ns(void) {
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec; }
static inline void poot_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}
NOINLINE
static void poot_barrier(poot_bar_t* b) {
  const int n = omp_get_num_threads();
  if (n == 1) return;
  const int gen = atomic_load_explicit(&b->gen, memory_order_acquire);
  if (atomic_fetch_add_explicit(&b->count, 1, memory_order_acq_rel) == n - 1) {
    atomic_store_explicit(&b->count, 0, memory_order_relaxed);
    atomic_store(&b->gen, gen + 1);
    if (atomic_load(&b->sleepers))
      syscall(SYS_futex, &b->gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    return;
  }
  long long* spin = &poot_spin[omp_get_thread_num() & 63];
  const long long budget = *spin ? *spin : POOT_SPIN_MAX_NS, t0 = poot_clock_ns();
  for (int i = 1;; ++i) {
    if (atomic_load_explicit(&b->gen, memory_order_acquire) != gen) {
      *spin = budget < POOT_SPIN_MAX_NS / 2 ? 2 * budget : POOT_SPIN_MAX_NS;
      return;
    }
    poot_pause();
    if (i % 16 == 0 && poot_clock_ns() - t0 >= budget) break;   /* the clock, now and then */
  }
  *spin = budget / 4 > POOT_SPIN_MIN_NS ? budget / 4 : POOT_SPIN_MIN_NS;
  atomic_fetch_add(&b->sleepers, 1);
  while (atomic_load(&b->gen) == gen)
    syscall(SYS_futex, &b->gen, FUTEX_WAIT_PRIVATE, gen, NULL, NULL, 0);
  atomic_fetch_sub(&b->sleepers, 1);
}
#else
typedef struct { int unused; } poot_bar_t;
#define poot_barrier(b) _Pragma("omp barrier")
#endif
"""


def called(source: str, name: str) -> str:
    """A kernel's source with its function `name` kept out of line: poot_step calls each
    kernel (and the barrier) where the C compiler would otherwise inline hundreds of calls
    into the one parallel region, and compiling that single function is what set the
    compiler's peak memory, above the Python process's own on a cold kernel cache. A call
    costs nothing beside a kernel's work, and the kernels' own helpers stay inline."""
    head = f"static void {name}("
    return source.replace(head, f"NOINLINE\n{head}", 1)


@dataclass
class StepSource:
    """The source and the buffer order of one plan's step function."""

    source: str
    regions: list[str]                 # R[i] for i < len(regions): plan regions by name
    scratch_bytes: int = 0             # R[len(regions)]: the step's scratch, when nonzero
    functions: int = 0
    calls: int = 0
    barriers: int = 0


class Hazards:
    """Byte ranges read and written since the last barrier. Kernels end without a barrier
    (`omp for nowait`); a barrier goes in front of a call only when it reads what an
    earlier unsynchronized call writes, or writes what one reads or writes."""

    def __init__(self):
        self.reads: list[tuple[int, int, int]] = []
        self.writes: list[tuple[int, int, int]] = []

    @staticmethod
    def _overlap(a, ranges) -> bool:
        return any(a[0] == b[0] and a[1] < b[2] and b[1] < a[2] for b in ranges)

    def conflicts(self, reads, writes) -> bool:
        return any(self._overlap(r, self.writes) for r in reads) or \
            any(self._overlap(w, self.writes) or self._overlap(w, self.reads) for w in writes)

    def add(self, reads, writes) -> None:
        self.reads += reads
        self.writes += writes

    def clear(self) -> None:
        self.reads, self.writes = [], []


def build_step(plan) -> StepSource:
    regions = list(plan.regions)
    index = {name: i for i, name in enumerate(regions)}
    scratch_slot = len(regions)
    body, defs, seen = [], [], set()
    hazards = Hazards()
    scratch_bytes = scratch_top = 0     # scratch is handed out afresh after each barrier
    printer = HostCPrinter()

    def span(place) -> tuple[int, int, int]:
        return (index[place.region], place.offset, place.offset + max(place.nbytes, 1))

    def ptr(place, ctype: str = "char") -> str:
        if place.strides is not None:
            raise UnsupportedOp(f"cpu kernels read contiguous operands; the plan gave a strided "
                                f"view {place}", backend="cpu")
        return f"(({ctype}*)(R[{index[place.region]}] + {place.offset}))"

    def barrier_for(reads, writes) -> None:
        nonlocal scratch_top
        if hazards.conflicts(reads, writes):
            body.append(BARRIER)
            hazards.clear()
            scratch_top = 0

    def copy(dst, src) -> None:
        barrier_for([span(src)], [span(dst)])
        body.append(f"    #pragma omp single\n    memcpy({ptr(dst)}, {ptr(src)}, {dst.nbytes});")
        hazards.clear()              # a single construct ends with a barrier

    calls = 0
    for step in plan.steps:
        compiled = step.lowering.program
        if not isinstance(compiled, CompiledProgram):
            raise UnsupportedOp(f"step {step.index} ({step.eqn.op.name}) was not lowered by "
                                "the cpu backend", op=step.eqn.op.name, backend="cpu")
        operands = {i: p for i, p in enumerate(step.inputs) if not isinstance(p, Lit)}
        operands[OUT] = step.out
        low = compiled.program
        if low.alias is not None and low.kernels and not step.inplace:
            src, dst = operands[low.alias], step.out
            if (src.region, src.offset) != (dst.region, dst.offset):
                copy(dst, src)
        sizes = {b.name: -(-b.nbytes // SCRATCH_ALIGN) * SCRATCH_ALIGN for b in low.scratch}
        operand_reads = [span(p) for i, p in operands.items() if i != OUT]
        out_write = [span(step.out)]
        barrier_for(operand_reads, out_write)
        scratch = {}
        for name, size in sizes.items():
            scratch[name] = scratch_top
            scratch_top += size
        scratch_bytes = max(scratch_bytes, scratch_top)
        scratch_spans = [(scratch_slot, o, o + sizes[n]) for n, o in scratch.items()]
        for j, fn in enumerate(compiled.kernels):
            if j:                     # kernels of one eqn run in order
                body.append(BARRIER)
                hazards.clear()
            if fn.name not in seen:
                seen.add(fn.name)
                defs.append(called(fn.source, fn.name))
            args = []
            for b in fn.buffers:
                t = printer.type_name(b.dtype)
                if b.operand is None:
                    args.append(f"(({t}*)(R[{scratch_slot}] + {scratch[b.name]}))")
                else:
                    args.append(ptr(operands[b.operand], t))
            body.append(f"    {fn.name}({', '.join(args)});  /* step {step.index} */")
            hazards.add(operand_reads + scratch_spans, out_write + scratch_spans)
            calls += 1
    for c in plan.copies:
        copy(c.dst, c.src)
    barriers = body.count(BARRIER)
    simd = any("POOT_AVX2" in d or "poot_h2f" in d for d in defs)
    source = "\n".join([printer.prelude(simd), BARRIER_SOURCE, *defs,
                        "void poot_step(char *const *R) {",
                        "  poot_bar_t poot_bar = {0};",
                        "  #pragma omp parallel",
                        "  {",
                        *body,
                        "  }",
                        "}", ""])
    return StepSource(source, regions, scratch_bytes, len(defs), calls, barriers)
