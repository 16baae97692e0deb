"""Packed decode GEMVs (one activation row) by grid size: each (format, N, K) of --shapes
timed under each schedule variant of --variants (';'-separated settings of the
contraction schedule's fields and the constants `llama_gpu.tuning` and `homes_of` find,
'' the defaults), with its workgroups, waves (at the workgroups an SM holds, from the
kernel's registers and shared memory) and GB/s as a fraction of the copy measured in the
same run (launches back to back in one CUDA graph, over weight copies that together
exceed L2, without programmatic dependent launch). Where a step's GEMVs lose to their
bytes, this tells a grid's tail (waves just past a whole number) from what each workgroup
pays once, and a small grid's latency.

    python wave_sweep.py --shapes Q4_K:28672x4096,Q4_K:25344x4096 --variants ";RUN_COLUMNS=1"

With --rows M (a prefill chunk) each shape is timed in TFLOP/s instead: from 64 rows bf16
planes and the warpgroup GEMM (`planes`; "PLANE_MIN_ROWS=100000" turns them off), else
the split tensor-core tiles (`mma.DECODE`) under each tile order of --bands
(`mma.Schedule.band`). --check quantizes the weights from normal values and checks each
result against numpy's product before timing it.

Lines starting with "SUMMARY " are for collecting scripts.
"""
from __future__ import annotations

import argparse
import dataclasses
import traceback

import numpy as np
from bench_gpu import ARCH, copies_for, copy_bandwidths, open_device, random_operand, summary
from llama_gpu import homes_of, parse_variants, tuning, variant_label
from poot.codegen.lower import lower, mma
from poot.dtypes import DType
from poot.formats import PackedWeight, get_format
from poot.ir.ops import PackedContraction
from poot.ir.types import TensorType as T
from poot_cuda.capability import kernel_features

FEATURES = kernel_features(9, 0, ARCH)
TOLERANCE = 1e-4   # --check: relative error against numpy's f32 product of the same weights
SHAPES = ("Q4_K:4096x4096,Q4_K:6144x4096,Q4_K:16896x4096,Q4_K:25344x4096,"
          "Q4_K:28672x4096,Q4_K:33792x4096,Q4_K:4096x14336,Q4_0:6144x4096,"
          "Q4_0:28672x4096,Q4_0:4096x14336")


def occupancy(ctx, launch) -> int:
    """Workgroups of `launch`'s kernel one SM holds."""
    from poot_cuda.driver import check, cu

    return check(cu().cuOccupancyMaxActiveBlocksPerMultiprocessor(
        launch.function, launch.block[0], launch.shared_bytes), "occupancy")


def shape_label(fmt, n, k, tag, rows: int = 1) -> str:
    return f"{fmt} {'' if rows == 1 else f'M={rows} '}N={n} K={k}{tag}"


def bench_shape(ctx, timer, copy_gbs, sms, fmt, n, k, tag, rows: int = 1,
                check: bool = False, schedule=None) -> None:
    from poot_cuda.harness import LoweringRun
    from poot_cuda.kernels import ModuleCache, compile_program
    from poot_cuda.printer import CudaPrinter

    pw = PackedWeight(f"gguf:{fmt}", (n, k))
    ins = [T((rows, k), DType.F32), *[s.type for s in pw.sources()]]
    op = PackedContraction(pw)
    out = op.infer(ins)
    nbytes = sum(t.nbytes for t in ins[1:]) + 4 * rows * (k + n)
    compiled = compile_program(lower(op, ins, out, FEATURES, schedule), CudaPrinter(ARCH))
    modules, rng = ModuleCache(ctx), np.random.default_rng(1)
    if check:
        operands = [rng.standard_normal((rows, k)).astype(np.float32),
                    *(np.asarray(s) for s in get_format(pw.format).quantize(
                        rng.standard_normal((n, k)).astype(np.float32)))]
    else:
        operands = [random_operand(t, rng) for t in ins]
    sets = copies_for(nbytes)
    runs = [LoweringRun(ctx, modules, compiled, operands, out) for _ in range(sets)]
    try:
        if check:
            runs[0].run()
            got = runs[0].result()
            want = operands[0] @ pw.dequantize(operands[1:]).reshape(n, k).T
            err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            if not np.isfinite(got).all() or err > TOLERANCE:
                raise AssertionError(f"relative error {err:.2e} against numpy")
            tag = f"{tag} (checked: {err:.1e})"
        grids = []
        for launch in runs[0].launches:
            held = occupancy(ctx, launch)
            grids.append(f"{launch.grid[0]} wg / {held * sms} = "
                         f"{launch.grid[0] / (held * sms):.2f} waves")

        def enqueue():
            for r in runs:
                r.enqueue()

        ms = timer.graph_ms(enqueue, reps=10, trials=7) / sets
    finally:
        for r in runs:
            r.free()
    gbs = nbytes / ms / 1e6
    label = shape_label(fmt, n, k, tag, rows)
    rate = f"{100 * gbs / copy_gbs:.1f}% of copy" if rows == 1 else \
        f"{2 * rows * n * k / ms / 1e9:.1f} TFLOP/s"
    print(f"{label:42s} {ms * 1e3:8.2f} us {rate}  {'; '.join(grids)}", flush=True)
    summary(label, f"{ms * 1e3:.2f} us, {rate}, {'; '.join(grids)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=SHAPES, help="FMT:NxK,...")
    ap.add_argument("--variants", default="", help="';'-separated schedule settings, e.g. "
                    "';RUN_COLUMNS=1;GROUPS=4'")
    ap.add_argument("--rows", type=int, default=1, help="activation rows (default 1)")
    ap.add_argument("--check", action="store_true", help="weights quantized from normal "
                    "values, each result checked against numpy before it is timed")
    ap.add_argument("--bands", default="", help="with --rows: ','-separated tile orders "
                    "of the split schedule (mma.Schedule.band), e.g. '1,16'")
    args = ap.parse_args()
    from poot_cuda.driver import check, cu

    ctx, timer = open_device()
    copy_gbs = max(copy_bandwidths(ctx, timer).values())
    sms = check(cu().cuDeviceGetAttribute(
        cu().CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, ctx.device), "sms")
    summary("copy ceiling", f"{copy_gbs:.0f} GB/s, {sms} SMs")
    variants = parse_variants(args.variants)
    homes = homes_of({name: 0 for v in variants for name in tuning(v, FEATURES)[1]})
    defaults = {name: getattr(homes[name][0], name) for name in homes}
    for variant in variants:
        schedule, rest = tuning(variant, FEATURES)
        for name, value in {**defaults, **rest}.items():
            for module in homes[name]:
                setattr(module, name, value)
        tag = f" {variant_label(variant)}" if variant else ""
        for shape in args.shapes.split(","):
            fmt, nk = shape.split(":")
            n, k = (int(x) for x in nk.split("x"))
            for band in [int(b) for b in args.bands.split(",") if b] or [None]:
                decode = mma.DECODE
                if band is not None:
                    mma.DECODE = dataclasses.replace(decode, band=band)
                btag = tag if band is None else f"{tag} band={band}"
                try:
                    bench_shape(ctx, timer, copy_gbs, sms, fmt, n, k, btag, args.rows,
                                args.check, schedule)
                except Exception as e:  # noqa: BLE001 - one broken row must not hide others
                    traceback.print_exc()
                    summary(shape_label(fmt, n, k, btag, args.rows),
                            f"FAILED {type(e).__name__}: {e}"[:200])
                finally:
                    mma.DECODE = decode


if __name__ == "__main__":
    main()
