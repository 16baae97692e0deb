"""Q8PackedContraction on CUDA without a GPU (poot.codegen.lower.q8): the backend declares it for
the formats with integer codes, the kernels it lowers to run in the kernel interpreter
against the oracle of the composite at the conformance suite's own inputs and threshold
(rows of decode: the integer GEMV quantizing by QuantizeI8's rule, four codes a word
multiplied by dp4a; rows of prefill: the rows rounded first, then the packed schedules),
and NVRTC builds them for sm_90a."""
from __future__ import annotations

import numpy as np
import pytest
from poot.codegen.interp import run_lowering
from poot.conformance.cases import precision_cases
from poot.conformance.compare import mismatch
from poot.conformance.inputs import draw_all
from poot.ir.ops import Q8PackedContraction
from poot.oracle import apply
from poot_cuda.capability import kernel_features
from poot.codegen.lower.q8 import q8_program

FEATURES = kernel_features(9, 0, "sm_90a")
#: the formats the issue asks for first, at decode and past the GEMV's rows
FORMATS = ("gguf:Q4_0", "gguf:Q8_0", "gguf:Q4_K")
CASES = {c.id: c for c in precision_cases() if c.key == "Q8PackedContraction"}


def _lowered(case):
    (eqn,) = case.graph.eqns()
    types = [case.graph.type_of(x.id) for x in eqn.inputs]
    out = case.graph.type_of(eqn.out)
    return eqn.op, types, out, q8_program(eqn.op, types, out, FEATURES)


def _case_ids():
    return [i for i in CASES if i.split("-")[1] in FORMATS and not i.endswith("-3x256")]


@pytest.mark.parametrize("case_id", _case_ids())
def test_q8_kernels_match_the_oracle_in_the_interpreter(case_id):
    case = CASES[case_id]
    op, types, out, program = _lowered(case)
    arrays = draw_all(np.random.default_rng(7), case.args, case.fixed)
    want = np.asarray(apply(op, arrays, types, out)).reshape(out.shape)
    got = run_lowering(program, arrays, out)
    assert mismatch(want, got, case.exact, case.tol) is None, case_id
    names = [k.name.rsplit("_", 1)[-1] for k in program.kernels]
    rows = types[0].shape[0]
    if rows == 1:          # the integer GEMV alone: the rows quantized in its workgroups
        assert len(program.kernels) == 1 and not program.scratch, names
    else:                  # the rows rounded apart, then the packed contraction reads them
        assert names[0] == "q8" and program.scratch[0].name == "q8_rows", names


@pytest.mark.parametrize("fmt,n,k", [("gguf:Q4_0", 512, 4096), ("gguf:Q4_K", 256, 14336)],
                         ids=["staged-two-columns", "k-split"])
def test_q8_gemv_at_the_8b_shapes_matches_the_oracle(fmt, n, k):
    """The integer GEMV's other walks: weight tiles staged two columns a group (an 8B
    projection's K; the wide-N and fewest-workgroups thresholds lowered to this N), and
    K in parts summed by a second kernel (the 8B down projection's K)."""
    from dataclasses import replace

    from poot.codegen.lower.schedule import dot_schedule
    from poot.conformance.cases import threshold
    from poot.conformance.inputs import Arg
    from poot.dtypes import DType
    from poot.formats import PackedWeight
    from poot.ir.types import TensorType

    pw = PackedWeight(fmt, (n, k))
    op = Q8PackedContraction(pw)
    args = [Arg(TensorType((1, k), DType.F32))] + [
        Arg(s.type, ("packed", pw, i)) for i, s in enumerate(pw.sources())]
    types = [a.type for a in args]
    out = op.infer(types)
    program = q8_program(op, types, out, FEATURES,
                         replace(dot_schedule(FEATURES), int_wide_n=n, int_min_groups=1))
    assert len(program.kernels) == (2 if k > 8192 else 1)
    arrays = draw_all(np.random.default_rng(3), args)
    want = np.asarray(apply(op, arrays, types, out)).reshape(out.shape)
    got = run_lowering(program, arrays, out)
    assert mismatch(want, got, False, threshold("compose", DType.F32)) is None


def test_the_backend_declares_the_formats_with_integer_codes():
    from poot_cuda.backend import CudaBackend

    backend = CudaBackend()
    table = backend.capabilities(backend.compile_only_device("sm_90a"))
    declared = table.lowers("Q8PackedContraction")
    assert set(FORMATS) <= declared
    assert declared == {c.dtype for c in CASES.values()}   # every integer-coded format


def test_nvrtc_builds_the_integer_gemv_of_int8_rows(tmp_path, monkeypatch):
    """The 8B down projection's shape: K split into parts, the parts' sum after."""
    from poot.dtypes import DType
    from poot.formats import PackedWeight
    from poot.ir.types import TensorType
    from poot_cuda.compiler import compile_cubin
    from poot_cuda.printer import CudaPrinter

    monkeypatch.setenv("POOT_CACHE", str(tmp_path))
    pw = PackedWeight("gguf:Q4_K", (512, 14336))
    op = Q8PackedContraction(pw)
    ins = [TensorType((1, 14336), DType.F32), *[s.type for s in pw.sources()]]
    program = q8_program(op, ins, op.infer(ins), FEATURES)
    assert [k.name.rsplit("_", 1)[-1] for k in program.kernels][1:] == ["parts"]
    src = CudaPrinter("sm_90a").source(program.kernels[0])
    assert "poot_dp4a(" in src and "poot_dp2a" not in src.split("extern")[-1]   # int8 codes
    for kernel in program.kernels:
        assert compile_cubin(CudaPrinter("sm_90a").source(kernel), kernel.name,
                             "sm_90a")[:4] == b"\x7fELF"
