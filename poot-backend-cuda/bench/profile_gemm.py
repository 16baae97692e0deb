"""One bf16 4096^3 MatMul through the tensor-core schedule, launched once, for Nsight
Compute to read (stall reasons, pipe use, memory traffic):

    ncu --clock-control none --kernel-name regex:poot_matmul --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats python3 profile_gemm.py
"""
from __future__ import annotations

import numpy as np
from poot.codegen.lower import lower
from poot.dtypes import DType
from poot.ir.ops import MatMul
from poot.ir.types import TensorType as T
from poot_cuda.capability import kernel_features
from poot_cuda.driver import Context
from poot_cuda.harness import LoweringRun
from poot_cuda.kernels import ModuleCache, compile_lowering
from poot_cuda.printer import CudaPrinter


def main(n: int = 4096) -> None:
    ins = [T((n, n), DType.BF16), T((n, n), DType.BF16)]
    out = MatMul().infer(ins)
    compiled = compile_lowering(lower(MatMul(), ins, out, kernel_features(9, 0)),
                                CudaPrinter("sm_90"))
    rng = np.random.default_rng(0)
    operands = [rng.standard_normal(t.shape, np.float32).astype(t.dtype.numpy) for t in ins]
    ctx = Context(0)
    run = LoweringRun(ctx, ModuleCache(ctx), compiled, operands, out)
    run.run()
    print("ran", compiled.kernels[0].kernel.name, compiled.kernels[0].dynamic_shared, "B smem")


if __name__ == "__main__":
    main()
