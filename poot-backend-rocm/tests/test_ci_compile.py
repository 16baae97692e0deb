"""CI's compile check (no AMD GPU): every kernel the conformance suite and the SmolLM2
plan generate compiles to an AMD code object with hiprtc, for CDNA2 (gfx90a, wave64)
and RDNA2 (gfx1030, wave32).

Each case of the conformance suite (op cases and model cases) is planned for a
compile-only device, exactly as the suite plans it on a GPU: a case the target declares
must plan, every kernel built; an undeclared one must be refused at plan time with the
typed LoweringError naming op, backend and device. Plans are made inside one
`compiler.batch()`, so the kernels build in a few large hiprtc units; each code object's
metadata is then read back and must name the target, hold the kernel, and run at the
wavefront width the kernel was printed for. Then SmolLM2-135M's decode step (1 token)
and its 32-token prefill step are compiled and planned the same way.
"""
from __future__ import annotations

import time

import poot
import pytest
from poot.conformance.compile_only import model_step_graph, plan_cases
from poot.plan import plan
from poot_rocm import codeobject, compiler
from poot_rocm.backend import RocmBackend
from poot_rocm.kernels import CompiledProgram

TARGETS = ["gfx90a", "gfx1030"]


@pytest.fixture(scope="module", params=TARGETS)
def target(request):
    backend = RocmBackend()
    return backend, backend.compile_only_device(request.param)


def check_code_objects(plans, backend, device) -> tuple[list, list[str]]:
    """Every CompiledKernel of the plans, and what is wrong with them: each step's
    program is a CompiledProgram for the target whose kernels' code objects (read back
    from the cache) name the target and hold the kernel at the target's wavefront."""
    t = backend.target(device)
    kernels, problems, read = [], [], {}
    for label, p in plans:
        for s in p.steps:
            prog = s.lowering.program
            if not isinstance(prog, CompiledProgram) or prog.target != t.name:
                problems.append(f"{label}: step {s.index} ({s.eqn.op}): {prog!r}")
                continue
            for ck in prog.kernels:
                code = ck.binary.load()
                if code not in read:
                    read[code] = codeobject.read(code)[0]
                co = read[code]
                info = co.kernel(ck.kernel.name)
                if co.gfx != t.arch.name or info.wavefront != t.wave:
                    problems.append(f"{label}: {ck.kernel.name} built for {co.target} "
                                    f"wave{info.wavefront}, not {t}")
                kernels.append((ck, info))
    return kernels, problems


def test_every_conformance_case_compiles_or_is_refused(target):
    backend, device = target
    t0 = time.perf_counter()
    with compiler.batch():
        out = plan_cases(backend, device, compiler.CompileError)
        planned = time.perf_counter() - t0
    built = time.perf_counter() - t0 - planned
    kernels, wrong = check_code_objects(out.plans, backend, device)
    problems = out.problems + wrong
    sources = {ck.source for ck, _ in kernels}
    vgprs = max((info.vgprs for _, info in kernels), default=0)
    spilling = {info.name for _, info in kernels if info.spills}
    print(f"\nconformance on {device}: {out.cases} cases, {len(out.plans)} compiled, "
          f"{out.refused} refused, {len(sources)} distinct kernels; planned in {planned:.1f} s,"
          f" built in {built:.1f} s; most VGPRs {vgprs}, {len(spilling)} kernels spill")
    assert not problems, f"{len(problems)} of {out.cases} cases:\n" + "\n".join(problems)
    assert len(out.plans) + out.refused == out.cases
    assert out.plans and sources, "no case compiled: the check checked nothing"


@pytest.mark.parametrize("tokens", [1, 32], ids=["decode", "prefill32"])
def test_smollm2_step_compiles_to_code_objects(target, smollm2_gguf, tokens):
    backend, device = target
    t0 = time.perf_counter()
    traced, config = model_step_graph(smollm2_gguf, backend, device, tokens)
    with compiler.batch():
        compiled = poot.compile(traced, (backend, device))
        p = plan(compiled, (backend, device))
    kernels, problems = check_code_objects([("smollm2", p)], backend, device)
    assert not problems, "\n".join(problems)
    names = {s.eqn.op.name for s in p.steps}
    seconds = time.perf_counter() - t0
    worst = max((info for _, info in kernels), key=lambda i: i.vgprs)
    print(f"\nSmolLM2 {tokens}-token step on {device}: {len(traced.eqns())} eqns traced, "
          f"{len(p.steps)} steps, {len(kernels)} kernels, "
          f"{len({ck.source for ck, _ in kernels})} distinct, {seconds:.1f} s; "
          f"most VGPRs: {worst}")
    assert {"Attention", "Rope"} <= names, names
    assert any("Packed" in n for n in names), names   # the Q4_1 weights decode in-kernel
    assert len(kernels) >= config.layers * 4
