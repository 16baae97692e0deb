"""The OpKind vocabulary of the IR (the spec's table), one module per category.

An op is its class: type rule, parameters, definition (composites) and capability traits
live on it, and the op tuples below are built from the classes the modules define.
"""
import dataclasses

from poot.ir.ops import composite, compute, data, elementwise, quantize, reduce, shape
from poot.ir.ops.base import OpKind, SubOp, broadcast_shapes
from poot.ir.ops.composite import (
    COLLECTIVES,
    AllGather,
    AllReduce,
    Attention,
    BlockTopK,
    Composite,
    ContractionEpilogue,
    ContractionPrologue,
    DenseContraction,
    DenseRowGather,
    FreshKVAttention,
    Fused,
    FusedRow,
    GatedContraction,
    GroupedDenseContraction,
    IndexedPackedContraction,
    NormedDenseContraction,
    NormedPackedContraction,
    PackedContraction,
    PackedRowGather,
    PagedAttention,
    Rope,
    RopeScatter,
    RopeUpdateSlice,
    SelectedAttention,
    SinkAttention,
    TokenMajorAttention,
    TransposedUpdateSlice,
    attention_chain,
)
from poot.ir.ops.compute import IndexedMatMul, MatMul, PackedDequant, Scan
from poot.ir.ops.data import ArgTopK, DynamicUpdateSlice, Gather, ScatterUpdate
from poot.ir.ops.elementwise import Binary, BinaryOp, Cast, Iota, Select, Unary, UnaryOp
from poot.ir.ops.quantize import (
    Q8_BLOCK,
    PagedQ8KVAttention,
    Q8_MAX,
    Q8KVAttention,
    Q8KVSinkAttention,
    Q8PackedContraction,
    QuantizeI8,
)
from poot.ir.ops.reduce import Reduce, ReduceOp
from poot.ir.ops.shape import Broadcast, Concat, Reshape, Slice, Transpose


def _op_classes(*modules) -> tuple[type[OpKind], ...]:
    """The op classes each module defines, in definition order."""
    return tuple(c for m in modules for c in vars(m).values()
                 if isinstance(c, type) and issubclass(c, OpKind) and
                 c.__module__ == m.__name__ and dataclasses.is_dataclass(c))


_OPS = _op_classes(elementwise, shape, data, reduce, compute, composite, quantize)
#: what tracers emit (Scan among them: a source composite), and what compile introduces
PRIMITIVES = tuple(c for c in _OPS if not c.compiler_only)
COMPOSITES = tuple(c for c in _OPS if c.compiler_only)
ALL_OPS = {cls.__name__: cls for cls in PRIMITIVES + COMPOSITES}

__all__ = [name for name, v in globals().items()
           if not name.startswith("_") and not isinstance(v, type(dataclasses))]
