"""Target facts: what a lowering may assume of the device, as its backend declares it.

The kernel program (poot.codegen.program) is neutral: it names no warp width and no
instruction. A backend tells the lowerings what its target has through
`KernelBackend.features(device)`, a set of feature names:

* a matrix unit (`MatrixUnit.feature`): the target prints `MmaTile` for that unit's
  tile shape and lane layout (CUDA sm_80+: `MMA_M16N8K16`);
* `COPY_ASYNC`: the target prints CopyAsync / CopyCommit / CopyWait.
* `WIDE_WORKGROUPS`: workgroups of up to 1024 threads launch (others keep to 256, the
  least WebGPU guarantees).
* `DOT2`: the target prints `expr.Dot2` and `expr.Dot4` as one instruction each (PTX
  dp2a and dp4a, sm_61+; Dot4 for activations quantized to int8 rows) and gives
  a workgroup 48 KiB of shared memory, so packed GEMVs take the integer schedule
  (activations quantized to int16 in shared memory). Every printer can print Dot2 (as
  plain multiply-adds); the feature says only that it is worth it. It implies DOT4.
* `DOT4`: the target prints `expr.Dot4` as one instruction (SPIR-V's SUDot of
  VK_KHR_shader_integer_dot_product, WGSL's dot4I8Packed), so a GEMV over int8
  activation rows (Q8PackedContraction) takes the integer schedule. Dot2 stays plain
  multiply-adds there, so other packed GEMVs keep the f32 schedules.
* `REDUCE_SCATTER`: the target prints `CoopReduceScatter` within its subgroup (xor
  shuffles), so a warp's many dot products finish in V - 1 shuffles, not V log2(32).
* `WIDE_LOADS`: the target prints `LoadWide` and `StoreWide` (2, 4 or 8 elements in one
  4-, 8- or 16-byte load or store of a buffer or shared array) and `GroupBarrier` over
  its subgroup.
* `WGMMA`: the target prints Wgmma / WgmmaCommit / WgmmaWait (warpgroup
  matrix products from shared memory, CUDA sm_90a) and RegisterBudget.
* `TMA`: the target prints TmaLoad with the kernel's TensorMaps (bulk tensor copies into
  128-byte swizzled shared tiles) and the mbarriers they complete on (MbarInit,
  MbarArrive, MbarWait), and gives a workgroup 227 KiB of shared memory.

A lowering emits a statement family only when its target declares it; the printers of
targets without it refuse. A new matrix unit (a wavefront-wide one, say) is one more
`MatrixUnit` here, and a schedule that asks `matrix_unit(features)` for it.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MatrixUnit:
    """A cooperative matrix instruction as `MmaTile` uses it: acc (m x n, F32) += A (m x k)
    . B (k x n) with 16-bit float operands, executed together by `lanes` threads. Lane l
    holds accumulator r (0..3) of each tile at (row, col) = `coords(l, r)`."""

    feature: str
    m: int
    n: int
    k: int
    lanes: int

    def coords(self, lane, r):
        """(row, col) within an m x n tile of accumulator register r of `lane` (ints or
        numpy arrays)."""
        lane, r = np.asarray(lane), np.asarray(r)
        row = lane // 4 + (self.m // 2) * (r // 2)
        col = 2 * (lane % 4) + r % 2
        return (int(row), int(col)) if row.ndim == 0 else (row, col)


#: 16 x 8 x 16 tiles over a 32-lane warp: quad (lane / 4) picks the row, pair (lane % 4)
#: two adjacent columns; registers 2 and 3 are the rows 8 below (PTX mma.sync.m16n8k16)
MMA_M16N8K16 = MatrixUnit("mma.m16n8k16", 16, 8, 16, 32)
MATRIX_UNITS = {u.feature: u for u in (MMA_M16N8K16,)}

COPY_ASYNC = "copy.async"
WIDE_WORKGROUPS = "workgroup.1024"
DOT2 = "dot2.i16.u8"
DOT4 = "dot4.i8.u8"
REDUCE_SCATTER = "coop.reduce_scatter"
WGMMA = "wgmma.m64k16"
TMA = "tma.tile.2d"
WIDE_LOADS = "load.wide.128"
#: every feature name a target may declare
FEATURES = frozenset({*MATRIX_UNITS, COPY_ASYNC, WIDE_WORKGROUPS, DOT2, DOT4, REDUCE_SCATTER,
                      WGMMA, TMA, WIDE_LOADS})


def matrix_unit(features: Iterable[str]) -> MatrixUnit | None:
    """The matrix unit a target declares, if any."""
    return next((MATRIX_UNITS[f] for f in sorted(features) if f in MATRIX_UNITS), None)


__all__ = ["COPY_ASYNC", "DOT2", "DOT4", "FEATURES", "MATRIX_UNITS", "MMA_M16N8K16",
           "REDUCE_SCATTER", "TMA", "WGMMA", "WIDE_LOADS", "WIDE_WORKGROUPS", "MatrixUnit",
           "matrix_unit"]
