"""The warpgroup GEMM schedule (poot.codegen.lower.wgmma) on the GPU.

1. Results against numpy (f32 products of the same 16-bit operands) on edge shapes: M,
   N, K not multiples of the tile, batches, a broadcast weight, F16; each under both tile
   widths and checked to have lowered to the warpgroup kernel.
2. MatMul bf16 x bf16 -> bf16 at n^3 (default 4096): TFLOP/s of the warpgroup schedule's
   variants and of the mma.sync schedule (the target without WGMMA), each checked against
   numpy, against torch.matmul in the same process. CUDA events around graph replays,
   median of trials.
3. The default schedule at other shapes (`SHAPES`, M x K x N) against torch.matmul on the
   same operands, checked against torch's f32 product of them; with --schedules, each
   of those schedules too (fields of `wgmma.Schedule`: "band=8;bn=128,band=8").
Lines starting with "SUMMARY " are the results.

    python wgmma_gemm.py [--n 4096] [--no-torch] [--quick] [--schedules "band=8;..."]
"""
from __future__ import annotations

import argparse
import traceback

import numpy as np
from bench_gpu import (
    ARCH,
    FEATURES,
    Timer,
    random_operand,
    summary,
    torch_ceilings,
    torch_event_ms,
)
from poot.codegen.lower import lower, wgmma
from poot.codegen.target import TMA, WGMMA
from poot.dtypes import DType
from poot.ir.ops import MatMul
from poot.ir.types import TensorType as T
from poot_cuda.driver import Context
from poot_cuda.harness import LoweringRun
from poot_cuda.kernels import ModuleCache, compile_program
from poot_cuda.printer import CudaPrinter

BF16, F16 = DType.BF16, DType.F16
#: (a shape, w shape, dtype): edges of M / N / K, batches, a broadcast weight, F16
CHECKS = [((200, 136), (136, 520), BF16), ((64, 64), (64, 64), BF16),
          ((129, 72), (72, 264), BF16), ((333, 1024), (1024, 2048), BF16),
          ((1000, 4096), (4096, 1000), BF16), ((2, 130, 128), (2, 128, 264), BF16),
          ((3, 96, 192), (192, 136), BF16), ((256, 520), (520, 384), F16)]
SCHEDULES = [wgmma.SCHEDULE, wgmma.NARROW, wgmma.Schedule(stages=3, band=16),
             wgmma.Schedule(bm=64, bn=256, stages=4, band=16)]
#: M x K x N timed against torch.matmul: large, model-shaped (Llama-3-8B FFN at 2048
#: tokens), and too few tiles for one wave
SHAPES = [(8192, 8192, 8192), (2048, 4096, 14336), (2048, 14336, 4096), (1024, 4096, 4096),
          (512, 4096, 4096)]
TOLERANCE = 1e-2     # relative Frobenius error: bf16 outputs round at 2^-8


def compiled_for(op, ins, features, schedule=None):
    """`op` compiled, every warpgroup problem under `schedule` if given."""
    saved = wgmma.SCHEDULE, wgmma.NARROW
    wgmma.SCHEDULE, wgmma.NARROW = (schedule, schedule) if schedule else saved
    try:
        return compile_program(lower(op, ins, op.infer(ins), features), CudaPrinter(ARCH))
    finally:
        wgmma.SCHEDULE, wgmma.NARROW = saved


def checked(ctx, modules, compiled, operands, out) -> tuple[LoweringRun, float]:
    """The bound run and its result's relative error against numpy (raises past
    TOLERANCE or on non-finite values)."""
    run = LoweringRun(ctx, modules, compiled, operands, out)
    run.run()
    got = run.result().astype(np.float32)
    want = operands[0].astype(np.float32) @ operands[1].astype(np.float32)
    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    if not np.isfinite(got).all() or err > TOLERANCE:
        run.free()
        raise AssertionError(f"relative error {err:.2e}")
    return run, err


def check_shapes(ctx, modules, rng) -> None:
    """Each edge shape under both tile widths the lowering picks from (`schedule_for`)."""
    for (a, w, dtype), sc in ((c, sc) for c in CHECKS for sc in (wgmma.SCHEDULE, wgmma.NARROW)):
        label = f"check {dtype.value} {a} @ {w} bn={sc.bn}"
        ins = [T(a, dtype), T(w, dtype)]
        try:
            compiled = compiled_for(MatMul(), ins, FEATURES, sc)
            if not compiled.kernels[0].kernel.tensor_maps:
                raise AssertionError("did not lower to the warpgroup schedule")
            operands = [random_operand(t, rng) for t in ins]
            run, err = checked(ctx, modules, compiled, operands, MatMul().infer(ins))
            run.free()
            summary(label, f"ok, relative error {err:.2e}")
        except Exception as e:  # noqa: BLE001 - report every shape
            traceback.print_exc()
            summary(label, f"FAILED {type(e).__name__}: {e}"[:200])


def bench(ctx, modules, rng, n: int, torch_tflops: float | None, quick: bool,
          schedules) -> None:
    ins = [T((n, n), BF16), T((n, n), BF16)]
    operands = [random_operand(t, rng) for t in ins]
    out, timer, flops = MatMul().infer(ins), Timer(ctx), 2 * n ** 3
    variants = [(f"wgmma {s}", FEATURES, s)
                for s in [*SCHEDULES[:1 if quick else None], *schedules]]
    if not quick:
        variants.append(("mma.sync (no WGMMA/TMA)", FEATURES - {WGMMA, TMA}, None))
    for label, features, schedule in variants:
        run = None
        try:
            compiled = compiled_for(MatMul(), ins, features, schedule)
            run, err = checked(ctx, modules, compiled, operands, out)
            ms = timer.graph_ms(run.enqueue, reps=10, trials=7)
        except Exception as e:  # noqa: BLE001 - one broken variant must not hide the others
            traceback.print_exc()
            summary(f"bf16 GEMM {n}^3 {label}", f"FAILED {type(e).__name__}: {e}"[:200])
            continue
        finally:
            if run is not None:
                run.free()
        tflops = flops / ms / 1e9
        note = f"{100 * tflops / torch_tflops:.1f}% of torch.matmul" if torch_tflops else ""
        summary(f"bf16 GEMM {n}^3 {label}",
                f"{ms * 1e3:.1f} us, {tflops:.1f} TFLOP/s {note} (error {err:.1e})")


def parse_schedules(text: str) -> list[wgmma.Schedule]:
    """"band=8;bn=128,band=8" -> the default schedule with those fields replaced."""
    return [wgmma.Schedule(**{k: int(v) for k, v in (f.split("=") for f in spec.split(","))})
            for spec in text.split(";") if spec.strip()]


def against_torch(ctx, modules, rng, schedules) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    timer = Timer(ctx)
    for (m, k, n), schedule in ((s, sc) for s in SHAPES for sc in [None, *schedules]):
        label = f"bf16 GEMM {m}x{k}x{n}" + (f" {schedule}" if schedule else "")
        ins = [T((m, k), BF16), T((k, n), BF16)]
        operands = [random_operand(t, rng) for t in ins]
        run = None
        try:
            compiled = compiled_for(MatMul(), ins, FEATURES, schedule)
            run = LoweringRun(ctx, modules, compiled, operands, MatMul().infer(ins))
            run.run()
            got = torch.from_numpy(run.result().astype(np.float32)).cuda()
            a, w = (torch.from_numpy(x.view(np.int16)).cuda().view(torch.bfloat16)
                    for x in operands)
            want = a.float() @ w.float()
            err = float(torch.linalg.norm(got - want) / torch.linalg.norm(want))
            if not err <= TOLERANCE:
                raise AssertionError(f"relative error {err:.2e}")
            del got, want
            ms = timer.graph_ms(run.enqueue, reps=5, trials=5)
            torch_ms = torch_event_ms(lambda a=a, w=w: a @ w, 10, 5)
        except Exception as e:  # noqa: BLE001 - report every shape
            traceback.print_exc()
            summary(label, f"FAILED {type(e).__name__}: {e}"[:200])
            continue
        finally:
            if run is not None:
                run.free()
            torch.cuda.empty_cache()
        tflops, torch_tflops = 2 * m * k * n / ms / 1e9, 2 * m * k * n / torch_ms / 1e9
        summary(label, f"{ms * 1e3:.1f} us, {tflops:.1f} TFLOP/s = "
                       f"{100 * tflops / torch_tflops:.1f}% of torch.matmul's {torch_tflops:.1f} "
                       f"(error {err:.1e})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--quick", action="store_true", help="time the default schedule only")
    ap.add_argument("--schedules", default="",
                    help="';'-separated schedules also timed at the other shapes")
    args = ap.parse_args()
    torch_tflops = None
    if not args.no_torch:
        torch_tflops = torch_ceilings()["torch bf16 matmul 4096^3 TFLOP/s"]
        summary("torch bf16 matmul 4096^3", f"{torch_tflops:.1f} TFLOP/s")
    ctx = Context(0)
    modules, rng = ModuleCache(ctx), np.random.default_rng(3)
    check_shapes(ctx, modules, rng)
    schedules = parse_schedules(args.schedules)
    bench(ctx, modules, rng, args.n, torch_tflops, args.quick, schedules)
    if not args.no_torch:
        against_torch(ctx, modules, rng, schedules)


if __name__ == "__main__":
    main()
