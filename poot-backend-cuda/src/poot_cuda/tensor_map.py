"""Tensor maps (poot.codegen.program.TensorMap) encoded for the driver: the 128 bytes a
kernel takes by value for its bulk tensor copies, built once a buffer's address is known
(when a plan's launches are bound)."""
from __future__ import annotations

import ctypes

import numpy as np
from poot.codegen.program import SWIZZLE_BYTES, TensorMap
from poot.dtypes import DType
from poot.errors import LoweringError

from poot_cuda.driver import check, cu

ALIGN = 16     # bytes: the least alignment of a tensor map's base address


def encode(tm: TensorMap, dtype: DType, address: int) -> np.ndarray:
    """The encoded map of `tm` over the buffer at `address`, as 16 uint64 words."""
    driver = cu()
    kinds = {DType.BF16: driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
             DType.F16: driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16}
    if dtype not in kinds or address % ALIGN or tm.box_cols * dtype.itemsize != SWIZZLE_BYTES:
        raise LoweringError(f"tensor map {tm.name} of {dtype} at 0x{address:x}: needs a "
                            f"16-bit float buffer on a {ALIGN}-byte boundary",
                            dtype=str(dtype), backend="cuda")
    u64, u32 = driver.cuuint64_t, driver.cuuint32_t
    encoded = check(driver.cuTensorMapEncodeTiled(
        kinds[dtype], 2, address, [u64(tm.cols), u64(tm.rows)],
        [u64(tm.cols * dtype.itemsize)], [u32(tm.box_cols), u32(tm.box_rows)],
        [u32(1), u32(1)], driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        f"cuTensorMapEncodeTiled({tm.name})")
    return np.frombuffer(ctypes.string_at(encoded.getPtr(), 128), np.uint64).copy()
