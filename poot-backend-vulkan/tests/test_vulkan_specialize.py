"""Sizes as specialization constants: kernels equal but for their sizes share one SPIR-V
module and run with their own values; what must stay a literal stays one."""
import numpy as np
from poot.codegen.builder import KernelBuilder
from poot.codegen.expr import Load, f32, ge, i32
from poot.codegen.program import Access, global_id
from poot.dtypes import DType
from poot_vulkan.specialize import PREFIX, lift

F32 = DType.F32


def _scale_rows(rows: int, cols: int):
    """out[r, c] = x[r, c] * 2 + x[r, 0] over a rows x cols matrix, one thread an element."""
    gid = global_id()
    n = rows * cols
    kb = KernelBuilder("scale_rows", grid=(-(-n // 64),), workgroup=(64,))
    kb.buffer("x", F32, Access.READ, n)
    kb.buffer("out", F32, Access.WRITE, n)
    with kb.if_(ge(i32(n - 1), gid)):
        first = Load("x", (gid // i32(cols)) * i32(cols), F32)
        kb.store("out", gid, Load("x", gid, F32) * f32(2.0) + first)
    return kb.finish()


def test_sizes_are_lifted_and_the_rest_stays_literal():
    src = """#version 450
layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;  // poot kernel k_3fa
shared float b_tile[2112];
int poot_idiv(int a, int b) { return b == 0 ? 0 : a / b; }
void main() {
  float b_acc[4];
#pragma unroll 8
  const int v_i = int(gl_GlobalInvocationID.x) * 576 + 0;  // f32[576]
  const uint v_w = poot_ushr(uint(v_i), 5u) & 7864320u;
  const float v_f = 1.0f + 5.960464477539063e-08f * 16.0f + float(v_i % 31);
  b_acc[1] = v_f * b_x2[v_i - 1];
}
"""
    skeleton, values = lift(src)
    assert values == (576, 31)
    assert "//" not in skeleton and "b_tile[2112]" in skeleton and "b_acc[4];" in skeleton
    assert "local_size_x = 64" in skeleton and "7864320u" in skeleton and "5u" in skeleton
    assert "5.960464477539063e-08f" in skeleton and "16.0f" in skeleton
    assert "#pragma unroll 8" in skeleton and "b_x2[" in skeleton and "b_acc[1]" in skeleton and "+ 0;" in skeleton
    assert f"* {PREFIX}0 " in skeleton and f"% {PREFIX}1)" in skeleton
    assert f"layout(constant_id = 1) const int {PREFIX}1 = 1;" in skeleton
    # another size gives the same skeleton, other values
    other, values2 = lift(src.replace("576", "960").replace("k_3fa", "k_77b"))
    assert other == skeleton and values2 == (960, 31)


def test_kernels_of_other_sizes_share_a_module_and_keep_their_values(vulkan_device):
    from poot_vulkan.launch import run_kernels

    rng = np.random.default_rng(3)
    used = []
    for rows, cols in ((3, 70), (5, 33)):
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        out, step = run_kernels(vulkan_device, [_scale_rows(rows, cols)],
                                {"x": x, "out": np.zeros_like(x)})
        np.testing.assert_allclose(out["out"].reshape(rows, cols), x * 2 + x[:, :1],
                                   rtol=1e-6)
        used.append(step.ops[0].pipeline)
    a, b = used
    assert a is not b and a.constants != b.constants  # one pipeline a size ...
    assert a.module == b.module                      # ... specializing one module


def _row_sums(rows: int, width: int):
    """out[r] = sum of x[r, :], a workgroup of `width` threads a row (a subgroup reduction
    where width is whole subgroups)."""
    from poot.codegen.program import group_id, local_id
    from poot.ir.ops import ReduceOp

    kb = KernelBuilder("row_sums", grid=(rows,), workgroup=(width,))
    kb.buffer("x", F32, Access.READ, rows * width)
    kb.buffer("out", F32, Access.WRITE, rows)
    total = kb.reduce("total", ReduceOp.Sum, Load("x", group_id() * i32(width) + local_id(),
                                                  F32))
    with kb.if_(ge(i32(0), local_id())):
        kb.store("out", group_id(), total)
    return kb.finish()


def test_a_subgroup_reduction_requires_its_subgroup_size_where_the_device_allows(
        vulkan_device):
    import dataclasses

    from poot_vulkan.glsl import required_subgroup
    from poot_vulkan.launch import run_kernels

    facts = vulkan_device.facts
    size = facts.subgroup_size
    able = dataclasses.replace(facts, features=facts.features | {
        "subgroupSizeControl", "computeFullSubgroups"}, limits={
        **facts.limits, "minSubgroupSize": size, "maxSubgroupSize": size,
        "maxComputeWorkgroupSubgroups": 8})
    unable = dataclasses.replace(facts, features=facts.features - {"subgroupSizeControl"})
    wide = _row_sums(3, 4 * size)
    assert required_subgroup(wide, able) == (size, True)
    assert required_subgroup(wide, unable) == (0, False)
    assert required_subgroup(_scale_rows(3, 70), able) == (0, False)  # no reduction
    assert required_subgroup(_row_sums(3, 16 * size), able) == (0, False)  # > 8 subgroups
    # both paths run here where the device reports the feature (lavapipe does)
    x = np.random.default_rng(4).standard_normal((3, 4 * size)).astype(np.float32)
    for f in (facts, unable):
        out, step = run_kernels(vulkan_device, [wide], {"x": x, "out": np.zeros(3, np.float32)},
                                facts=f)
        np.testing.assert_allclose(out["out"], x.sum(1), rtol=1e-5)
        assert step.ops[0].pipeline.subgroup == (size if f.has("subgroupSizeControl") else 0)
