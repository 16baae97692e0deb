"""The printed HIP of a sample of kernels compiles with the host's hipcc (--genco,
HIP_PLATFORM=amd) for gfx90a and gfx1030, and each code object's metadata (target, LDS,
VGPRs) is read back, reported, and checked against the kernel it holds."""
from __future__ import annotations

import pytest
from poot.codegen.cases import all_cases
from poot.codegen.lower import lower
from poot_rocm.archs import target
from poot_rocm.hipcc import genco
from poot_rocm.printer import HipPrinter

SAMPLE = ["reduce-sum-(2, 1000)-1", "fused-row-softmax-of-bf16", "fused-row-rmsnorm",
          "attention-4x2-t1-s300-d64-f32", "attention-2x1-t3-s20-d8-bf16",
          "dense-(2, 9)-20x63-f16", "packed-gguf:IQ4_NL-m1", "packed-gguf:IQ4_NL-m6",
          "matmul-(3, 20, 33)-(3, 33, 17)-f32", "rope-f16-64", "argtopk-ties"]


@pytest.mark.parametrize("name", ["gfx90a", "gfx1030"])
def test_sample_compiles_with_hipcc_and_reports_metadata(name):
    t = target(name)
    printer = HipPrinter(t)
    cases = {c.id: c for c in all_cases()}
    kernels = {}
    for case_id in SAMPLE:
        c = cases[case_id]
        for k in lower(c.op, c.ins, c.out()).kernels:
            kernels[k.name] = (k, printer.source(k))
    objects = genco("".join(src for _, src in kernels.values()), t)
    assert [co.gfx for co in objects] == [t.arch.name]
    co = objects[0]
    print(f"\nhipcc --genco {t} ({co.target}): {len(co.kernels)} kernels")
    for name_, (k, _) in sorted(kernels.items()):
        info = co.kernel(name_)
        print(f"  {info}")
        assert info.wavefront == t.wave
        assert info.lds_bytes >= printer.lds_bytes(k)      # what the program declares
        assert info.lds_bytes <= t.arch.lds_bytes and 0 < info.vgprs <= 512
        assert info.max_workgroup >= k.threads_per_group
