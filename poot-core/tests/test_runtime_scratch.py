"""The stream runtimes' one scratch allocation (poot.runtime.stream): each step's scratch
buffers at 256-byte aligned offsets of it, as large as the largest step needs."""
from __future__ import annotations

from types import SimpleNamespace

from poot.codegen.program import SCRATCH, Access, BufferParam
from poot.dtypes import DType
from poot.runtime.stream import _scratch_bytes, _scratch_offsets


def step(*counts):
    bufs = tuple(BufferParam(f"s{i}", DType.F32, Access.READ_WRITE, c, SCRATCH)
                 for i, c in enumerate(counts))
    return SimpleNamespace(program=SimpleNamespace(scratch=bufs))


def test_buffers_of_a_step_lie_apart_on_aligned_offsets():
    offsets = [at for _, at in _scratch_offsets(step(10, 100, 1))]
    assert offsets == [0, 256, 768]          # 40, 400 and 4 bytes
    assert _scratch_bytes(step(10, 100, 1)) == 1024


def test_steps_without_scratch_or_of_another_kind_need_none():
    assert _scratch_bytes(step()) == 0
    assert _scratch_offsets(object()) == []
