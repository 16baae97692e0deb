"""The Graph IR: values, ops, eqns, graphs, and their text form."""
from poot.ir.builder import Builder, Ref, region
from poot.ir.graph import Eqn, Graph, GraphEdit, GraphOutput, Lit, Operand, OutputKind, Value
from poot.ir.ops import *  # noqa: F401,F403
from poot.ir.types import (
    BoundaryId,
    Identity,
    Slot,
    SlotKey,
    SlotKind,
    Storage,
    StorageClass,
    TensorType,
    ValueId,
    ValueMeta,
    ValueTable,
    WeightRef,
    require_value_id,
)
