"""GPU benchmark of the CUDA backend: decode-shaped kernels and a whole decode step.

Prints, side by side, from one run:
- the device's copy bandwidth (the ceiling): cuMemcpyDtoD in a graph and on the stream, a
  16-byte-per-thread copy kernel, and PyTorch's copy_ when torch is importable; the best one
  is the ceiling the GEMV rows are a fraction of;
- BF16 GEMV (N=14336, K=4096 and N=4096, K=14336) and packed Q4_0 / Q4_K GEMV: achieved
  GB/s and the fraction of the copy ceiling (each timed over several weight copies in
  turn, so repeated launches stream from HBM, not from the 50 MB L2);
- BF16 GEMM 4096^3 (MatMul bf16 x bf16 -> bf16, the tensor-core schedule) TFLOP/s as a
  fraction of torch.matmul's bf16 4096^3 measured in the same run (CUDA events), its result
  checked against numpy; and DenseContraction's f32 x bf16 GEMM (FMA tiles) for contrast;
- a SmolLM2-shaped decode step (random bf16 weights) with CUDA graph replay and without
  (every kernel launched each step), and where its time goes: each launch timed alone,
  summed per op.
Timing: CUDA events around graph replays, after warm-up, median of several trials. Inputs
are random, never zeros. Lines starting with "SUMMARY " are collected by h200_session.sh.

    python bench_gpu.py            # on a machine with a CUDA GPU
    python bench_gpu.py --plan     # without one: lower, compile and plan only
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import traceback
from dataclasses import dataclass, replace

import numpy as np
from poot.codegen.lower import lower
from poot.dtypes import DType
from poot.ir.ops import Attention, DenseContraction, FusedRow, MatMul, PackedContraction
from poot.ir.types import TensorType as T
from poot_cuda.capability import arch_of, kernel_features

F32, BF16, U8 = DType.F32, DType.BF16, DType.U8


ARCH = arch_of(9, 0)                            # what the backend builds 9.0 kernels for
FEATURES = kernel_features(9, 0, ARCH)          # and what it gives their lowerings
GEMV_SHAPES = ((14336, 4096), (4096, 14336))   # (N, K): an 8B FFN's up and down shapes
TARGETS = {"gemv": 0.80, "q4": 0.60, "gemm": 0.50, "decode": 1000.0}   # issue 8's targets


@dataclass
class Bench:
    label: str
    op: object
    ins: list
    nbytes: int          # bytes that must move
    flops: int
    kind: str = ""       # "gemv", "q4", "gemm" or "" (what the row is compared with)
    reps: int = 20       # launches per timed graph


def ops_to_bench() -> list[Bench]:
    from poot.codegen.cases import _rmsnorm
    from poot.formats import PackedWeight
    from poot.ir import region

    out = []
    for n, k in GEMV_SHAPES:
        out.append(Bench(f"dense bf16 GEMV N={n} K={k}", DenseContraction(),
                         [T((1, k), F32), T((n, k), BF16)], n * k * 2 + 4 * (k + n),
                         2 * n * k, "gemv"))
    for fmt in ("Q4_0", "Q4_K"):
        for n, k in GEMV_SHAPES:
            pw = PackedWeight(f"gguf:{fmt}", (n, k))
            srcs = [s.type for s in pw.sources()]
            out.append(Bench(f"packed {fmt} GEMV N={n} K={k}", PackedContraction(pw),
                             [T((1, k), F32), *srcs], sum(s.nbytes for s in srcs) + 4 * (k + n),
                             2 * n * k, "q4"))
    m = n = k = 4096
    out.append(Bench(f"bf16 GEMM {m}x{n}x{k} (MatMul bf16, tensor cores)", MatMul(),
                     [T((m, k), BF16), T((k, n), BF16)], 2 * (m * k + n * k + m * n),
                     2 * m * n * k, "gemm", reps=10))
    out.append(Bench(f"dense GEMM {m}x{n}x{k} (f32 x bf16 DenseContraction, FMA)",
                     DenseContraction(), [T((m, k), F32), T((n, k), BF16)],
                     4 * m * k + 2 * n * k + 4 * m * n, 2 * m * n * k, "fma", reps=2))
    hq, hkv, s, d = 32, 8, 16384, 128
    out.append(Bench(f"attention decode bf16 {hq}/{hkv} heads S={s} D={d}", Attention(d ** -0.5),
                     [T((hq, 1, d), BF16), T((hkv, s, d), BF16), T((hkv, s, d), BF16),
                      T((1, s), BF16)], 2 * hkv * s * d * 2, 4 * hq * s * d))
    x, w = T((1, 4096), F32), T((4096,), F32)
    out.append(Bench("rmsnorm FusedRow 1x4096", FusedRow(region([x, w], _rmsnorm), -1), [x, w],
                     4096 * 12, 4 * 4096))
    return out


def copies_for(nbytes: int) -> int:
    """Weight copies to rotate through so that one timed round streams >= 512 MB (10x L2)."""
    return max(1, min(8, -(-(512 << 20) // max(nbytes, 1))))


def random_operand(t: T, rng) -> np.ndarray:
    if t.dtype.is_float:
        return (rng.standard_normal(t.shape, np.float32) * 0.5).astype(t.dtype.numpy)
    # packed sources: random bytes (timing only; correctness is the tests' job)
    return rng.integers(0, 256, t.nbytes, dtype=np.uint8).view(t.dtype.numpy).reshape(t.shape)


class Timer:
    def __init__(self, ctx):
        from poot_cuda.driver import check, cu

        self.ctx, self.check, self.cu = ctx, check, cu()
        self.start = check(self.cu.cuEventCreate(0), "cuEventCreate")
        self.stop = check(self.cu.cuEventCreate(0), "cuEventCreate")

    def graph_ms(self, enqueue, reps: int = 20, trials: int = 7) -> float:
        """Median milliseconds of one `enqueue()`, captured `reps` times into one graph."""
        from poot_cuda.driver import Graph

        g = Graph(self.ctx, lambda: [enqueue() for _ in range(reps)])
        return self.call_ms(g.launch, 1, trials) / reps

    def call_ms(self, fn, reps: int = 1, trials: int = 7) -> float:
        """Median device milliseconds of `fn()` (which queues work), after one warm-up."""
        fn()
        self.ctx.sync()
        times = []
        for _ in range(trials):
            self.check(self.cu.cuEventRecord(self.start, self.ctx.stream), "cuEventRecord")
            for _ in range(reps):
                fn()
            self.check(self.cu.cuEventRecord(self.stop, self.ctx.stream), "cuEventRecord")
            self.check(self.cu.cuEventSynchronize(self.stop), "cuEventSynchronize")
            ms = self.check(self.cu.cuEventElapsedTime(self.start, self.stop), "elapsed")
            times.append(ms / reps)
        return statistics.median(times)


COPY_KERNEL = """
extern "C" __global__ void __launch_bounds__(256) poot_bench_copy(
    const uint4* __restrict__ src, uint4* __restrict__ dst) {
  const unsigned long long i = (unsigned long long)blockIdx.x * 256u + threadIdx.x;
  if (i < %dull) dst[i] = src[i];
}
"""


def copy_kernel(nbytes: int):
    """(CUDA C source, kernel name, grid) of a copy of `nbytes` moving 16 bytes a thread."""
    n16 = nbytes // 16
    return COPY_KERNEL % n16, "poot_bench_copy", (-(-n16 // 256),)


def copy_bandwidths(ctx, timer, nbytes: int = 1 << 30) -> dict[str, float]:
    """GB/s (read + write) of several device-to-device copies of `nbytes`."""
    from poot_cuda.compiler import compile_cubin
    from poot_cuda.driver import Launch

    out = {}
    src, dst = ctx.alloc(nbytes), ctx.alloc(nbytes)
    try:
        ctx.write(src, np.frombuffer(np.random.default_rng(0).bytes(nbytes), np.uint8))
        gbs = lambda ms: 2 * nbytes / ms / 1e6  # noqa: E731
        out["cuMemcpyDtoD, graph"] = gbs(timer.graph_ms(lambda: ctx.copy(dst, src, nbytes),
                                                        reps=5, trials=5))
        out["cuMemcpyDtoD, stream"] = gbs(timer.call_ms(lambda: ctx.copy(dst, src, nbytes),
                                                        reps=5, trials=5))
        source, name, grid = copy_kernel(nbytes)
        fn = ctx.function(ctx.load_module(compile_cubin(source, name, ARCH)), name)
        launch = Launch(fn, grid, (256,), [src, dst], name)
        out["copy kernel, 16 B/thread"] = gbs(timer.graph_ms(lambda: launch(ctx), reps=5,
                                                             trials=5))
    finally:
        ctx.free(src)
        ctx.free(dst)
    return out


def torch_event_ms(fn, reps: int, trials: int = 7) -> float:
    """Median milliseconds of one `fn()` queued by PyTorch (CUDA events), after a warm-up."""
    import torch

    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(trials):
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / reps)
    return statistics.median(times)


def torch_ceilings(nbytes: int = 1 << 30) -> dict[str, float]:
    """PyTorch on the same GPU: copy_ GB/s and bf16 matmul 4096^3 TFLOP/s (CUDA events)."""
    import torch

    event_ms = torch_event_ms

    def copy_gbs() -> float:
        src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        return 2 * nbytes / event_ms(lambda: dst.copy_(src), 5) / 1e6

    def matmul_tflops(n: int = 4096) -> float:
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        return 2 * n ** 3 / event_ms(lambda: a @ b, 20) / 1e9

    out = {"torch copy_ GB/s": copy_gbs(), "torch bf16 matmul 4096^3 TFLOP/s": matmul_tflops()}
    torch.cuda.empty_cache()
    return out


def check_result(ctx, modules, compiled, operands, out, b: Bench) -> None:
    """The kernel's result against numpy in f32: relative Frobenius error under 1e-2
    (bf16 operands and outputs) and no NaN; the output starts poisoned."""
    from poot_cuda.harness import LoweringRun

    run = LoweringRun(ctx, modules, compiled, operands, out)
    try:
        run.run()
        got = run.result().astype(np.float32)
    finally:
        run.free()
    a, w = (x.astype(np.float32) for x in operands[:2])
    want = a @ (w.T if isinstance(b.op, DenseContraction) else w)
    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    print(f"check {b.label}: relative error {err:.2e}", flush=True)
    if not np.isfinite(got).all() or err > 1e-2:
        raise AssertionError(f"{b.label}: wrong result (relative error {err:.2e})")


def summary(key: str, value) -> None:
    print(f"SUMMARY {key} | {value}", flush=True)


@contextlib.contextmanager
def scheduled(backend, schedule):
    """`backend` lowers under `schedule` (a poot.codegen.lower.schedule.DotSchedule)
    inside the block: its `schedule` hook answered on this instance, its shared lowerings
    dropped on the way in and out."""
    before = backend.__dict__.pop("schedule", None)
    backend.schedule = lambda device: schedule
    backend.forget_lowerings()
    try:
        yield
    finally:
        del backend.schedule
        if before is not None:
            backend.schedule = before
        backend.forget_lowerings()


def bench_ops(ctx, timer, copy_gbs: float, torch_tflops: float | None, rows: list,
              kinds=None, tag: str = "", schedule=None):
    """Each row of ops_to_bench() (of `kinds` when given; `tag` appended to the labels),
    the contractions tuned by `schedule` (None: the target's default)."""
    from poot_cuda.harness import LoweringRun
    from poot_cuda.kernels import ModuleCache, compile_program
    from poot_cuda.printer import CudaPrinter

    modules, rng = ModuleCache(ctx), np.random.default_rng(1)
    for b in ops_to_bench():
        if kinds is not None and b.kind not in kinds:
            continue
        b.label += tag
        runs = []
        try:
            out = b.op.infer(b.ins)
            compiled = compile_program(lower(b.op, b.ins, out, FEATURES, schedule),
                                       CudaPrinter(ARCH))
            operands = [random_operand(t, rng) for t in b.ins]
            if b.kind in ("gemm", "gemv"):
                check_result(ctx, modules, compiled, operands, out, b)
            sets = copies_for(b.nbytes) if b.kind in ("gemv", "q4") else 1
            runs = [LoweringRun(ctx, modules, compiled, operands, out) for _ in range(sets)]

            def enqueue(runs=runs):
                for r in runs:
                    r.enqueue()

            ms = timer.graph_ms(enqueue, reps=b.reps, trials=5 if b.reps < 5 else 7) / sets
        except Exception as e:  # noqa: BLE001 - one broken row must not hide the others
            traceback.print_exc()
            rows.append((b.label, "FAILED", f"{type(e).__name__}: {e}"[:200], "", ""))
            summary(b.label, "FAILED")
            continue
        finally:
            for r in runs:
                r.free()
        gbs, tflops = b.nbytes / ms / 1e6, b.flops / ms / 1e9
        frac = gbs / copy_gbs
        note = f"{100 * frac:5.1f}% of copy"
        if b.kind == "gemv":
            note += f" (target {100 * TARGETS['gemv']:.0f}%)"
        elif b.kind == "q4":
            note += f" (target {100 * TARGETS['q4']:.0f}%)"
        elif b.kind == "gemm":
            note = (f"{100 * tflops / torch_tflops:5.1f}% of torch.matmul "
                    f"(target {100 * TARGETS['gemm']:.0f}%)" if torch_tflops else "torch n/a")
        if sets > 1:
            note += f", {sets} weight copies"
        rows.append((b.label, f"{ms * 1e3:9.1f} us", f"{gbs:8.1f} GB/s", note,
                     f"{tflops:8.2f} TFLOP/s"))
        if b.kind == "gemm":
            summary(b.label, f"{tflops:.2f} TFLOP/s = {note.split(' (')[0].strip()}")
        elif b.kind:
            summary(b.label, f"{gbs:.0f} GB/s = {100 * frac:.1f}% of copy")


def smollm2_step(device, plan_only: bool = False):
    """A SmolLM2-135M-shaped decode step with random bf16 weights, planned for `device`."""
    import poot
    from poot.models.llama import LlamaConfig, build_decoder, random_weights
    from poot.plan import plan
    from poot_cuda.backend import CudaBackend

    config = LlamaConfig(vocab=49152, dim=576, layers=30, heads=9, kv_heads=3, head_dim=64,
                         ffn=1536, rope_base=100000.0, max_seq=1024)
    t0 = time.time()
    weights = random_weights(config, seed=0, dtype="bf16")
    step = build_decoder(config, weights, tokens=1, kv="dense")
    backend = CudaBackend()
    compiled = poot.compile(step.graph, (backend, device))
    p = plan(compiled, (backend, device))
    print(f"smollm2-shape step: {len(p.steps)} kernels planned in {time.time() - t0:.1f} s",
          flush=True)
    return step, weights, compiled, p


def host_ms(fn, steps: int = 50) -> float:
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def bench_step(device, rows):
    from poot.compiler.validate import random_inputs
    from poot.models.llama import const_inputs
    from poot.runtime.executor import Executor

    step, weights, compiled, p = smollm2_step(device)
    g = compiled.graph
    inputs = random_inputs(g, np.random.default_rng(0), const_inputs(step, weights))
    label = lambda v: g.meta(v).identity.label  # noqa: E731
    ex = Executor(p, {label(v): inputs[label(v)] for v in g.consts()})
    slots = {label(v): inputs[label(v)] for v, _ in g.slots()}
    slots["pos"] = np.array([100], np.int32) if "pos" in slots else None
    slots = {k: v for k, v in slots.items() if v is not None}
    exe = ex.executable
    kernels = sum(1 for a in exe._actions if a[0] == "launch")
    # events must sit on the stream the step's graph is launched on (the runtime's own)
    timer = Timer(ex.runtime.ctx)
    exe.replay = True
    ex.step(slots)                      # records the CUDA graph
    replay_host = host_ms(lambda: ex.step(slots))    # replay + slot writes + result read
    replay_dev = timer.call_ms(exe._graph.launch, reps=20, trials=5)
    exe.replay = False
    ex.step(slots)
    eager_host = host_ms(lambda: ex.step(slots))     # every kernel launched from Python
    eager_dev = timer.call_ms(exe._enqueue, reps=3, trials=5)
    exe.replay = True
    overlap_dev = None
    if exe.overlap:        # the same graph with ordinary launches: what overlap saves
        set_overlap(exe, False)
        ex.step(slots)
        overlap_dev, replay_dev = replay_dev, timer.call_ms(exe._graph.launch, reps=20, trials=5)
        set_overlap(exe, True)
        ex.step(slots)
        rows.append(("smollm2-shape decode step (graph replay, overlapped launches)",
                     f"{overlap_dev * 1e3:9.1f} us", f"{1e3 / overlap_dev:8.1f} tok/s",
                     "programmatic dependent launch", ""))
        summary("smollm2-shape step, replay + overlapped launches (graph alone)",
                f"{1e3 / overlap_dev:.1f} tok/s vs {1e3 / replay_dev:.1f} tok/s ordinary")
    profile_step(exe, timer, rows)
    for name, ms, what in (("graph replay, launch only", replay_dev, f"{kernels} kernels"),
                           ("graph replay, Executor.step", replay_host,
                            "incl. slot write + logits read"),
                           ("no replay, launches only", eager_dev, f"{kernels} launches"),
                           ("no replay, Executor.step", eager_host,
                            "incl. slot write + logits read")):
        rows.append((f"smollm2-shape decode step ({name})", f"{ms * 1e3:9.1f} us",
                     f"{1e3 / ms:8.1f} tok/s", what, ""))
    summary("smollm2-shape step, replay (Executor.step)",
            f"{1e3 / replay_host:.1f} tok/s (target {TARGETS['decode']:.0f}); "
            f"graph alone {1e3 / replay_dev:.1f} tok/s")
    summary("smollm2-shape step, no replay (Executor.step)",
            f"{1e3 / eager_host:.1f} tok/s; launches alone {1e3 / eager_dev:.1f} tok/s")


GEMM_SCHEDULES = [dict(bk=32, stages=2), dict(bk=32, stages=4), dict(stages=2), dict(stages=3),
                  dict(bn=256, stages=2), dict(bm=256, warps_m=4, warps_n=4),
                  dict(bn=256, warps_m=4, warps_n=4)]


def bench_gemm_schedules(ctx, timer, torch_tflops, rows, n: int = 4096) -> None:
    """The bf16 4096^3 MatMul under other tensor-core schedules (tile, K step, stages,
    warp grid), each checked against numpy: which one the lowering should default to."""
    from poot.codegen.lower import mma
    from poot_cuda.harness import LoweringRun
    from poot_cuda.kernels import ModuleCache, compile_program
    from poot_cuda.printer import CudaPrinter

    modules, rng = ModuleCache(ctx), np.random.default_rng(2)
    b = Bench("gemm", MatMul(), [T((n, n), BF16), T((n, n), BF16)], 6 * n * n, 2 * n ** 3,
              "gemm", reps=10)
    operands = [random_operand(t, rng) for t in b.ins]
    out, default = b.op.infer(b.ins), mma.SCHEDULE
    for params in GEMM_SCHEDULES:
        sc = mma.Schedule(**params)
        label = f"bf16 GEMM {n}^3 schedule {params}"
        run = None
        try:
            mma.SCHEDULE = sc
            compiled = compile_program(lower(b.op, b.ins, out, FEATURES), CudaPrinter(ARCH))
            check_result(ctx, modules, compiled, operands, out, b)
            run = LoweringRun(ctx, modules, compiled, operands, out)
            ms = timer.graph_ms(run.enqueue, reps=b.reps, trials=5)
        except Exception as e:  # noqa: BLE001 - one broken schedule must not hide the others
            traceback.print_exc()
            summary(label, f"FAILED {type(e).__name__}: {e}"[:160])
            continue
        finally:
            mma.SCHEDULE = default
            if run is not None:
                run.free()
        tflops = b.flops / ms / 1e9
        note = f"{100 * tflops / torch_tflops:.1f}% of torch.matmul" if torch_tflops else ""
        rows.append((label, f"{ms * 1e3:9.1f} us", "", note, f"{tflops:8.2f} TFLOP/s"))
        summary(label, f"{tflops:.1f} TFLOP/s {note}")


def set_overlap(exe, on: bool) -> None:
    """Switch a loaded step's launches between overlapped and ordinary; re-record."""
    for action in exe._actions:
        if action[0] == "launch":
            action[1].overlap = on
    exe.overlap, exe._graph = on, None


def profile_step(exe, timer, rows, top: int = 8) -> None:
    """Each launch of the step timed alone (a graph of 20 of it), summed per kernel kind:
    where the step's time goes (isolated launches see a warm L2, so this ranks, not adds)."""
    per_kind: dict[str, list[float]] = {}
    for action in exe._actions:
        if action[0] != "launch":
            continue
        launch = action[1]
        kind = launch.name.split("_")[1] + ("_merge" if launch.name.endswith("merge") else "")
        ms = timer.graph_ms(lambda launch=launch: launch(exe.rt.ctx), reps=20, trials=3)
        per_kind.setdefault(kind, []).append(ms)
    total = sum(sum(v) for v in per_kind.values())
    ranked = sorted(per_kind.items(), key=lambda kv: -sum(kv[1]))
    for kind, times in ranked[:top]:
        rows.append((f"  step profile: {kind}", f"{sum(times) * 1e3:9.1f} us",
                     f"{len(times)} launches", f"{100 * sum(times) / total:5.1f}% of "
                     f"{total * 1e3:.0f} us", f"{statistics.mean(times) * 1e3:.1f} us each"))
        summary(f"step profile {kind}", f"{sum(times) * 1e3:.0f} us in {len(times)} launches "
                f"({statistics.mean(times) * 1e3:.1f} us each)")


def plan_only():
    from poot_cuda.backend import CudaBackend
    from poot_cuda.compiler import compile_cubin
    from poot_cuda.kernels import compile_program
    from poot_cuda.printer import CudaPrinter

    compile_cubin(*copy_kernel(1 << 30)[:2], ARCH)
    print("compiled copy kernel", flush=True)
    for b in ops_to_bench():
        compile_program(lower(b.op, b.ins, b.op.infer(b.ins), FEATURES), CudaPrinter(ARCH))
        print(f"compiled {b.label} ({b.nbytes / 1e6:.1f} MB, {copies_for(b.nbytes)} copies "
              f"if rotated)", flush=True)
    smollm2_step(CudaBackend.compile_only_device(ARCH), plan_only=True)


def open_device():
    """(context, timer) of the first CUDA device, its name printed; exits with the reason
    when there is none."""
    from poot_cuda.driver import Context
    from poot_cuda.probe import probe

    devices, reason = probe()
    if not devices:
        raise SystemExit(reason)
    print(devices[0], flush=True)
    ctx = Context(0)
    return ctx, Timer(ctx)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", action="store_true", help="no GPU: lower, compile, plan only")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch reference rows")
    ap.add_argument("--no-sweep", action="store_true", help="skip the GEMM schedule sweep")
    ap.add_argument("--sweep-only", action="store_true", help="only the GEMM schedule sweep")
    ap.add_argument("--gemv-columns", default="",
                    help="only the packed GEMV rows, once per value of RUN_COLUMNS (e.g. 1,2)")
    args = ap.parse_args()
    if args.plan:
        plan_only()
        return
    from poot_cuda.backend import CudaBackend

    ctx, timer = open_device()
    rows = []
    copies = copy_bandwidths(ctx, timer)
    torch_tflops = None
    if not args.no_torch:
        try:
            ref = torch_ceilings()
            copies["torch copy_"] = ref["torch copy_ GB/s"]
            torch_tflops = ref["torch bf16 matmul 4096^3 TFLOP/s"]
        except Exception as e:  # noqa: BLE001 - the poot rows still run
            traceback.print_exc()
            rows.append(("torch reference", "FAILED", f"{type(e).__name__}: {e}"[:200], "", ""))
    copy_gbs = max(copies.values())
    best = max(copies, key=copies.get)
    for name, gbs in copies.items():
        rows.append((f"copy 1 GiB: {name}", "", f"{gbs:8.1f} GB/s",
                     "(ceiling)" if name == best else "", ""))
    summary("copy ceiling (best of the copies)", f"{copy_gbs:.0f} GB/s ({best})")
    if torch_tflops:
        rows.append(("torch.matmul bf16 4096^3", "", "", "", f"{torch_tflops:8.2f} TFLOP/s"))
        summary("torch.matmul bf16 4096^3", f"{torch_tflops:.0f} TFLOP/s")
    if args.gemv_columns:
        from poot.codegen.lower.schedule import dot_schedule

        for cols in (int(c) for c in args.gemv_columns.split(",")):
            bench_ops(ctx, timer, copy_gbs, torch_tflops, rows, {"q4"}, f" columns={cols}",
                      replace(dot_schedule(FEATURES), run_columns=cols))
        print_rows(rows)
        return
    if args.sweep_only:
        bench_gemm_schedules(ctx, timer, torch_tflops, rows)
        print_rows(rows)
        return
    bench_ops(ctx, timer, copy_gbs, torch_tflops, rows)
    if not args.no_sweep:
        bench_gemm_schedules(ctx, timer, torch_tflops, rows)
    try:
        bench_step(CudaBackend().probe()[0], rows)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        rows.append(("smollm2-shape decode step", "FAILED", f"{type(e).__name__}: {e}"[:300],
                     "", ""))
        summary("smollm2-shape step", "FAILED")
    print_rows(rows)


def print_rows(rows) -> None:
    print()
    widths = [max(len(str(r[i])) for r in rows) for i in range(5)]
    for r in rows:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


if __name__ == "__main__":
    main()
