"""Integer dot products (target.DOT4) chosen from WGSL's packed_4x8_integer_dot_product: the
fast graph's contraction of int8 rows is declared and printed with dot4I8Packed where the
implementation has it, and one without it keeps today's path (the table refuses the
composite with a typed error, so `fast` keeps the rounded rows' PackedContraction). The kernels' values are
the conformance suite's (Q8PackedContraction cases, run on this device)."""
from __future__ import annotations

import pytest
from poot.codegen.lower.q8 import q8_program
from poot.codegen.lower.schedule import DotSchedule
from poot.codegen.target import DOT4
from poot.dtypes import DType
from poot.errors import UnsupportedOp
from poot.formats import PackedWeight
from poot.ir import ops as O
from poot.ir.types import TensorType
from poot_wgpu.backend import WgpuBackend
from poot_wgpu.device import DOT4_LANGUAGE_FEATURE
from poot_wgpu.wgsl import WgslPrinter


class _Backend(WgpuBackend):
    """The wgpu backend over a given view of the device (its own tables and lowerings)."""

    def __init__(self, dev):
        self.dev = dev

    def _device(self, device):
        return self.dev


@pytest.fixture(scope="module")
def targets(wgpu_device):
    if DOT4_LANGUAGE_FEATURE not in wgpu_device.language_features:
        pytest.skip(f"{wgpu_device.name} lacks {DOT4_LANGUAGE_FEATURE}")
    import copy

    without = copy.copy(wgpu_device)
    without.language_features = wgpu_device.language_features - {DOT4_LANGUAGE_FEATURE}
    return _Backend(wgpu_device), _Backend(without), WgpuBackend().probe()[0]


def _kernel(backend, device, fmt):
    w = PackedWeight(fmt, (8, 256))
    types = [TensorType((1, 256), DType.F32)] + [s.type for s in w.sources()]
    out = TensorType((1, 8), DType.F32)
    (kernel,) = q8_program(O.Q8PackedContraction(w), types, out, backend.features(device),
                           backend.schedule(device)).kernels   # the rows quantized inside it
    return kernel


def test_dot4_and_the_composite_follow_the_language_feature(targets):
    with_dot, without, device = targets
    assert with_dot.features(device) == {DOT4} and without.features(device) == frozenset()
    formats = frozenset({"gguf:Q4_0", "gguf:Q8_0"})
    assert with_dot.capability_table(device, formats).lowers("Q8PackedContraction") == formats
    assert not without.capability_table(device, formats).lowers("Q8PackedContraction")
    limit = with_dot.dev.limit("max-compute-workgroup-storage-size")
    schedule = with_dot.schedule(device)
    assert schedule is None or schedule.int_shared_bytes < limit
    assert (without.schedule(device) or DotSchedule()).int_shared_bytes == \
        DotSchedule.int_shared_bytes


@pytest.mark.parametrize("fmt,products", [("gguf:Q4_0", 1), ("gguf:Q8_0", 2)])
def test_the_integer_gemv_prints_dot4i8packed_and_naga_takes_it(targets, fmt, products):
    """4-bit codes are bytes below 128, one signed product each; 8-bit ones add their top
    bits' product."""
    with_dot, without, device = targets
    kernel = _kernel(with_dot, device, fmt)
    src = WgslPrinter(with_dot.dev).source(kernel)
    assert src.count("dot4I8Packed(") == 8 * 2 * products        # 8 quads x 2 groups
    with_dot.dev.device.create_shader_module(code=src)
    # a printer without the instruction prints the same program's Dot4 as multiply-adds
    plain = WgslPrinter(without.dev).source(kernel)
    assert "dot4I8Packed" not in plain
    with_dot.dev.device.create_shader_module(code=plain)


def test_without_the_feature_the_composite_is_refused_with_a_typed_error(targets):
    """The refusal `fast` keeps the rounded rows' PackedContraction for."""
    with_dot, without, device = targets
    w = PackedWeight("gguf:Q4_0", (8, 256))
    op, out = O.Q8PackedContraction(w), TensorType((1, 8), DType.F32)
    ins = [TensorType((1, 256), DType.F32)] + [s.type for s in w.sources()]
    with_dot.capabilities(device).check(op, ins, out)
    with pytest.raises(UnsupportedOp, match="Q8PackedContraction"):
        without.capabilities(device).check(op, ins, out)
