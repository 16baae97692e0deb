"""The suite's own slot roles, declared through the `poot_slot_roles` hook.

Case inputs are per-step slots (one role per dtype, no value range), not consts:
a planner folds eqns whose operands are all constant on the host at bind time,
which would let the oracle answer for the backend under test. Slots also make
"a slot rewrite takes effect" checkable with the same cases.
"""
from __future__ import annotations

from poot.dtypes import DType
from poot.ir.types import SlotKind
from poot.plugin import hookimpl

OWNER = "poot.conformance"


def input_role(dtype: DType) -> SlotKind:
    """The slot role of a case input of `dtype` (any value of the dtype is in range)."""
    return SlotKind.declare(f"conformance.{dtype}", dtype, None, None, owner=OWNER)


@hookimpl
def poot_slot_roles():
    return [input_role(d) for d in DType]
