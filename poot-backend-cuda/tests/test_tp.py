"""Tensor parallelism on CUDA without a GPU: a rank graph compiles and plans for sm_90 with
its collectives as steps of their own; no collectives across ranks without GPUs for them."""
from __future__ import annotations

from dataclasses import replace

import poot
import pytest
from poot.dtypes import DType
from poot.errors import DeviceUnavailable, UnsupportedOp
from poot.ir.ops import AllReduce
from poot.ir.types import TensorType
from poot.models.llama import build_decoder, random_weights, tiny_config
from poot.parallel import shard_step
from poot.plan import plan
from poot_cuda.backend import CudaBackend


class Member:
    """A stand-in for one rank's NCCL communicator: planning needs only its group size."""

    rank, ranks = 0, 2
    dtypes = frozenset({DType.F32, DType.BF16, DType.F16})


def test_a_rank_graph_plans_for_sm90_with_collectives_as_steps():
    backend = CudaBackend()
    device = backend.compile_only_device("sm_90")
    c = replace(tiny_config(), layers=1)
    step = build_decoder(c, random_weights(c, dtype="bf16"), tokens=1, stack_qkv=False,
                         stack_ffn=False)
    (rg,) = shard_step(step, 2, only=0)
    with pytest.raises(UnsupportedOp, match="AllReduce"):
        poot.compile(rg.graph, (backend, device))        # no communicator: refused
    compiled = poot.compile(rg.graph, (backend, device), communicator=Member())
    p = plan(compiled, (backend, device))
    kinds = [s.lowering.kernel for s in p.steps if s.lowering.extra.get("collective")]
    assert kinds == ["AllReduce"] * 3 + ["AllGather"]
    assert sum(1 for s in p.steps if not s.lowering.extra.get("collective")) > 10
    t = TensorType((1, 64), "f32")
    compiled.table.check(AllReduce(2), [t], t)
    with pytest.raises(UnsupportedOp, match="AllReduce over 4 ranks"):
        compiled.table.check(AllReduce(4), [t], t)


def test_more_ranks_than_gpus_is_refused():
    backend = CudaBackend()
    with pytest.raises(DeviceUnavailable, match=f"needs {len(backend.probe()) + 1} GPUs"):
        backend.tensor_parallel_group(len(backend.probe()) + 1)
