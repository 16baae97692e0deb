"""The split-operand tensor-core schedule (poot.codegen.lower.mma with
mma_operands.SplitTiles) against the FMA schedules it replaces, on SmolLM2's packed Q4_1
shapes at --rows rows on cuda (each result's NMSE against numpy's float64 product
printed), then batch_step.py's recorded decode steps (random Q4_1 weights of SmolLM2's
shape) under the FMA schedules ("fma"), the module's choice ("chosen") and the fastest
variant of each shape ("best"), profiled by kernel kind at the largest batch.

    python split_sweep.py --rows 8,16,32,64 --tiles 32:128:4,64:128:4 --batches 1,8,32
    python split_sweep.py --warm 0/6 ...     # compile-only share 0 of 6 (NVRTC disk cache)

"rows" is the rows GEMV past its 32 rows (DotSchedule.batch_rows lifted), timed at M > 32.
A tile bn:bk:warps[:bm] is a split schedule of bn columns, K steps of bk and `warps` warps
(rows tiled by bm, or 16, 32 or 64 as M needs, warps_m = rows / 32, the rest splitting K), timed
at --tile-rows only. Lines starting with "SUMMARY " are for collecting scripts.
"""
from __future__ import annotations

import argparse
import contextlib
import traceback

import numpy as np

SHAPES = ((576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576))   # (N, K)
#: (N, K) -> launches per SmolLM2 decode step
PER_STEP = {(576, 576): 60, (192, 576): 60, (1536, 576): 60, (576, 1536): 30, (49152, 576): 1}


def summary(key: str, value) -> None:
    print(f"SUMMARY {key} | {value}", flush=True)


def tile(name: str, rows: int):
    """The split schedule a tile name bn:bk:warps[:bm] stands for at `rows` rows (bm by
    default 16, 32 or 64 as the rows need)."""
    from poot.codegen.lower import mma

    bn, bk, warps, *bm = (int(x) for x in name.split(":"))
    bm = bm[0] if bm else 16 if rows <= 16 else 32 if rows <= 32 else 64
    wm = max(1, bm // 32)
    return mma.Schedule(bm=bm, bn=bn, bk=bk, warps_m=wm, warps_n=1, warps_k=warps // wm)


@contextlib.contextmanager
def variant(name: str, best: dict | None = None):
    """Under "fma" no split schedule, "rows" none and the rows GEMV at any M, "chosen"
    the module's, a tile name that one, "best" the fastest of each (N, K, M) in `best`
    (name by shape; others as chosen). Yields the contraction schedule to lower with
    (None: the target's default)."""
    from dataclasses import replace

    from bench_gpu import FEATURES
    from poot.codegen.lower import mma
    from poot.codegen.lower.schedule import dot_schedule

    chosen = mma.decode_schedule

    def pick(p, features, name=name):
        if name == "best":
            name = (best or {}).get((p.n, p.k, p.m), "chosen")
        if name in ("fma", "rows"):
            return None
        if name == "chosen":
            return chosen(p, features)
        sc = tile(name, p.m)
        return sc if mma.SplitTiles.fits(sc, p) else None
    mma.decode_schedule = pick
    try:
        yield replace(dot_schedule(FEATURES), batch_rows=1 << 30) if name == "rows" else None
    finally:
        mma.decode_schedule = chosen


def jobs(rows_list, tiles, tile_rows):
    for n, k in SHAPES:
        for m in rows_list:
            names = ["fma", "chosen"] + (tiles if m in tile_rows else [])
            names += ["rows"] if m > 32 else []
            for name in names:
                yield n, k, m, name


def problem(n, k, m):
    from poot.dtypes import DType
    from poot.formats import PackedWeight
    from poot.ir.ops import PackedContraction
    from poot.ir.types import TensorType as T

    pw = PackedWeight("gguf:Q4_1", (n, k))
    ins = [T((m, k), DType.F32), *[s.type for s in pw.sources()]]
    op = PackedContraction(pw)
    return pw, op, ins, op.infer(ins)


def compiled(n, k, m, name):
    from bench_gpu import FEATURES
    from poot.codegen.lower import lower
    from poot_cuda.kernels import compile_program
    from poot_cuda.printer import CudaPrinter

    _, op, ins, out = problem(n, k, m)
    with variant(name) as schedule:
        return compile_program(lower(op, ins, out, FEATURES, schedule), CudaPrinter("sm_90"))


def bench_shapes(ctx, timer, rows_list, tiles, tile_rows) -> dict:
    """Times every job; returns the fastest variant by (N, K, M)."""
    from batch_step import q4_1_blocks
    from poot_cuda.harness import LoweringRun
    from poot_cuda.kernels import ModuleCache

    modules, rng = ModuleCache(ctx), np.random.default_rng(1)
    totals: dict[tuple[int, str], float] = {}
    data, times = {}, {}
    for n, k, m, name in jobs(rows_list, tiles, tile_rows):
        if (n, k) not in data:
            pw = problem(n, k, 1)[0]
            raw = q4_1_blocks(rng, n, k)
            data[(n, k)] = raw, np.asarray(pw.dequantize([raw]), np.float64).reshape(n, k)
        raw, dense = data[(n, k)]
        a = rng.standard_normal((m, k)).astype(np.float32)
        want = a.astype(np.float64) @ dense.T
        run = None
        try:
            prog = compiled(n, k, m, name)
            grid = [ck.kernel.grid for ck in prog.kernels]
            run = LoweringRun(ctx, modules, prog, [a, raw], problem(n, k, m)[3])
            run.run()
            got = run.result().astype(np.float64)
            nmse = float(np.sum((got - want) ** 2) / np.sum(want ** 2))
            us = timer.graph_ms(run.enqueue, reps=20, trials=5) * 1e3
            totals[(m, name)] = totals.get((m, name), 0.0) + PER_STEP[(n, k)] * us
            times.setdefault((n, k, m), {})[name] = us
            summary(f"Q4_1 N={n} K={k} M={m} {name}", f"{us:.1f} us, NMSE {nmse:.1e}, "
                    f"grid {grid}")
        except Exception as e:  # noqa: BLE001 - one broken variant must not hide others
            traceback.print_exc()
            totals[(m, name)] = float("inf")
            summary(f"Q4_1 N={n} K={k} M={m} {name}", f"FAILED {type(e).__name__}: {e}"[:160])
        finally:
            if run is not None:
                run.free()
    for (m, name), total in sorted(totals.items()):
        summary(f"contractions per step M={m} {name}", f"{total:.0f} us")
    best = {key: min(us, key=us.get) for key, us in times.items()}
    for m in rows_list:
        total = sum(PER_STEP[key[:2]] * times[key][name] for key, name in best.items()
                    if key[2] == m)
        summary(f"contractions per step M={m} best", f"{total:.0f} us: " + ", ".join(
            f"{n}x{k} {name}" for (n, k, mm), name in best.items() if mm == m))
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default, about in (("--rows", "8,16,32,64", "M of the shapes"),
                                 ("--tiles", "", "bn:bk:warps split schedules"),
                                 ("--tile-rows", "32", "the M the tiles run at"),
                                 ("--batches", "", "decode steps under fma and chosen"),
                                 ("--warm", "", "i/n: compile share i of n only (no GPU)")):
        ap.add_argument(flag, default=default, help=about)
    ap.add_argument("--max-seq", type=int, default=512)
    args = ap.parse_args()
    rows = [int(x) for x in args.rows.split(",") if x]
    tiles = [x for x in args.tiles.split(",") if x]
    tile_rows = {int(x) for x in args.tile_rows.split(",") if x}
    if args.warm:
        i, n = (int(x) for x in args.warm.split("/"))
        for j, job in enumerate(jobs(rows, tiles, tile_rows)):
            if j % n == i:
                compiled(*job)
        return 0
    import batch_step
    from bench_gpu import Timer
    from poot_cuda.driver import Context

    batches = sorted(int(x) for x in args.batches.split(",") if x)
    best = {}
    if rows:        # the shapes first: their best variants are a step variant
        ctx = Context(0)
        best = bench_shapes(ctx, Timer(ctx), rows, tiles, tile_rows)
        del ctx
    if batches:
        model = batch_step.smollm2_model(args.max_seq)
        for name in ("fma", "chosen", "best"):
            with variant(name, best=best):
                batch_step.bench_steps(model, batches, args.max_seq, 100, name,
                                       {max(batches)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
