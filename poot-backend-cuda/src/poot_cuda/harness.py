"""Run one compiled lowering on numpy operands on a GPU (tests, benchmarks).

Mirrors poot.codegen.interp.run_lowering: operands are uploaded as the bytes
their buffers view, the output starts as a poison pattern (or a copy of the
operand an in-place kernel updates), and the result comes back as an array.
"""
from __future__ import annotations

import numpy as np
from poot.codegen.interp import operand_words
from poot.codegen.program import OUT
from poot.ir.types import TensorType

from poot_cuda.driver import Context, Graph
from poot_cuda.kernels import CompiledProgram, ModuleCache, bind


class LoweringRun:
    """Buffers and launches of one lowering, bound once; `run()` launches them."""

    def __init__(self, ctx: Context, modules: ModuleCache, compiled: CompiledProgram,
                 operands, out: TensorType):
        self.ctx, self.out = ctx, out
        self._owned: list[int] = []
        ptrs: dict[int, int] = {}
        lowering = compiled.program
        for ck in compiled.kernels:
            for b in ck.kernel.buffers:
                if b.operand is None or b.operand in ptrs or b.operand == OUT:
                    continue
                ptrs[b.operand] = self._upload(operand_words(operands[b.operand], b))
        if lowering.alias is not None:
            start = np.ascontiguousarray(operands[lowering.alias]).astype(out.dtype.numpy)
        else:
            start = np.full(out.nbytes, 0xFF, np.uint8)
        ptrs[OUT] = self._upload(start)
        scratch = {b.name: self._alloc(b.nbytes) for b in lowering.scratch}
        self.launches = bind(compiled, modules, ptrs, scratch)
        self.out_ptr = ptrs[OUT]
        self.graph: Graph | None = None

    def _alloc(self, nbytes: int) -> int:
        ptr = self.ctx.alloc(nbytes)
        self._owned.append(ptr)
        return ptr

    def _upload(self, array: np.ndarray) -> int:
        ptr = self._alloc(array.nbytes)
        self.ctx.write(ptr, array)
        return ptr

    def enqueue(self) -> None:
        for launch in self.launches:
            launch(self.ctx)

    def run(self, graph: bool = False) -> None:
        if graph:
            if self.graph is None:
                self.graph = Graph(self.ctx, self.enqueue)
            self.graph.launch()
        else:
            self.enqueue()
        self.ctx.sync()

    def result(self) -> np.ndarray:
        raw = self.ctx.read(self.out_ptr, self.out.nbytes)
        return raw.view(self.out.dtype.numpy).reshape(self.out.shape)

    def free(self) -> None:
        for p in self._owned:
            self.ctx.free(p)
        self._owned.clear()
