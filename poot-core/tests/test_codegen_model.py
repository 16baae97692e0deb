"""A real model's compiled graph, eqn by eqn: each eqn's kernels (run by the kernel
interpreter) against the oracle on the values the model produces."""
from __future__ import annotations

import numpy as np
import poot
import pytest
from poot.codegen.cases import eqn_cases, mismatch
from poot.codegen.interp import run_lowering
from poot.codegen.lower import lower
from poot.compiler.validate import random_inputs
from poot.models.llama import build_decoder, const_inputs, random_weights, tiny_config

STEPS = [  # tokens, kv, dtype, packed format
    (1, "dense", "f32", None),
    (3, "paged", "bf16", None),
    (1, "dense", "f32", "gguf:Q4_0"),
    (4, "dense", "f32", "dense:f16words"),
]


def model_eqn_cases(tokens, kv, dtype, fmt, target="reference"):
    config = tiny_config(layers=1)
    weights = random_weights(config, seed=tokens, dtype=dtype, packed_format=fmt)
    step = build_decoder(config, weights, tokens=tokens, kv=kv, batch=2 if kv == "paged" else 1)
    compiled = poot.compile(step.graph, target)
    inputs = random_inputs(compiled.graph, np.random.default_rng(tokens),
                           const_inputs(step, weights))
    return eqn_cases(compiled.graph, inputs)


@pytest.mark.parametrize("tokens,kv,dtype,fmt", STEPS)
def test_every_eqn_of_a_llama_step(tokens, kv, dtype, fmt):
    failures = []
    ops = set()
    for case in model_eqn_cases(tokens, kv, dtype, fmt):
        ops.add(case.op.name)
        lowering = lower(case.op, case.ins, case.out())
        got = run_lowering(lowering, case.arrays, case.out())
        problem = mismatch(got, case.want, case.tol)
        if problem:
            failures.append(f"{case.id}: {problem}")
    assert not failures, "\n".join(failures)
    # a paged step reads its KV pool through the slot map inside the attention kernel; a
    # dense one of several tokens its query rows as they are
    attention = "PagedAttention" if kv == "paged" else "Attention" if tokens == 1 else \
        "TokenMajorAttention"
    # a one-token step's norms go into the contractions that read them
    norm = "FusedRow" if tokens > 1 else "NormedPackedContraction" if fmt else \
        "NormedDenseContraction"
    assert {attention, "Rope", norm} <= ops
