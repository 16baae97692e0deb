"""GPU benchmark of the CUDA backend: decode-shaped kernels and a whole decode step.

Prints bytes moved per second against a device-to-device copy measured in the same
run (the bandwidth ceiling), and a SmolLM2-shaped decode step (random bf16 weights)
replayed as one CUDA graph. Timing: CUDA events around graph replays, after warm-up,
median of several trials. Inputs are random, never zeros.

    python bench_gpu.py            # on a machine with a CUDA GPU
    python bench_gpu.py --plan     # without one: lower, compile and plan only
"""
from __future__ import annotations

import argparse
import statistics
import time
import traceback

import numpy as np
from poot.codegen.lower import lower
from poot.dtypes import DType
from poot.ir.ops import Attention, DenseContraction, FusedRow, PackedContraction
from poot.ir.types import TensorType as T

F32, BF16, U8 = DType.F32, DType.BF16, DType.U8


def ops_to_bench():
    """(label, op, operand types, bytes that must move, flops)."""
    from poot.codegen.cases import _rmsnorm
    from poot.formats import PackedWeight
    from poot.ir import region

    out = []
    for n, k in ((4096, 4096), (14336, 4096)):
        out.append((f"dense bf16 GEMV {n}x{k}", DenseContraction(),
                    [T((1, k), F32), T((n, k), BF16)], n * k * 2 + 4 * (k + n), 2 * n * k))
    out.append(("dense bf16 GEMM 64x4096x4096 (tiled, FMA)", DenseContraction(),
                [T((64, 4096), F32), T((4096, 4096), BF16)], 4096 * 4096 * 2,
                2 * 64 * 4096 * 4096))
    pw = PackedWeight("gguf:Q4_0", (28672, 4096))
    srcs = [s.type for s in pw.sources()]
    out.append(("packed Q4_0 GEMV 28672x4096", PackedContraction(pw),
                [T((1, 4096), F32), *srcs], sum(s.nbytes for s in srcs), 2 * 28672 * 4096))
    hq, hkv, s, d = 32, 8, 16384, 128
    out.append((f"attention decode bf16 {hq}/{hkv} heads S={s} D={d}", Attention(d ** -0.5),
                [T((hq, 1, d), BF16), T((hkv, s, d), BF16), T((hkv, s, d), BF16),
                 T((1, s), BF16)], 2 * hkv * s * d * 2, 4 * hq * s * d))
    x, w = T((1, 4096), F32), T((4096,), F32)
    out.append(("rmsnorm FusedRow 1x4096", FusedRow(region([x, w], _rmsnorm), -1), [x, w],
                4096 * 12, 4 * 4096))
    return out


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


def copy_bandwidth(ctx, timer, nbytes: int = 1 << 30) -> float:
    src, dst = ctx.alloc(nbytes), ctx.alloc(nbytes)
    ctx.write(src, np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8))
    ms = timer.graph_ms(lambda: ctx.copy(dst, src, nbytes), reps=5, trials=5)
    ctx.free(src)
    ctx.free(dst)
    return 2 * nbytes / ms / 1e6   # GB/s, read + write


def bench_ops(ctx, timer, copy_gbs: float, rows: list):
    from poot_cuda.harness import LoweringRun
    from poot_cuda.kernels import ModuleCache, compile_lowering
    from poot_cuda.printer import CudaPrinter

    modules, rng = ModuleCache(ctx), np.random.default_rng(1)
    for label, op, ins, nbytes, flops in ops_to_bench():
        try:
            out = op.infer(ins)
            compiled = compile_lowering(lower(op, ins, out), CudaPrinter("sm_90"))
            run = LoweringRun(ctx, modules, compiled, [random_operand(t, rng) for t in ins], out)
            ms = timer.graph_ms(run.enqueue)
            run.free()
        except Exception as e:  # noqa: BLE001 - one broken row must not hide the others
            traceback.print_exc()
            rows.append((label, "FAILED", f"{type(e).__name__}: {e}"[:200], "", ""))
            continue
        gbs = nbytes / ms / 1e6
        rows.append((label, f"{ms * 1e3:9.1f} us", f"{gbs:8.1f} GB/s",
                     f"{100 * gbs / copy_gbs:5.1f}% of copy", f"{flops / ms / 1e9:8.2f} TFLOP/s"))


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
    print(f"smollm2-shape step: {len(p.steps)} kernels planned in {time.time() - t0:.1f} s")
    return step, weights, compiled, p


def bench_step(device, timer, rows):
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
    ex.step(slots)                      # records the CUDA graph
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        ex.step(slots)                  # replay + slot writes + result read
        times.append(time.perf_counter() - t0)
    exe = ex.executable
    # events must sit on the stream the step's graph is launched on (the runtime's own)
    ms_graph = Timer(ex.runtime.ctx).call_ms(exe._graph.launch, reps=20, trials=5)
    ms_host = statistics.median(times) * 1e3
    rows.append(("smollm2-shape decode step (graph replay only)", f"{ms_graph * 1e3:9.1f} us",
                 f"{1e3 / ms_graph:8.1f} tok/s", f"{len(p.steps)} kernels", ""))
    rows.append(("smollm2-shape decode step (Executor.step)", f"{ms_host * 1e3:9.1f} us",
                 f"{1e3 / ms_host:8.1f} tok/s", "incl. slot write + logits read", ""))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", action="store_true", help="no GPU: lower, compile, plan only")
    args = ap.parse_args()
    from poot_cuda.backend import CudaBackend

    if args.plan:
        for label, op, ins, *_ in ops_to_bench():
            from poot_cuda.kernels import compile_lowering
            from poot_cuda.printer import CudaPrinter

            compile_lowering(lower(op, ins, op.infer(ins)), CudaPrinter("sm_90"))
            print("compiled", label)
        smollm2_step(CudaBackend.compile_only_device("sm_90"), plan_only=True)
        return
    from poot_cuda.driver import Context
    from poot_cuda.probe import probe

    devices, reason = probe()
    if not devices:
        raise SystemExit(reason)
    print(devices[0])
    ctx = Context(0)
    timer = Timer(ctx)
    copy_gbs = copy_bandwidth(ctx, timer)
    rows = [("device-to-device copy 1 GiB (ceiling)", "", f"{copy_gbs:8.1f} GB/s", "", "")]
    bench_ops(ctx, timer, copy_gbs, rows)
    try:
        bench_step(CudaBackend().probe()[0], timer, rows)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        rows.append(("smollm2-shape decode step", "FAILED", f"{type(e).__name__}: {e}"[:300],
                     "", ""))
    print()
    for r in rows:
        print(" | ".join(str(c) for c in r))


if __name__ == "__main__":
    main()
