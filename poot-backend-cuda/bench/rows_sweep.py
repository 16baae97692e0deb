"""The rows GEMV's tile on cuda (DotSchedule.rows, ROWS_SCATTERED there: rows per group
over narrow N; columns per group over narrow and wide N; optionally K split over that many
warps a group) swept over SmolLM2's narrow packed Q4_1 shapes at each --rows M on cuda,
each result checked against numpy (batch_step.bench_shapes), then the tile with the least
time per decode step by the shapes' counts in a step (30 layers of Q, O, K, V, gate, up,
down). With --batches, batch_step.py's recorded decode steps (random Q4_1 weights of
SmolLM2's shape) under the first tile, under the rows plan as committed
(`rows_gemv.rows_plan`'s own K split), and under each shape's best tile, profiled by
kernel kind at the largest batch, in this one process (one model, one context).

    python rows_sweep.py --rows 16,32 --tiles 8:1:2:1,8:1:2:2,16:1:2:4 --batches 8,32
A tile R:C:W[:S] is R rows and C columns a group over narrow N, W columns over wide N, and
K split over S warps (S left out: the committed rule). Lines starting with "SUMMARY " are
for collecting scripts.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re

import batch_step
from bench_gpu import Timer, scheduled
from poot.codegen.lower import rows_gemv
from poot.codegen.lower.schedule import RowsRule

#: (N, K) -> launches per SmolLM2 decode step
PER_STEP = {(576, 576): 60, (192, 576): 60, (1536, 576): 60, (576, 1536): 30}


def tiled(schedule, spec: str):
    """`schedule` with the rows GEMV's rule set to `spec` (R:C:W[:S]; S: exactly S warps a
    group, whatever the grid and the accumulators)."""
    parts = [int(x) for x in spec.split(":")]
    rule = dataclasses.replace(schedule.rows, tile=parts[0], columns=parts[1], min_groups=0)
    if len(parts) > 3:
        rule = RowsRule(parts[0], parts[1], split=parts[3], warps=1 << 30, min_trip=1)
    return dataclasses.replace(schedule, rows=rule, rows_wide_columns=parts[2])


@contextlib.contextmanager
def tile(spec: str, backend=None):
    """batch_step's schedule (and `backend`'s, if given) with the rows GEMV's tile `spec`."""
    base = batch_step.BASE
    batch_step.BASE = tiled(base, spec)
    try:
        with scheduled(backend, batch_step.BASE) if backend else contextlib.nullcontext():
            yield
    finally:
        batch_step.BASE = base


@contextlib.contextmanager
def per_shape(best: dict):
    """`rows_gemv.rows_plan` under each (N, K, M)'s best tile where the sweep timed it (a
    choice by shape no one schedule states, so the plan itself is wrapped here)."""
    plan = rows_gemv.rows_plan

    def chosen(p, schedule):
        spec = best.get((p.n, p.k, p.m))
        return plan(p, schedule if spec is None else tiled(schedule, spec))
    rows_gemv.rows_plan = chosen
    try:
        yield
    finally:
        rows_gemv.rows_plan = plan


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="32")
    ap.add_argument("--tiles", default="8:1:2:1,8:1:2:2,8:1:2:4,16:1:2:2,16:1:2:4")
    ap.add_argument("--batches", default="", help="decode steps timed under each schedule")
    ap.add_argument("--max-seq", type=int, default=512)
    args = ap.parse_args()
    specs = args.tiles.split(",")
    rows = [int(x) for x in args.rows.split(",")]
    batches = sorted(int(x) for x in args.batches.split(",") if x)
    steps = lambda label: batch_step.bench_steps(  # noqa: E731
        model, batches, args.max_seq, 100, label, {max(batches)})
    if batches:
        model = batch_step.smollm2_model(args.max_seq)
        with tile(specs[0], model.backend):
            ctx = steps(f"rows tile {specs[0]}").executor(1, max(batches)).runtime.ctx
        steps("rows plan as committed")
    else:
        from poot_cuda.driver import Context

        ctx = Context(0)
    timer = Timer(ctx)
    batch_step.VARIANTS = (("rows GEMV", batch_step.BASE.batch_rows, None),)
    batch_step.SHAPES = tuple(PER_STEP)
    lines: list[str] = []
    batch_step.summary = lambda key, value: (lines.append(f"{key} | {value}"),
                                             print(f"SUMMARY {key} | {value}", flush=True))
    times: dict = {}        # (N, K, M) -> {spec: us}
    for spec in specs:
        del lines[:]
        with tile(spec):
            batch_step.bench_shapes(ctx, timer, rows)
        for line in lines:
            shape = re.search(r"N=(\d+) K=(\d+) M=(\d+)", line)
            us = re.search(r"rows GEMV ([0-9.]+) us", line)
            if shape is not None:
                times.setdefault(tuple(int(x) for x in shape.groups()), {})[spec] = \
                    float(us[1]) if us else float("inf")
    for m in rows:
        for spec in specs:
            total = sum(PER_STEP[n, k] * t[spec] for (n, k, mm), t in times.items() if mm == m)
            print(f"SUMMARY M={m} tile {spec} contractions per step | {total:.0f} us", flush=True)
    best = {shape: min(t, key=t.get) for shape, t in times.items()}
    for shape, spec in best.items():
        print(f"SUMMARY best N={shape[0]} K={shape[1]} M={shape[2]} | {spec} "
              f"{times[shape][spec]:.1f} us (first tile {times[shape][specs[0]]:.1f})",
              flush=True)
    if batches:
        with per_shape(best):
            steps("rows per-shape best")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
