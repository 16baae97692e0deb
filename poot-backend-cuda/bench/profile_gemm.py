"""One benchmark kernel launched once, for Nsight Compute to read (stall reasons, pipe
use, memory traffic): the bf16 4096^3 MatMul (tensor-core schedule) or, with an argument
naming a row of bench_gpu.py (e.g. "packed Q4_0 GEMV N=14336 K=4096"), that kernel:

    ncu --clock-control none --kernel-name regex:poot_ --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats python3 profile_gemm.py [ROW]
"""
from __future__ import annotations

import numpy as np
from poot.codegen.lower import lower
from poot.dtypes import DType
from poot.ir.ops import MatMul
from poot.ir.types import TensorType as T
from poot_cuda.capability import arch_of, kernel_features
from poot_cuda.driver import Context
from poot_cuda.harness import LoweringRun
from poot_cuda.kernels import ModuleCache, compile_program
from poot_cuda.printer import CudaPrinter


def main(row: str | None = None, n: int = 4096) -> None:
    op, ins = MatMul(), [T((n, n), DType.BF16), T((n, n), DType.BF16)]
    if row is not None:
        from bench_gpu import ops_to_bench

        bench = next(b for b in ops_to_bench() if b.label == row)
        op, ins = bench.op, bench.ins
    out = op.infer(ins)
    compiled = compile_program(lower(op, ins, out, kernel_features(9, 0, arch_of(9, 0))),
                               CudaPrinter(arch_of(9, 0)))
    from bench_gpu import random_operand

    rng = np.random.default_rng(0)
    operands = [random_operand(t, rng) for t in ins]
    ctx = Context(0)
    run = LoweringRun(ctx, ModuleCache(ctx), compiled, operands, out)
    run.run()
    print("ran", compiled.kernels[0].kernel.name, compiled.kernels[0].dynamic_shared, "B smem")


if __name__ == "__main__":
    import sys

    main(sys.argv[1] if len(sys.argv) > 1 else None)
