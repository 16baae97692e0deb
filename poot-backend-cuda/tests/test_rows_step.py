"""A Llama layer compiled for a CUDA device (compile only, no GPU) in a step of one token and
in steps of several (speculative verifications, prefill chunks): what each runs, one
kernel an op (Reshapes and the weights' row Slices are views). A wider step keeps
decode's GatedContraction and RopeUpdateSlice, writes v's rows to the cache as they are
(TransposedUpdateSlice for decode's DynamicUpdateSlice) and attends over its query rows
as they are (TokenMajorAttention for Attention); what it adds over decode is q, k and v
contracted apart."""
from __future__ import annotations

from collections import Counter

import poot
import pytest
from poot.models.llama import build_decoder, random_weights, tiny_config
from poot_cuda.backend import CudaBackend

VIEWS = ("Reshape", "Slice")
DECODE = Counter(FusedRow=2, PackedContraction=1, Rope=1, RopeUpdateSlice=1,
                 DynamicUpdateSlice=1, Attention=1, ContractionEpilogue=2, GatedContraction=1)


@pytest.fixture(scope="module")
def target():
    backend = CudaBackend()
    return backend, backend.compile_only_device("sm_90a")


def layer_ops(target, tokens: int) -> Counter:
    """The ops one more layer adds to the compiled step, views left out."""
    def ops(layers):
        config = tiny_config(layers=layers, max_seq=64)
        weights = random_weights(config, seed=1, dtype="f32", packed_format="gguf:Q4_0")
        step = build_decoder(config, weights, tokens=tokens,
                             logits="last" if tokens > 1 else "all")
        compiled = poot.compile(step.graph, target)
        return Counter(e.op.name for e in compiled.graph.eqns() if e.op.name not in VIEWS)
    return ops(2) - ops(1)


def test_a_decode_layer(target):
    assert layer_ops(target, 1) == DECODE


@pytest.mark.parametrize("tokens", [2, 8, 32])
def test_a_wider_step_adds_two_contractions(target, tokens):
    wider = DECODE - Counter(DynamicUpdateSlice=1, Attention=1) + Counter(
        TransposedUpdateSlice=1, TokenMajorAttention=1)
    assert layer_ops(target, tokens) == wider + Counter(PackedContraction=2)
