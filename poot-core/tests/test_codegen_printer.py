"""The printer core and its dialects.

A C-family dialect is a small subclass: `HostC` below (plain C, one thread per call) is
printed from the shared lowerings, compiled by the system C compiler, run thread by
thread and compared with the kernel interpreter.
"""
from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest
from poot.codegen.cases import all_cases, mismatch
from poot.codegen.cstyle import CPrinter
from poot.codegen.expr import Bin, Var
from poot.codegen.interp import operand_words, run_lowering
from poot.codegen.lower import lower
from poot.codegen.program import OUT
from poot.dtypes import DType
from poot.ir.ops import BinaryOp

F32, I32, U32 = DType.F32, DType.I32, DType.U32


class HostC(CPrinter):
    """Plain C for the host: thread (group gx, lane lx) is one call of the kernel."""

    backend, device = "host-c", "cc"
    supported = frozenset({F32, I32, U32})

    def header(self, kernel):
        return "#include <math.h>"

    def signature(self, k):
        params = ", ".join(f"{'' if b.access.writable else 'const '}"
                           f"{self.type_name(b.dtype)}* {b.name}" for b in k.buffers)
        return f"void {k.name}(int gx, int lx, {params})"

    def builtin(self, kind, axis, k):
        if axis:
            return "0"
        return {"local": "lx", "index": "lx", "group": "gx",
                "global": f"(gx * {k.workgroup[0]} + lx)"}[kind]

    def bitcast(self, src, dst, text):
        return (f"({{ union {{ {self.type_name(src)} s; {self.type_name(dst)} d; }} "
                f"b_ = {{ .s = ({text}) }}; b_.d; }})")

    def clz(self, text):
        return f"((unsigned int)({text}) == 0u ? 32 : __builtin_clz({text}))"


def _run_c(kernel, source: str, arrays: dict, tmp_path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on PATH (cc, gcc)")
    src, lib = tmp_path / f"{kernel.name}.c", tmp_path / f"{kernel.name}.so"
    src.write_text(source)
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(lib), str(src), "-lm"],
                   check=True, capture_output=True)
    fn = getattr(ctypes.CDLL(str(lib)), kernel.name)
    ptrs = [arrays[b.name].ctypes.data_as(ctypes.c_void_p) for b in kernel.buffers]
    for g in range(kernel.groups):
        for lane in range(kernel.threads_per_group):
            fn(g, lane, *ptrs)


POINTWISE = [c for c in all_cases() if c.id.split("-")[0] in ("binary", "unary")
             and c.id.rsplit("-", 1)[1] in ("f32", "i32", "u32")]


@pytest.mark.parametrize("case", POINTWISE, ids=lambda c: c.id)
def test_a_c_dialect_is_a_small_subclass(case, tmp_path):
    program = lower(case.op, case.ins, case.out())
    (kernel,) = program.kernels
    operands = case.make(np.random.default_rng(0))
    out = case.out()
    want = run_lowering(program, operands, out)
    arrays = {f"in{i}": np.ascontiguousarray(operand_words(a, b)) for i, a in enumerate(operands)
              for b in kernel.buffers if b.operand == i}
    arrays["out"] = np.zeros(out.shape, out.dtype.numpy)
    _run_c(kernel, HostC().source(kernel), arrays, tmp_path)
    assert kernel.buffer("out").operand == OUT
    err = mismatch(arrays["out"], want, case.tol)
    assert err is None, f"{case.id}: {err}"


def test_min_is_one_row_per_printer():
    from poot.codegen.scalar import BINARY, UNARY
    from poot.ir.ops import UnaryOp

    assert set(BINARY) == set(BinaryOp) and set(UNARY) == set(UnaryOp) - {UnaryOp.Clz}
    x, y = Var("x", F32), Var("y", F32)
    assert HostC().expr(Bin(BinaryOp.Min, x, y)) == "poot_fmin(x, y)"


def test_a_dialect_without_reduce_scatter_refuses_it():
    """REDUCE_SCATTER is a target feature: a printer that does not declare it refuses the
    statement by name instead of printing something else."""
    from poot.codegen.target import REDUCE_SCATTER
    from poot.errors import UnsupportedOp
    from poot.ir.ops import DenseContraction
    from poot.ir.types import TensorType as T

    ins = [T((16, 64), F32), T((8, 64), F32)]
    op = DenseContraction()
    (kernel,) = lower(op, ins, op.infer(ins), frozenset({REDUCE_SCATTER})).kernels
    with pytest.raises(UnsupportedOp, match="CoopReduceScatter"):
        HostC().source(kernel)
