"""CI's compile check (no GPU): every kernel the conformance suite and the SmolLM2 plan
generate compiles to CUBIN for sm_90 with NVRTC.

Each case of the conformance suite (its op cases and its model cases) is planned for a
compile-only sm_90 device, exactly as the suite plans it on a GPU: a case the device
declares must plan with every kernel compiled to CUBIN; an undeclared one must be refused
at plan time with the typed LoweringError (a capability refusal, not an NVRTC failure).
Plans are made inside one `compiler.batch()`, so the kernels compile in a few large NVRTC
programs; each kernel's CUBIN must then hold its entry. Then the real SmolLM2-135M decode
step (1 token) and its 32-token prefill step are compiled by poot.compile and planned the
same way.
"""
from __future__ import annotations

import time

import poot
import pytest
from poot.conformance.compile_only import model_step_graph, plan_cases
from poot.plan import plan
from poot_cuda import compiler
from poot_cuda.backend import CudaBackend
from poot_cuda.compiler import CompileError
from poot_cuda.kernels import CompiledProgram

ARCH = "sm_90"
ELF = b"\x7fELF"


@pytest.fixture(scope="module")
def target():
    backend = CudaBackend()
    return backend, backend.compile_only_device(ARCH)


def brief(exc: CompileError, lines: int = 12) -> str:
    """An NVRTC failure without its warnings: the first line, then each error with the
    two lines that show where (at most `lines` lines)."""
    head, *log = str(exc).splitlines()
    keep = [i for i, line in enumerate(log) if ": error" in line or "fatal" in line]
    shown = [log[j] for i in keep for j in range(i, min(i + 3, len(log)))]
    return "\n    ".join([head, *shown[:lines]])


def compiled_kernels(p) -> list:
    """Every CompiledKernel of a plan, after checking that each step's program is a
    CUBIN for ARCH with one kernel per kernel of its lowering, each an entry of it."""
    out = []
    for s in p.steps:
        prog = s.lowering.program
        assert isinstance(prog, CompiledProgram), f"step {s.index} ({s.eqn.op}): {prog!r}"
        assert prog.target == ARCH
        assert len(prog.kernels) == len(prog.program.kernels) == s.lowering.dispatches
        for ck in prog.kernels:
            cubin = ck.binary.load() if isinstance(ck.binary, compiler.UnitRef) else ck.binary
            assert cubin[:4] == ELF, f"{ck.kernel.name}: NVRTC gave no ELF CUBIN"
            assert f".text.{ck.kernel.name}\0".encode() in cubin, \
                f"{ck.kernel.name}: not in the CUBIN it was compiled to"
            assert f"{ck.kernel.name}(" in ck.source
        out += prog.kernels
    return out


def test_every_conformance_case_compiles_or_is_refused(target):
    backend, device = target
    t0 = time.perf_counter()
    with compiler.batch():
        out = plan_cases(backend, device, CompileError, brief)
        planned = time.perf_counter() - t0
    problems, sources = out.problems, set()
    for case_id, p in out.plans:
        try:
            sources.update(ck.source for ck in compiled_kernels(p))
        except AssertionError as exc:
            problems.append(f"{case_id}: {exc}")
    seconds = time.perf_counter() - t0
    print(f"\nconformance on {device}: {out.cases} cases, {len(out.plans)} compiled, "
          f"{out.refused} refused, {len(sources)} distinct kernels; planned in {planned:.1f} s, "
          f"{seconds:.1f} s in all")
    assert not problems, f"{len(problems)} of {out.cases} cases:\n" + "\n".join(problems)
    assert len(out.plans) + out.refused == out.cases
    assert out.plans and sources, "no case compiled: the check checked nothing"


@pytest.mark.parametrize("tokens", [1, 32], ids=["decode", "prefill32"])
def test_smollm2_step_compiles_to_cubin(target, smollm2_gguf, tokens):
    backend, device = target
    t0 = time.perf_counter()
    traced, config = model_step_graph(smollm2_gguf, backend, device, tokens)
    with compiler.batch():
        compiled = poot.compile(traced, (backend, device))
        p = plan(compiled, (backend, device))
    kernels = compiled_kernels(p)
    names = {s.eqn.op.name for s in p.steps}
    seconds = time.perf_counter() - t0
    print(f"\nSmolLM2 {tokens}-token step on {device}: {len(traced.eqns())} eqns traced, "
          f"{len(p.steps)} steps, {len(kernels)} kernels, "
          f"{len({ck.source for ck in kernels})} distinct, {seconds:.1f} s")
    # a step of several tokens attends over its query rows as they are
    assert {"Attention" if tokens == 1 else "TokenMajorAttention", "Rope"} <= names, names
    assert any("Packed" in n for n in names), names   # the Q4_1 weights decode in-kernel
    assert len(kernels) >= config.layers * 4
