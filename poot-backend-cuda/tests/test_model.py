"""A Llama step compiled and planned for CUDA: every kernel compiles to CUBIN (no GPU
needed); on a GPU, the planned step runs through the Executor and matches the oracle."""
from __future__ import annotations

import numpy as np
import poot
import pytest
from poot.codegen.cases import mismatch
from poot.compiler.validate import random_inputs
from poot.models.llama import build_decoder, const_inputs, random_weights, tiny_config
from poot.oracle import evaluate
from poot.plan import plan
from poot_cuda.backend import CudaBackend

STEPS = [(1, "dense", "f32", None), (3, "paged", "bf16", None), (1, "dense", "f32", "gguf:Q4_0"),
         (1, "dense", "bf16", None)]


def build(tokens, kv, dtype, fmt, device, backend=None):
    backend = backend or CudaBackend()
    config = tiny_config(layers=2)
    weights = random_weights(config, seed=tokens, dtype=dtype, packed_format=fmt)
    step = build_decoder(config, weights, tokens=tokens, kv=kv, batch=2 if kv == "paged" else 1)
    compiled = poot.compile(step.graph, (backend, device))
    return step, weights, compiled, plan(compiled, (backend, device))


@pytest.mark.parametrize("tokens,kv,dtype,fmt", STEPS)
def test_llama_step_plans_and_compiles_for_sm90(tokens, kv, dtype, fmt):
    device = CudaBackend.compile_only_device("sm_90")
    _, _, compiled, p = build(tokens, kv, dtype, fmt, device)
    names = {s.eqn.op.name for s in p.steps}
    # a paged step reads its KV pool through the slot map inside the attention kernel
    attention = "PagedAttention" if kv == "paged" else "Attention"
    assert {attention, "Rope", "FusedRow"} <= names
    for s in p.steps:
        for ck in s.lowering.program.kernels:
            assert ck.binary[:4] == b"\x7fELF"


def run_step_against_oracle(backend, device, tokens, kv, dtype, fmt, runs: int = 2):
    """Plan the step for (backend, device), run it `runs` times through the Executor
    (state rewritten to the oracle's inputs before each run) and compare the result."""
    from poot.runtime.executor import Executor

    step, weights, compiled, p = build(tokens, kv, dtype, fmt, device, backend)
    g = compiled.graph
    inputs = random_inputs(g, np.random.default_rng(tokens), const_inputs(step, weights))
    label = lambda v: g.meta(v).identity.label  # noqa: E731
    ex = Executor(p, {label(v): inputs[label(v)] for v in g.consts()})
    slots = {label(v): inputs[label(v)] for v, _ in g.slots()}
    want = evaluate(g, inputs, outputs="result")[0]
    tol = 1e-8 if want.dtype == np.float32 else 1e-4
    for _ in range(runs):   # a GPU runtime records its step on the first run, replays after
        for name in ex.state_names():
            ex.write_state(name, inputs[name])
        got = ex.step(slots).result
        problem = mismatch(np.asarray(got).reshape(want.shape), want, tol)
        assert problem is None, problem
    return ex


@pytest.mark.gpu
@pytest.mark.parametrize("tokens,kv,dtype,fmt", STEPS)
def test_llama_step_runs_on_the_gpu(gpu, tokens, kv, dtype, fmt):
    backend = CudaBackend()
    ex = run_step_against_oracle(backend, backend.probe()[0], tokens, kv, dtype, fmt)
    assert ex.executable.recorded


def test_the_step_harness_on_the_reference_backend():
    """The GPU test's own logic, checked where it can run: on the reference backend."""
    from poot.plugin import get_backend

    ref = get_backend("reference")
    run_step_against_oracle(ref, ref.default_device(), 1, "dense", "f32", None, runs=1)
