"""Vulkan next to wgpu and cuda on one GPU, in one run:

1. SmolLM2-135M greedy decode tokens/s on each backend given (default vulkan, cuda,
   wgpu; a backend without a device is reported with its reason), the same prompt and
   token count, through the public session (slot writes and the logits read included),
   after a warm-up generation that plans and records the steps. Token ids are compared.
   The real GGUF when POOT_SMOLLM2_GGUF (or the poot cache) has it, else --random:
   SmolLM2's exact shape with random Q4_1 weights.
   With --profile, vulkan's decode step is then profiled: GPU timestamps after every
   operation of the recorded step, summed per kernel kind, next to the host's wall time
   per submit; the same operations recorded with each barrier form between batches
   (poot_vulkan.barrier: narrow, sync2, wide; POOT_VULKAN_BARRIER sets the session's),
   with none (a race, timed only) and with a sleeping fence wait, each timed; and the
   floor a dispatch costs on the device (a chain of one-workgroup dispatches with and
   without a barrier between them).
2. On vulkan: a chain of dense bf16 GEMVs (f32 x bf16 DenseContraction, alternating
   N x K and K x N weights, each its own buffer) as achieved GB/s, next to a device
   buffer copy (vkCmdCopyBuffer, read + write counted) recorded and timed the same way
   (one submit of a recorded command buffer per repetition, fence-waited).

    python3 poot-backend-vulkan/bench/vulkan_bench.py [--tokens 32] [--random] [--profile]
    python3 poot-backend-vulkan/bench/vulkan_bench.py --backends vulkan,reference \
        --random --tokens 4 --gemv 1024x512 --copy-mb 16       # a quick check on lavapipe

Lines starting with "SUMMARY " are the results (h200_session.sh collects them).
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# the cuda backend's SmolLM2 bench owns the shared pieces: loading a model (real or random
# weights of SmolLM2's shape) and a timed greedy generation through the session
sys.path.insert(0, os.path.join(HERE, "..", "..", "poot-backend-cuda", "bench"))


def summary(key: str, value) -> None:
    print(f"SUMMARY {key} | {value}", flush=True)


def decode(backends: list[str], tokens: int, random: bool, max_seq: int,
           profiled: bool = False) -> dict[str, float]:
    from poot.models.hub import smollm2_path
    from poot.plugin import get_backend
    from smollm2_gpu import PROMPT, PROMPT_IDS, greedy, load, tps

    random = random or smollm2_path() is None
    summary("smollm2 weights", "random Q4_1, SmolLM2's shape" if random else smollm2_path())
    results, ids_of, frozen_tps = {}, {}, {}
    for name in backends:
        try:
            b = get_backend(name)
            if not b.probe():
                summary(f"smollm2 {name} decode", f"SKIPPED: {b.unavailable_reason()}")
                continue
            model = load(name, max_seq, random)
            ids = PROMPT_IDS if random else model.tokenize(PROMPT)
            t0 = time.perf_counter()
            greedy(model, ids, tokens)  # plans, binds and records every step
            print(f"[{name}] warm-up generation {time.perf_counter() - t0:.2f} s", flush=True)
            with GcWatch() as watch, SubmitWatch() as submits:
                run = greedy(model, ids, tokens)
            results[name], ids_of[name] = tps(run), run["ids"]
            steps = np.asarray(run["steps_s"]) * 1e3
            print(f"[{name}] ids {run['ids']}\n[{name}] steps (ms) {np.round(steps, 3).tolist()}",
                  flush=True)
            summary(f"smollm2 {name} decode", f"{results[name]:.1f} tok/s ({spread(steps)}; "
                    f"{watch})")
            if submits.times:
                summary(f"smollm2 {name} recorded-step submits", spread(submits.times))
            # the same with the collector's objects frozen (no collection walks the plans)
            gc.collect()
            gc.freeze()
            try:
                with GcWatch() as watch:
                    frozen = greedy(model, ids, tokens)
            finally:
                gc.unfreeze()
            frozen_tps[name] = tps(frozen)
            summary(f"smollm2 {name} decode, gc frozen", f"{frozen_tps[name]:.1f} tok/s "
                    f"({spread(np.asarray(frozen['steps_s']) * 1e3)}; {watch})")
            if profiled and name == "vulkan":
                profile_decode(model, ids, float(np.median(steps)))
            del model
        except Exception as e:  # noqa: BLE001 - report and go on to the next backend
            traceback.print_exc()
            summary(f"smollm2 {name} decode", f"FAILED: {type(e).__name__}: {e}"[:300])
    first = next(iter(ids_of.values()), None)
    for name, ids in ids_of.items():
        summary(f"smollm2 {name} ids", "same as " + next(iter(ids_of)) if ids == first
                else f"DIFFERENT: {ids}")
    if "vulkan" in results:
        for peer in ("cuda", "wgpu"):
            if results.get(peer):
                summary(f"smollm2 vulkan / {peer}", f"{results['vulkan'] / results[peer]:.2f}"
                        f"{' (target 0.60)' if peer == 'cuda' else ''}; gc frozen "
                        f"{frozen_tps.get('vulkan', 0) / frozen_tps.get(peer, 1):.2f}")
    return results


def spread(ms) -> str:
    ms = np.asarray(ms)
    return (f"median {np.median(ms):.3f} ms, mean {ms.mean():.3f}, max {ms.max():.3f} at "
            f"{int(ms.argmax())} of {len(ms)}")


class GcWatch:
    """Python's garbage collections while active: how many, how many full, how long."""

    def __enter__(self):
        self.count = self.full = 0
        self.seconds = self._t0 = 0.0
        gc.callbacks.append(self._callback)
        return self

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.count += 1
            self.full += info["generation"] == 2
            self.seconds += time.perf_counter() - self._t0

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)

    def __str__(self) -> str:
        return (f"gc: {self.count} collections, {self.full} full, "
                f"{self.seconds * 1e3:.1f} ms")


class SubmitWatch:
    """ms of every vulkan RecordedStep.submit while active (none on other backends)."""

    def __enter__(self):
        self.times: list[float] = []
        try:
            from poot_vulkan.step import RecordedStep
        except ImportError:
            self.cls = None
            return self
        self.cls, self.orig = RecordedStep, RecordedStep.submit

        def submit(step, orig=self.orig):
            t0 = time.perf_counter()
            orig(step)
            self.times.append((time.perf_counter() - t0) * 1e3)
        RecordedStep.submit = submit
        return self

    def __exit__(self, *exc) -> None:
        if self.cls is not None:
            self.cls.submit = self.orig


def profile_decode(model, ids: list[int], session_ms: float) -> None:
    """The decode step's GPU profile, its submit time and its variants (module doc)."""
    from poot_vulkan import step as poot_step
    from poot_vulkan.barrier import FORMS
    from poot_vulkan.profile import profile
    from poot_vulkan.step import RecordedStep

    session = model.session()
    model.prepare(session, len(ids), None)
    seq = object()
    session.open(seq)
    try:
        logits = session.prefill(seq, ids)
        for _ in range(3):
            logits = session.decode({seq: int(np.argmax(logits))})[seq]
        step = max((ex.executable.step for ex in session.executors.values()),
                   key=lambda s: s.replays)
        dev = step.dev
        submit_ms = timed(step.submit, 20) * 1e3
        prof = profile(step, runs=5)
        print(f"[vulkan] decode step profile ({len(step.ops)} operations, "
              f"{step.barriers} {step.barrier} barriers between batches):\n{prof.table()}",
              flush=True)
        kernels = sum(op.ns for op in prof.ops if op.kind not in ("copy", "upload"))
        summary("vulkan decode step, GPU span (timestamps)",
                f"{prof.span_ns / 1e3:.1f} us over {len(prof.ops)} operations, "
                f"{step.barriers} barriers; dispatches {kernels / 1e3:.1f} us")
        summary("vulkan decode step, host submit + fence wait",
                f"{submit_ms * 1e3:.1f} us (session decode step {session_ms * 1e3:.1f} us)")
        for kind in prof.by_kind()[:6]:
            summary(f"vulkan profile {kind.kind}",
                    f"{kind.count} x {kind.ns / kind.count / 1e3:.2f} us = "
                    f"{kind.ns / 1e3:.1f} us ({kind.barriers} after a barrier)")
        # the same operations and batches under every barrier form, timed in turn
        for form in FORMS:
            if form == "sync2" and dev.barrier2 is None:
                summary("vulkan decode step, sync2 barriers", "SKIPPED: no synchronization2")
                continue
            other = RecordedStep(dev, step.ops, step.uploads, barrier=form)
            summary(f"vulkan decode step, {form} barriers",
                    f"{timed(other.submit, 20) * 1e6:.1f} us")
            other.destroy()
        # what the barriers cost at most: every operation in one batch (a race: wrong
        # results, timed only; the session is not used after it)
        cut = poot_step.batches
        poot_step.batches = lambda ops: [list(ops)]
        try:
            free = RecordedStep(dev, step.ops, step.uploads)
        finally:
            poot_step.batches = cut
        summary("vulkan decode step, no barriers (racy, timing only)",
                f"{timed(free.submit, 20) * 1e6:.1f} us")
        free.destroy()
        dev.spin = False
        try:
            summary("vulkan decode step, sleeping fence wait",
                    f"{timed(step.submit, 20) * 1e6:.1f} us")
        finally:
            dev.spin = not dev.facts.is_software
    finally:
        session.close(seq)
    dispatch_floor(dev)


def dispatch_floor(dev, n: int = 400) -> None:
    """us per dispatch of a one-workgroup kernel: `n` in one submit, each reading and
    writing one buffer (a barrier between every two), or each its own (none)."""
    from poot.codegen.builder import KernelBuilder
    from poot.codegen.expr import Load, f32
    from poot.codegen.program import Access, global_id
    from poot.dtypes import DType
    from poot_vulkan.compiler import compile_kernel
    from poot_vulkan.glsl import GlslPrinter
    from poot_vulkan.memory import VulkanBuffer
    from poot_vulkan.pipeline import pipelines
    from poot_vulkan.step import Binding, Dispatch, RecordedStep

    kb = KernelBuilder("bump", grid=(1,), workgroup=(64,))
    kb.buffer("y", DType.F32, Access.READ_WRITE, 64)
    kb.store("y", global_id(), Load("y", global_id(), DType.F32) + f32(1.0))
    k = kb.finish()
    pipe = pipelines(dev).get(compile_kernel(k, GlslPrinter(dev.facts).source(k),
                                             dev.facts), 1, k.name)
    bufs = [VulkanBuffer(dev, 256, f"floor{i}") for i in range(n)]
    for label, chained in (("a barrier between each", True), ("no barriers", False)):
        ops = [Dispatch(pipe, (Binding(bufs[0 if chained else i], 0, 256, True),), (1, 1, 1))
               for i in range(n)]
        step = RecordedStep(dev, ops)
        summary(f"vulkan dispatch floor, {n} one-workgroup dispatches, {label}",
                f"{timed(step.submit, 10) * 1e6 / n:.2f} us per dispatch")
        step.destroy()
    for b in bufs:
        b.destroy()


def timed(run, reps: int, trials: int = 5) -> float:
    """Best seconds per call of `run` over `trials` rounds of `reps` calls."""
    run()
    best = float("inf")
    for _ in range(trials):
        t0 = time.perf_counter()
        for _ in range(reps):
            run()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def gemv_chain(n: int, k: int, links: int, rng):
    """A graph x[1,k] -> W1[n,k] -> W2[k,n] -> ... (`links` bf16 GEMVs), and its weights."""
    import ml_dtypes
    from poot.conformance.roles import input_role
    from poot.dtypes import DType
    from poot.ir import ops as O
    from poot.ir.builder import Builder
    from poot.ir.types import TensorType

    b = Builder("gemv_chain", compiler=True)
    h = b.slot(input_role(DType.F32), (1, k), "x0")
    consts = {}
    for i in range(links):
        rows, cols = (n, k) if i % 2 == 0 else (k, n)
        w = b.const(TensorType((rows, cols), DType.BF16), f"w{i}")
        # random bf16 of size ~1/sqrt(cols) (activations stay O(1) down the chain), a
        # distinct 64-row block per matrix tiled to full height (fast to build)
        block = (rng.standard_normal((64, cols), np.float32) / np.sqrt(cols)).astype(
            ml_dtypes.bfloat16)
        consts[f"w{i}"] = np.tile(block, (-(-rows // 64), 1))[:rows]
        h = b.eqn(O.DenseContraction(), h, w)
    b.result(h)
    return b.finish(), consts


def neg_pass_gbs(backend, device, runtime, nbytes: int) -> float:
    """GB/s (read + write) of one planned elementwise kernel over `nbytes` of f32."""
    from poot.dtypes import DType
    from poot.ir import ops as O
    from poot.ir.builder import Builder
    from poot.ir.types import TensorType
    from poot.plan import plan
    from poot.runtime.executor import Executor
    from poot_vulkan.step import Dispatch, RecordedStep

    b = Builder("neg_pass", compiler=True)
    # a weight, not a slot: a recorded step uploads every slot from the host each run
    x = b.const(TensorType((nbytes // 4,), DType.F32), "x")
    b.result(b.eqn(O.Unary(O.UnaryOp.Neg), x))
    ex = Executor(plan(b.finish(), (backend, device)), {"x": np.ones(nbytes // 4, np.float32)},
                  runtime=runtime)
    ex.step({})
    # its dispatches alone: the recorded step also copies the 1 GiB result to the host
    pass_only = RecordedStep(runtime.dev, [op for op in ex.executable.step.ops
                                           if isinstance(op, Dispatch)])
    return 2 * nbytes / timed(pass_only.submit, 5) / 1e9


def bandwidth(n: int, k: int, links: int, copy_mb: int) -> None:
    """bf16 GEMV GB/s on vulkan as a fraction of a buffer copy timed the same way."""
    from poot.plan import plan
    from poot.plugin import get_backend
    from poot.runtime.executor import Executor
    from poot_vulkan.memory import VulkanBuffer
    from poot_vulkan.step import Copy, RecordedStep

    backend = get_backend("vulkan")
    if not backend.probe():
        summary("vulkan bf16 GEMV", f"SKIPPED: {backend.unavailable_reason()}")
        return
    device = backend.probe()[0]
    rt = backend.runtime(device)
    dev = rt.dev
    print(f"[vulkan] {dev.facts.describe()}", flush=True)

    nbytes = copy_mb << 20
    src, dst = VulkanBuffer(dev, nbytes, "copy-src"), VulkanBuffer(dev, nbytes, "copy-dst")
    copy = RecordedStep(dev, [Copy(src, 0, dst, 0, nbytes)] * 8, label="copy")
    t = timed(copy.submit, 5) / 8
    transfer_gbs = 2 * nbytes / t / 1e9
    summary(f"vulkan buffer copy {copy_mb} MiB (vkCmdCopyBuffer, read + write)",
            f"{transfer_gbs:.1f} GB/s")
    # the driver may serve vkCmdCopyBuffer on a slower path than shaders get: the ceiling is
    # the faster of it and a poot-planned elementwise pass (y = -x) of the same size
    shader_gbs = neg_pass_gbs(backend, device, rt, nbytes)
    summary(f"vulkan y = -x over {copy_mb} MiB f32 (read + write)", f"{shader_gbs:.1f} GB/s")
    copy_gbs = max(transfer_gbs, shader_gbs)

    rng = np.random.default_rng(0)
    graph, consts = gemv_chain(n, k, links, rng)
    ex = Executor(plan(graph, (backend, device)), consts, runtime=rt)
    x = rng.standard_normal((1, k)).astype(np.float32)
    got = ex.step({"x0": x}).result
    want = x
    for i in range(links):
        want = want @ consts[f"w{i}"].astype(np.float32).T
    err = float(np.abs(got - want).max() / (np.abs(want).max() + 1e-30))
    moved = sum(w.nbytes for w in consts.values()) + 4 * (k + n) * links
    t = timed(ex.executable.run, 5)
    gbs = moved / t / 1e9
    summary(f"vulkan bf16 GEMV chain {links} x ({n}x{k}, {k}x{n} alternating)",
            f"{gbs:.1f} GB/s = {gbs / copy_gbs:.2f} of the copy; {t * 1e6 / links:.1f} us "
            f"per GEMV; max rel err {err:.1e}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="vulkan,cuda,wgpu")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--max-seq", type=int, default=128)
    ap.add_argument("--random", action="store_true",
                    help="random Q4_1 weights of SmolLM2's shape even where the GGUF exists")
    ap.add_argument("--gemv", default="14336x4096", help="N x K of the GEMV chain's weights")
    ap.add_argument("--links", type=int, default=8, help="GEMVs in the chain")
    ap.add_argument("--copy-mb", type=int, default=1024)
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--skip-gemv", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="profile vulkan's decode step (GPU timestamps per operation)")
    args = ap.parse_args()
    failed = False
    if not args.skip_decode:
        failed |= not decode(args.backends.split(","), args.tokens, args.random,
                             args.max_seq, args.profile)
    if args.skip_gemv:
        return 1 if failed else 0
    try:
        n, k = (int(v) for v in args.gemv.lower().split("x"))
        bandwidth(n, k, args.links, args.copy_mb)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        summary("vulkan bf16 GEMV", f"FAILED: {type(e).__name__}: {e}"[:300])
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
