"""The rows GEMV's tile (rows per group over narrow N; columns per group over narrow and
wide N) swept over SmolLM2's packed Q4_1 shapes at M rows on cuda, each result checked
against numpy (batch_step.bench_shapes), then the tile with the least time per decode step by the
shapes' counts in a step (30 layers of Q, O, K, V, gate, up, down, and the head). With
--batches, batch_step.py's recorded decode steps (random Q4_1 weights of SmolLM2's shape)
under the first tile and then the best, profiled by kernel kind at the largest batch, in
this one process (one model, one context).

    python rows_sweep.py --rows 32 --tiles 32:1:2,8:1:2,8:2:4 --batches 1,32
Lines starting with "SUMMARY " are for collecting scripts; the last is "BEST tile:cols:wide".
"""
from __future__ import annotations

import argparse
import re

import batch_step
from bench_gpu import Timer
from poot.codegen.lower import dot

#: (N, K) -> launches per SmolLM2 decode step
PER_STEP = {(576, 576): 60, (192, 576): 60, (1536, 576): 60, (576, 1536): 30, (49152, 576): 1}


def set_tile(tile: int, cols: int, wide: int) -> None:
    dot.ROWS_TILE, dot.ROWS_COLUMNS, dot.ROWS_WIDE_COLUMNS = tile, cols, wide


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--tiles", default="32:1:2,8:1:2,8:2:4,8:4:4,4:1:2,4:2:4,16:2:4")
    ap.add_argument("--batches", default="", help="decode steps timed under both tiles")
    ap.add_argument("--max-seq", type=int, default=512)
    args = ap.parse_args()
    specs = args.tiles.split(",")
    batches = sorted(int(x) for x in args.batches.split(",") if x)
    steps = lambda spec: batch_step.bench_steps(  # noqa: E731
        model, batches, args.max_seq, 100, f"rows tile {spec}", {max(batches)})
    if batches:
        model = batch_step.smollm2_model(args.max_seq)
        set_tile(*(int(x) for x in specs[0].split(":")))
        ctx = steps(specs[0]).executor(1, max(batches)).runtime.ctx
    else:
        from poot_cuda.driver import Context

        ctx = Context(0)
    timer = Timer(ctx)
    batch_step.VARIANTS = (("rows GEMV", batch_step.dot.BATCH_ROWS, None),)
    lines: list[str] = []
    batch_step.summary = lambda key, value: (lines.append(f"{key} | {value}"),
                                             print(f"SUMMARY {key} | {value}", flush=True))
    totals = {}
    for spec in specs:
        tile, cols, wide = (int(x) for x in spec.split(":"))
        set_tile(tile, cols, wide)
        print(f"SUMMARY tile {spec} | rows {tile}, columns {cols} (narrow) {wide} (wide)",
              flush=True)
        del lines[:]
        batch_step.bench_shapes(ctx, timer, [args.rows])
        total = 0.0
        for line in lines:
            shape = re.search(r"N=(\d+) K=(\d+)", line)
            us = re.search(r"rows GEMV ([0-9.]+) us", line)
            if shape is None or us is None:
                total = float("inf")        # a failed variant is never the best
                continue
            total += PER_STEP[(int(shape[1]), int(shape[2]))] * float(us[1])
        totals[spec] = total
        print(f"SUMMARY tile {spec} contractions per step | {total:.0f} us", flush=True)
    best = min(totals, key=totals.get)
    print(f"BEST {best}", flush=True)
    if batches and best != specs[0]:
        set_tile(*(int(x) for x in best.split(":")))
        steps(best)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
