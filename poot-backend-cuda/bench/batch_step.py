"""Where a batched decode step's time goes: SmolLM2-135M's paged decode step at several
batch sizes on cuda, under the rows GEMV and under the tiled GEMM it replaces.

- each SmolLM2 matmul shape (packed Q4_1, N x K) alone at M rows: device time of the
  tiled GEMM (DotSchedule.batch_rows = 0) and of the rows GEMV as chosen, all wide and all
  narrow (`VARIANTS`), each result checked against numpy first;
- the recorded paged decode step (graph replay, device time) at each --batches size under
  each schedule, and per kernel kind (each launch timed alone, summed) at the largest;
  also Executor.step's host time (slot writes and the logits read included);
- with --prefill, the paged prefill steps of b sequences x t tokens (serve's prefill
  plans: the head on each sequence's last row), each profiled by kernel kind;
- greedy tokens of --batches' largest number of identical sequences decoded together
  against one sequence alone (batching changes nothing but speed).
Weights are random Q4_1 of SmolLM2's exact shape (each block's scale and offset drawn,
its nibbles random bytes: the quantizer's numpy loop is minutes of CPU for 135M weights).
Rows of each batch sit at position --pos of their own contiguous KV slots.

    python batch_step.py --batches 1,8,32          # on a CUDA GPU
    python batch_step.py --set INT_MAX_K=0 ...     # every part under another schedule
Lines starting with "SUMMARY " are for collecting scripts.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import time
import traceback
from dataclasses import replace

import numpy as np
from bench_gpu import FEATURES, Timer, profile_step, scheduled
from poot.codegen.lower import attention
from poot.codegen.lower.schedule import GEMV_MAX_ROWS, dot_schedule

SHAPES = ((576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576))   # (N, K)
#: (label, batch_rows, rows_wide_n) of the matmul rows: the tiled GEMM, the rows GEMV as
#: chosen, and the rows GEMV with every N taken as wide (two columns a group, trips of
#: `unroll`) or as narrow (one column, long trips)
VARIANTS = (("tiled GEMM", 0, None), ("rows GEMV", 32, None), ("rows all wide", 32, 0),
            ("rows all narrow", 32, 1 << 30))
#: the contraction schedule every part starts from (cuda's default; --set replaces fields)
BASE = dot_schedule(FEATURES)


def summary(key: str, value) -> None:
    print(f"SUMMARY {key} | {value}", flush=True)


@contextlib.contextmanager
def full_walk():
    """Decode attention walking every key of its split (the form before REACH)."""
    attention.REACH = False
    try:
        yield
    finally:
        attention.REACH = True


def tuned(batch_rows: int, wide_n: int | None = None):
    """BASE with the rows GEMV's most rows and wide N (None: BASE's) replaced."""
    return replace(BASE, batch_rows=batch_rows,
                   rows_wide_n=BASE.rows_wide_n if wide_n is None else wide_n)


def q4_1_blocks(rng, n: int, k: int) -> np.ndarray:
    """Q4_1 bytes [n, k/32 * 20] (f16 d, f16 m, 16 bytes of nibbles) of weights spread
    about 1/sqrt(k) around zero."""
    blocks = k // 32
    d = (rng.uniform(0.5, 1.5, (n, blocks)) / (4.6 * math.sqrt(k))).astype("<f2")
    raw = np.empty((n, blocks, 20), np.uint8)
    raw[..., 0:2] = d.view(np.uint8).reshape(n, blocks, 2)
    raw[..., 2:4] = (-7.5 * d.astype(np.float32)).astype("<f2").view(np.uint8).reshape(
        n, blocks, 2)
    raw[..., 4:] = rng.integers(0, 256, (n, blocks, 16), dtype=np.uint8)
    return raw.reshape(n, blocks * 20)


def smollm2_model(max_seq: int):
    """SmolLM2-135M's shape, untied (a random tied head echoes the input), random Q4_1
    projections, on the cuda backend."""
    from poot.formats import get_format
    from poot.models.llama import LlamaConfig, random_weights
    from poot.models.runner import Model
    from poot.plugin import get_backend

    cfg = LlamaConfig(vocab=49152, dim=576, layers=30, heads=9, kv_heads=3, head_dim=64,
                      ffn=1536, norm_eps=1e-5, rope_base=100000.0, rope_layout="pairs",
                      tied=False, max_seq=max_seq, arch="llama")
    fmt, rng = get_format("gguf:Q4_1"), np.random.default_rng(0)
    t0 = time.perf_counter()
    fmt.quantize = lambda m: [q4_1_blocks(rng, *m.shape)]
    try:
        weights = random_weights(cfg, seed=0, packed_format="gguf:Q4_1")
    finally:
        del fmt.quantize
    print(f"random Q4_1 weights in {time.perf_counter() - t0:.1f} s", flush=True)
    b = get_backend("cuda")
    return Model(None, cfg, None, b, b.default_device(), weights=weights)


def bench_shapes(ctx, timer, rows_list) -> None:
    from bench_gpu import random_operand
    from poot.codegen.lower import lower
    from poot.dtypes import DType
    from poot.formats import PackedWeight
    from poot.ir.ops import PackedContraction
    from poot.ir.types import TensorType as T
    from poot_cuda.harness import LoweringRun
    from poot_cuda.kernels import ModuleCache, compile_program
    from poot_cuda.printer import CudaPrinter

    modules, rng = ModuleCache(ctx), np.random.default_rng(1)
    for n, k in SHAPES:
        pw = PackedWeight("gguf:Q4_1", (n, k))
        raw = q4_1_blocks(rng, n, k)
        dense = np.asarray(pw.dequantize([raw]), np.float32).reshape(n, k)
        for m in rows_list:
            a_t = T((m, k), DType.F32)
            ins = [a_t, *[s.type for s in pw.sources()]]
            op = PackedContraction(pw)
            out = op.infer(ins)
            a = random_operand(a_t, rng)
            want = a @ dense.T
            line = []
            for label, batch_rows, wide_n in VARIANTS:
                if m <= GEMV_MAX_ROWS and batch_rows == 0:
                    label = "gemv (runs)"
                run = None
                try:
                    compiled = compile_program(
                        lower(op, ins, out, FEATURES, tuned(batch_rows, wide_n)),
                        CudaPrinter("sm_90"))
                    run = LoweringRun(ctx, modules, compiled, [a, raw], out)
                    run.run()
                    got = run.result().astype(np.float32)
                    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
                    if not np.isfinite(got).all() or err > 1e-4:
                        raise AssertionError(f"relative error {err:.2e}")
                    us = timer.graph_ms(run.enqueue, reps=20, trials=5) * 1e3
                    line.append(f"{label} {us:.1f} us ({registers(run)} registers, "
                                f"{run.launches[0].block[0]} threads)")
                except Exception as e:  # noqa: BLE001 - one broken variant must not hide others
                    traceback.print_exc()
                    line.append(f"{label} FAILED {type(e).__name__}: {e}"[:120])
                finally:
                    if run is not None:
                        run.free()
                if m <= GEMV_MAX_ROWS:
                    break       # the GEMV takes these rows under every variant
            summary(f"Q4_1 N={n} K={k} M={m}", "; ".join(line))


def registers(run) -> str:
    """Registers per thread of the lowering's first kernel (bounds its residency)."""
    try:
        from poot_cuda.driver import check, cu

        attr = cu().CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS
        return str(check(cu().cuFuncGetAttribute(attr, run.launches[0].function), "regs"))
    except Exception as e:  # noqa: BLE001 - a figure to print, never a failure
        return f"? ({type(e).__name__})"


def step_slots(b: int, max_seq: int, pos: int) -> dict:
    """Row r at position `pos` of KV slots r * max_seq ...: a real batch's gather pattern."""
    smap = (np.arange(b, dtype=np.int32)[:, None] * max_seq
            + np.arange(max_seq, dtype=np.int32)[None, :])
    return {"tokens": np.full((b, 1), 7, np.int32), "pos": np.full((b, 1), pos, np.int32),
            "write_map": (np.arange(b, dtype=np.int32) * max_seq + pos),
            "slot_map": smap}


def bench_steps(model, batches, max_seq: int, pos: int, label: str, profile_at,
                sample: str | None = None) -> None:
    largest = max(batches)
    # lowered and planned anew under this schedule: the backend shares lowerings by
    # signature, and the model keeps its sessions (with their plans) by shape
    model.backend.forget_lowerings()
    model._sessions.clear()
    session = model.session("paged", batch=largest, pool=max_seq * largest,
                            decode_batches=batches)
    for b in batches:
        t0 = time.perf_counter()
        ex = session.executor(1, b, sample)
        planned = time.perf_counter() - t0
        slots = step_slots(b, max_seq, pos)
        if sample:       # padding sampler rows: greedy, nothing penalized
            from poot.models.sample_graph import slot_values

            slots.update(slot_values([], b, sample))
        exe, timer, dev_ms, kernels = recorded(ex, slots)
        host = []
        for _ in range(30):
            t1 = time.perf_counter()
            ex.step(slots)
            host.append(time.perf_counter() - t1)
        host_ms = 1e3 * statistics.median(host)
        summary(f"step {label} b={b}",
                f"graph {dev_ms:.3f} ms ({b / dev_ms * 1e3:.0f} tok/s), Executor.step "
                f"{host_ms:.3f} ms ({b / host_ms * 1e3:.0f} tok/s), {kernels} kernels, "
                f"planned+bound in {planned:.1f} s")
        if b in profile_at:
            print(f"per kernel kind, {label} b={b}:", flush=True)
            profile_step(exe, timer, [], top=10)
    return session


def recorded(ex, slots):
    """Record `ex`'s step on `slots` as a graph; its executable, a timer, the graph's
    device time (ms) and its kernel launches."""
    exe = ex.executable
    exe.replay = True
    ex.step(slots)                                  # records the graph
    timer = Timer(ex.runtime.ctx)
    dev_ms = timer.call_ms(exe._graph.launch, reps=20, trials=5)
    return exe, timer, dev_ms, sum(1 for a in exe._actions if a[0] == "launch")


def bench_prefill(model, specs: list[tuple[int, int]], max_seq: int) -> None:
    """Each (b, t) prefill step: b sequences of t prompt tokens at positions 0..t-1 of
    their own KV slots, graph device time and the per-kind profile."""
    from poot.runtime.session import LAST

    model.backend.forget_lowerings()
    model._sessions.clear()
    model.prefill_tokens = max(t for _, t in specs)
    largest = max(b for b, _ in specs)
    session = model.session("paged", batch=largest, pool=max_seq * largest,
                            prefill_batches=sorted({b for b, _ in specs}))
    for b, t in specs:
        t0 = time.perf_counter()
        ex = session.executor(t, b)
        planned = time.perf_counter() - t0
        base = np.arange(b, dtype=np.int32)[:, None] * max_seq
        slots = {"tokens": np.full((b, t), 7, np.int32), "pos": np.zeros((b, 1), np.int32),
                 "write_map": (base + np.arange(t, dtype=np.int32)).reshape(-1),
                 "slot_map": base + np.arange(max_seq, dtype=np.int32)[None, :]}
        if LAST in ex.slots:
            slots[LAST] = np.arange(b, dtype=np.int32) * t + t - 1
        exe, timer, dev_ms, kernels = recorded(ex, slots)
        summary(f"prefill {b}x{t}", f"graph {dev_ms:.3f} ms ({b * t / dev_ms * 1e3:.0f} "
                f"tok/s), {kernels} kernels, planned+bound in {planned:.1f} s")
        print(f"per kernel kind, prefill {b}x{t}:", flush=True)
        profile_step(exe, timer, [], top=10)


def greedy_same(session, steps: int) -> None:
    """The session's largest batch less one of identical sequences decoded together
    against one alone (its decode plans: the batch's and 1's)."""
    n_seqs = session.batch - 1
    seqs = list(range(n_seqs))
    session.open(-1)
    for s in seqs:
        session.open(s)
    alone, together, worst, tok1, tokb = [], [], 0.0, 7, 7
    for _ in range(steps):
        one = session.decode_rows({-1: tok1})[0]
        many = session.decode_rows({s: tokb for s in seqs})
        worst = max(worst, float(np.max(np.abs(many - one[None, :]))))
        picks = {int(x) for x in np.argmax(many, axis=1)}
        tok1 = int(np.argmax(one))
        alone.append(tok1)
        together.append(sorted(picks))
        tokb = min(picks)
    same = all(t == [a] for a, t in zip(alone, together, strict=True))
    summary(f"greedy {n_seqs} together vs alone",
            f"{'SAME' if same else 'DIFFERENT'} over {steps} tokens (max |logit diff| "
            f"{worst:.2e}); alone {alone}" + ("" if same else f" together {together}"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,32", help="decode batches under the rows GEMV")
    ap.add_argument("--old-batches", default="32",
                    help="decode batches also timed under the tiled GEMM (batch_rows = 0)")
    ap.add_argument("--rows", default="8,32", help="M of the matmul shapes ('': none)")
    ap.add_argument("--max-seq", type=int, default=512)
    ap.add_argument("--pos", type=int, default=100)
    ap.add_argument("--greedy", type=int, default=12, help="tokens of the greedy check")
    ap.add_argument("--sample", default=None, choices=("argmax", "full"),
                    help="time the decode plans that sample in the graph (serve's), not "
                         "the logits plans")
    ap.add_argument("--profile", default="",
                    help="batches profiled per kernel kind (default: the largest)")
    ap.add_argument("--full-walk", default="",
                    help="batches also timed with attention walking whole splits (A/B)")
    ap.add_argument("--prefill", default="",
                    help="prefill steps BxT to time and profile, e.g. 1x32,32x8")
    ap.add_argument("--without-passes", default="",
                    help="compile passes to leave out (A/B of a fusion), e.g. rope_scatter")
    ap.add_argument("--set", default="", help="contraction schedule fields every part "
                    "runs under, e.g. INT_MAX_K=0 (llama_gpu.tuning)")
    args = ap.parse_args()
    if args.set:
        from llama_gpu import parse_variants, tuning

        global BASE
        BASE, rest = tuning(parse_variants(args.set)[0], FEATURES)
        if rest:
            raise SystemExit(f"--set: no contraction schedule fields {sorted(rest)}")
    skip = {x for x in args.without_passes.split(",") if x}
    if skip:
        from poot.compiler import pipeline

        unknown = skip - {name for name, _ in pipeline.PASSES}
        if unknown:
            raise SystemExit(f"no such compile passes: {sorted(unknown)}")
        pipeline.PASSES[:] = [(n, run) for n, run in pipeline.PASSES if n not in skip]
    batches = sorted(int(x) for x in args.batches.split(","))
    old = sorted(int(x) for x in args.old_batches.split(",") if x)
    largest = max(batches)
    profile = {int(x) for x in args.profile.split(",") if x} or {largest}
    walk = sorted(int(x) for x in args.full_walk.split(",") if x)
    model = smollm2_model(args.max_seq)
    with scheduled(model.backend, BASE):
        run_parts(model, args, batches, old, profile, walk)
    return 0


def run_parts(model, args, batches, old, profile, walk) -> None:
    largest = max(batches)
    if args.prefill:
        bench_prefill(model, [tuple(int(v) for v in x.split("x"))
                              for x in args.prefill.split(",")], args.max_seq)
    if old:
        with scheduled(model.backend, tuned(0)):
            bench_steps(model, old, args.max_seq, args.pos, "tiled GEMM", {max(old)})
    if walk:
        with full_walk():
            bench_steps(model, walk, args.max_seq, args.pos, "full attention walk", set(walk),
                        args.sample)
    session = bench_steps(model, batches, args.max_seq, args.pos, "rows GEMV", profile,
                          args.sample)
    if args.greedy:
        greedy_same(session, args.greedy)
    if args.rows:
        ctx = session.executor(1, largest).runtime.ctx
        bench_shapes(ctx, Timer(ctx), [int(x) for x in args.rows.split(",")])


if __name__ == "__main__":
    raise SystemExit(main())
