"""poot.codegen: backend-neutral kernel programs (the kernel seam; docs/codegen.md).

- `expr`: scalar expressions (the IR's Unary/Binary/Select/Cast vocabulary, loads, bitcasts)
- `program`: Kernel, buffers, statements, cooperative reductions, KernelProgram
- `builder`: KernelBuilder, programs written with Python blocks
- `lower`: one planned eqn -> KernelProgram (`lower(op, ins, out)`)
- `interp`: the numpy interpreter that checks programs without a GPU
- `cstyle`: the C-like printer CUDA and HIP share
- `cases`: the catalog of lowering cases every backend can run
"""
