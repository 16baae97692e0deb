"""HIP printing: wavefront-width reductions, the unit guard, LDS limits, 16-bit floats."""
from __future__ import annotations

import pytest
from poot.codegen.builder import KernelBuilder
from poot.codegen.expr import Load
from poot.codegen.program import Access, local_index
from poot.dtypes import DType
from poot.errors import DeviceUnavailable, LimitExceeded
from poot.ir.ops import ReduceOp
from poot_rocm.archs import target
from poot_rocm.printer import HipPrinter

F32 = DType.F32


def reduction_kernel(threads: int, width: int | None):
    kb = KernelBuilder(f"red_{threads}_{width}", (1,), (threads,))
    kb.buffer("x", F32, Access.READ, threads)
    kb.buffer("out", F32, Access.WRITE, threads)
    r = kb.reduce("r", ReduceOp.Sum, Load("x", local_index(), F32), width)
    kb.store("out", local_index(), r)
    return kb.finish()


def test_targets_parse_from_device_and_compile_only_names():
    assert target("gfx90a:sramecc+:xnack-").wave == 64
    assert target("gfx1030").wave == 32 and target("gfx1030:w64").wave == 64
    assert target("gfx1030:w64").name == "gfx1030:w64"
    with pytest.raises(DeviceUnavailable, match="gfx90a runs wavefronts of 64"):
        target("gfx90a:w32")
    with pytest.raises(DeviceUnavailable, match="unknown AMD GPU architecture"):
        target("gfx9999")


def test_wave64_reduces_64_lanes_with_shuffles_alone():
    src = HipPrinter("gfx90a").source(reduction_kernel(256, 64))
    assert "__shfl_xor(r_v, 32, 64)" in src and "__shfl_xor(r_v, 1, 64)" in src
    assert "poot_red_r" not in src                      # no LDS round trip at width 64
    assert "__AMDGCN_WAVEFRONT_SIZE != 64" in src


def test_wave32_folds_two_wavefronts_through_lds():
    src = HipPrinter("gfx1030").source(reduction_kernel(256, 64))
    assert "__shfl_xor(r_v, 16, 32)" in src and "__shfl_xor(r_v, 32," not in src
    assert "__shared__ float poot_red_r[8];" in src     # one partial per wavefront
    assert "__AMDGCN_WAVEFRONT_SIZE != 32" in src


def test_ragged_workgroup_folds_every_thread():
    src = HipPrinter("gfx90a").source(reduction_kernel(96, None))
    assert "__shared__ float poot_red_r[96];" in src and "__shfl_xor" not in src


def test_printed_units_concatenate():
    p = HipPrinter("gfx90a")
    a, b = p.source(reduction_kernel(64, None)), p.source(reduction_kernel(128, None))
    both = a + b
    assert both.count("#ifndef POOT_HIP_PRELUDE") == 2
    assert both.count("#endif  // POOT_HIP_PRELUDE") == 2


def test_lds_past_the_architecture_is_refused():
    kb = KernelBuilder("big", (1,), (64,))
    kb.buffer("out", F32, Access.WRITE, 64)
    kb.shared("s", F32, 17 * 1024)                      # 68 KiB > 64 KiB
    kb.store("s", local_index(), Load("s", local_index(), F32))
    kb.barrier()
    kb.store("out", local_index(), Load("s", local_index(), F32))
    with pytest.raises(LimitExceeded, match="LDS") as e:
        HipPrinter("gfx90a").source(kb.finish())
    assert e.value.backend == "rocm" and e.value.device == "gfx90a"


def test_16_bit_floats_print_without_headers():
    p = HipPrinter("gfx1030")
    assert p.type_name(DType.F16) == "_Float16" and p.type_name(DType.BF16) == "poot_bf16"
    assert p.from_f32(DType.BF16, "x") == "((poot_bf16)poot_f32_to_bf16(x))"
    assert "poot_f32_to_bf16(float x)" in p.scalar_helpers()   # the shared rounding rule
