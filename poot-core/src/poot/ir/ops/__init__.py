"""The OpKind vocabulary of the IR (the spec's table), one module per category."""
from poot.ir.ops.base import OpKind, SubOp, broadcast_shapes
from poot.ir.ops.composite import (
    AllGather,
    AllReduce,
    Attention,
    BlockTopK,
    Composite,
    ContractionEpilogue,
    DenseContraction,
    DenseRowGather,
    Fused,
    FusedRow,
    GroupedDenseContraction,
    IndexedPackedContraction,
    PackedContraction,
    PackedRowGather,
    Rope,
    SelectedAttention,
    attention_chain,
)
from poot.ir.ops.compute import IndexedMatMul, MatMul, PackedDequant, Scan
from poot.ir.ops.data import ArgTopK, DynamicUpdateSlice, Gather, ScatterUpdate
from poot.ir.ops.elementwise import Binary, BinaryOp, Cast, Iota, Select, Unary, UnaryOp
from poot.ir.ops.reduce import Reduce, ReduceOp
from poot.ir.ops.shape import Broadcast, Concat, Reshape, Slice, Transpose

PRIMITIVES = (Unary, Binary, Select, Cast, Iota, Broadcast, Reshape, Transpose, Slice, Concat,
              Gather, ScatterUpdate, DynamicUpdateSlice, ArgTopK, Reduce, MatMul, IndexedMatMul,
              PackedDequant, Scan)
COMPOSITES = (Fused, FusedRow, ContractionEpilogue, Attention, Rope, BlockTopK,
              SelectedAttention, PackedContraction, PackedRowGather, IndexedPackedContraction,
              DenseContraction, DenseRowGather, GroupedDenseContraction, AllReduce, AllGather)
ALL_OPS = {cls.__name__: cls for cls in PRIMITIVES + COMPOSITES}

__all__ = [name for name in dir() if not name.startswith("_")]
