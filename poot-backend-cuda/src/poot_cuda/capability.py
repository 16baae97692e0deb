"""The CUDA capability table of one device, from its compute capability."""
from __future__ import annotations

from poot.capability import CapabilityTable, Use, op_keys
from poot.dtypes import DType
from poot.ir.ops import BinaryOp, UnaryOp

F32, F16, BF16, I32, U32 = DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32
SMALL = {DType.I8, DType.U8, DType.I16, DType.U16}
INTS = {I32, U32}
ALL_WORDS = INTS | SMALL

# op families from the sub-ops' own traits
FLOAT_UNARY = UnaryOp.keys(lambda u: not u.bitwise)
BIT_UNARY = UnaryOp.keys(lambda u: u.bitwise)
ARITH_BINARY = BinaryOp.keys(lambda b: not b.bitwise)
BIT_BINARY = BinaryOp.keys(lambda b: b.bitwise)
MOVES = ("Broadcast", "Reshape", "Transpose", "Slice", "Concat", "Gather", "ScatterUpdate",
         "DynamicUpdateSlice", "Select", "Cast", "Fused", "FusedRow", "ContractionEpilogue",
         "Reduce.Sum")
PACKED = ("PackedDequant", "PackedContraction", "PackedRowGather", "IndexedPackedContraction")


def kernel_features(major: int, minor: int) -> frozenset:
    """cp.async and mma.sync m16n8k16 (BF16/F16 -> F32) exist from sm_80 on."""
    from poot.codegen.program import COPY_ASYNC, MMA

    return frozenset({MMA, COPY_ASYNC}) if (major, minor) >= (8, 0) else frozenset()


def arch_of(major: int, minor: int) -> str:
    return f"sm_{major}{minor}"


def parse_arch(arch: str) -> tuple[int, int]:
    """(major, minor) of an NVRTC arch name: sm_90 -> (9, 0), sm_90a -> (9, 0), sm_120 ->
    (12, 0)."""
    digits = arch.removeprefix("sm_").rstrip("af")
    return int(digits[:-1]), int(digits[-1])


def table(device: str, major: int, minor: int, formats) -> CapabilityTable:
    """sm_80+ computes with F32, F16 and BF16 (16-bit floats compute in F32 and round
    per op, the IR's rule); sm_70/75 lack BF16 arithmetic. FP8 is storage only (packed
    FP8 formats decode with integer ops), on sm_89+."""
    floats = {F32, F16, BF16} if (major, minor) >= (8, 0) else {F32, F16}
    dtypes = {d: Use.all() for d in floats}
    dtypes.update({d: Use.STORAGE | Use.CONVERT | Use.ARITH | Use.DOT for d in INTS})
    dtypes.update({d: Use.STORAGE | Use.CONVERT | Use.ARITH for d in SMALL})
    if (major, minor) < (8, 0):
        dtypes[BF16] = Use.STORAGE
    if (major, minor) >= (8, 9):
        dtypes.update({DType.F8E4M3: Use.STORAGE, DType.F8E5M2: Use.STORAGE})
    ops: dict[str, set] = {}
    ops.update({k: set(floats) for k in FLOAT_UNARY})
    ops["Unary.Neg"] |= {I32}
    ops.update({k: set(INTS) for k in BIT_UNARY + BIT_BINARY})
    ops.update({k: floats | ALL_WORDS for k in ARITH_BINARY + MOVES})
    ops["Reduce.Max"] = floats | {I32} | SMALL
    ops["Iota"] = {F32, I32}
    ops["ArgTopK"] = floats | {I32}
    ops.update({k: floats | {I32} for k in ("MatMul", "IndexedMatMul")})
    ops.update({k: set(floats) for k in ("Attention", "Rope")})
    ops["DenseContraction"] = {F32, F16, U32} | ({BF16} & floats)
    ops["GroupedDenseContraction"] = {BF16} & floats
    ops["DenseRowGather"] = {BF16} & floats
    ops.update({k: set(formats) for k in PACKED})
    known = set(op_keys(*sorted({k.split(".")[0] for k in ops})))
    notes = {"Scan": "Scan is evaluated by its primitive definition; no cuda kernel",
             "AllReduce": "collectives are cuts between stages",
             "AllGather": "collectives are cuts between stages",
             "BlockTopK": "no cuda kernel for sparse block selection yet",
             "SelectedAttention": "no cuda kernel for sparse attention yet",
             "Reduce.Max:u32": "no unsigned accumulator for Max"}
    return CapabilityTable.declare("cuda", device, dtypes,
                                   {k: v for k, v in ops.items() if k in known},
                                   notes=notes)
