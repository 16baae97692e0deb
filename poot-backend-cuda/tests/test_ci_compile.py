"""CI's compile check (no GPU): every kernel the conformance suite and the SmolLM2 plan
generate compiles to CUBIN for sm_90 with NVRTC.

Each case of the conformance suite (its op cases and its model cases) is planned for a
compile-only sm_90 device, exactly as the suite plans it on a GPU: a case the device
declares must plan with every kernel compiled to CUBIN; an undeclared one must be refused
at plan time with the typed LoweringError (a capability refusal, not an NVRTC failure).
Then the real SmolLM2-135M decode step (1 token) and its 32-token prefill step are
compiled by poot.compile and planned the same way.
"""
from __future__ import annotations

import inspect
import time
from dataclasses import replace

import poot
import pytest
from poot.errors import LoweringError
from poot.plan import plan
from poot_cuda.backend import CudaBackend
from poot_cuda.compiler import CompileError
from poot_cuda.kernels import CompiledProgram

ARCH = "sm_90"
ELF = b"\x7fELF"


@pytest.fixture(scope="module")
def target():
    backend = CudaBackend()
    return backend, backend.compile_only_device(ARCH)


def conformance_cases() -> list:
    """The suite's cases, op and model ones, with its slot roles registered as it does."""
    from poot import plugin
    from poot.conformance import roles
    from poot.conformance.cases import all_cases
    from poot.conformance.model import model_case_list

    plugin.register(roles, name="poot.conformance.roles")
    return [*all_cases(), *model_case_list()]


def brief(exc: CompileError, lines: int = 12) -> str:
    """An NVRTC failure without its warnings: the first line, then each error with the
    two lines that show where (at most `lines` lines)."""
    head, *log = str(exc).splitlines()
    keep = [i for i, line in enumerate(log) if ": error" in line or "fatal" in line]
    shown = [log[j] for i in keep for j in range(i, min(i + 3, len(log)))]
    return "\n    ".join([head, *shown[:lines]])


def compiled_kernels(p) -> list:
    """Every CompiledKernel of a plan, after checking that each step's program is a
    CUBIN for ARCH with one kernel per kernel of its lowering."""
    out = []
    for s in p.steps:
        prog = s.lowering.program
        assert isinstance(prog, CompiledProgram), f"step {s.index} ({s.eqn.op}): {prog!r}"
        assert prog.target == ARCH
        assert len(prog.kernels) == len(prog.program.kernels) == s.lowering.dispatches
        for ck in prog.kernels:
            assert ck.binary[:4] == ELF, f"{ck.kernel.name}: NVRTC gave no ELF CUBIN"
            assert f"{ck.kernel.name}(" in ck.source
        out += prog.kernels
    return out


def test_every_conformance_case_compiles_or_is_refused(target):
    backend, device = target
    table = backend.capabilities(device)
    t0 = time.perf_counter()
    cases = conformance_cases()
    compiled, refused, sources, problems = 0, 0, set(), []
    for case in cases:
        declared = not table.graph_refusals(case.graph)
        try:
            p = plan(case.graph, (backend, device))
        except CompileError as exc:
            problems.append(f"{case.id}: NVRTC failed: {brief(exc)}")
            continue
        except LoweringError as exc:
            if declared:
                problems.append(f"{case.id}: declared but refused: {exc}")
            elif not (exc.backend == backend.name and exc.op and exc.device):
                problems.append(f"{case.id}: the refusal must name op, backend and device: "
                                f"{exc!r}")
            else:
                refused += 1
            continue
        if not declared:
            problems.append(f"{case.id}: not declared "
                            f"({table.graph_refusals(case.graph)[0][1]}) but planned")
            continue
        try:
            kernels = compiled_kernels(p)
        except AssertionError as exc:
            problems.append(f"{case.id}: {exc}")
            continue
        compiled += 1
        sources.update(ck.source for ck in kernels)
    seconds = time.perf_counter() - t0
    print(f"\nconformance on {device}: {len(cases)} cases, {compiled} compiled, "
          f"{refused} refused, {len(sources)} distinct kernels, {seconds:.1f} s")
    assert not problems, f"{len(problems)} of {len(cases)} cases:\n" + "\n".join(problems)
    assert compiled + refused == len(cases)
    assert compiled and sources, "no case compiled: the check checked nothing"


@pytest.mark.parametrize("tokens", [1, 32], ids=["decode", "prefill32"])
def test_smollm2_step_compiles_to_cubin(target, smollm2_gguf, tokens):
    from poot.models.loader import open_model
    from poot.models.runner import Model, load

    backend, device = target
    t0 = time.perf_counter()
    max_seq = inspect.signature(load).parameters["max_seq"].default  # what `poot run` plans
    ckpt, config = open_model(str(smollm2_gguf), max_seq=max_seq)
    config = replace(config, max_seq=min(config.max_seq, max_seq))
    model = Model(ckpt, config, None, backend, device, prefill_tokens=32)
    traced = model.step_graph(tokens, 1, "dense", pool=config.max_seq, compiled=False)
    compiled = poot.compile(traced, (backend, device))
    p = plan(compiled, (backend, device))
    kernels = compiled_kernels(p)
    names = {s.eqn.op.name for s in p.steps}
    seconds = time.perf_counter() - t0
    print(f"\nSmolLM2 {tokens}-token step on {device}: {len(traced.eqns())} eqns traced, "
          f"{len(p.steps)} steps, {len(kernels)} kernels, "
          f"{len({ck.source for ck in kernels})} distinct, {seconds:.1f} s")
    assert {"Attention", "Rope"} <= names, names
    assert any("Packed" in n for n in names), names   # the Q4_1 weights decode in-kernel
    assert len(kernels) >= config.layers * 4
