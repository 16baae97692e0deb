"""Renaming a step's output away from a write-after-read barrier.

The planner reuses arena bytes once their value is dead, so a step may write where an
operation of the current batch still reads (SmolLM2: each layer's rotated K lands on
the bytes its rotated Q was read from), and the recorded step needs a barrier for that
alone, which on a GPU costs more than the dispatch. The runtime instead moves that
output into a shadow buffer of its own: the writer and every later reader of those
bytes bind the shadow, up to the operation that writes them all anew, and the two
dispatches share a batch.

Only what is provably the same is renamed, by the rule every backend shares
(poot.runtime.renaming): the writer is the only dispatch of a step that defines its output
anew, every later access of the range is a dispatch's read inside it up to the first
write of another step's new output there, and that write comes before the end of the step.
"""
from __future__ import annotations

import dataclasses

from poot.runtime.renaming import Access, Op, followers

from poot_vulkan.step import Binding, Dispatch

ALIGN = 256  # every shadow range starts on a storage-offset boundary


def _clashes(accesses, pending) -> tuple[bool, bool]:
    """(any clash, only write-after-read clashes)."""
    clash, war_only = False, True
    for buf, s, e, w in accesses:
        for pbuf, ps, pe, pw in pending:
            if pbuf is buf and s < pe and ps < e and (w or pw):
                clash = True
                war_only &= w and not pw
    return clash, war_only


def _as_op(op) -> Op:
    accesses = tuple(Access(*a) for a in op.accesses())
    if isinstance(op, Dispatch):
        return Op(accesses, op.out, op.sole)
    return Op(accesses, opaque=True)


class _Shadow:
    """Stands for the shadow buffer until its size is known."""


def rename_war(ops: list, shadow_alloc) -> list:
    """`ops` with outputs renamed where that saves a write-after-read barrier;
    `shadow_alloc(nbytes)` makes the shadow buffer (called once, when any is needed)."""
    ops = list(ops)
    placeholder = _Shadow()
    pending: list = []
    top = 0
    for i in range(len(ops)):
        op = ops[i]
        clash, war_only = _clashes(op.accesses(), pending)
        if clash and war_only and isinstance(op, Dispatch) and op.out is not None and op.sole:
            others = [a for k, a in enumerate(op.accesses()) if k != op.out]
            moves = None if _clashes(others, pending)[0] else \
                followers([_as_op(o) for o in ops], i, ALIGN)
            if moves is not None:
                out = op.bindings[op.out]
                for j, k in moves:
                    _move(ops, j, k, placeholder, top + ops[j].bindings[k].offset - out.offset)
                top += -(-out.size // ALIGN) * ALIGN
                op = ops[i]
                clash = _clashes(op.accesses(), pending)[0]
        if clash:
            pending = []
        pending += op.accesses()
    if not top:
        return ops
    shadow = shadow_alloc(top)
    for j, op in enumerate(ops):
        if isinstance(op, Dispatch):
            for k, b in enumerate(op.bindings):
                if b.buffer is placeholder:
                    _move(ops, j, k, shadow, b.offset)
    return ops


def _move(ops: list, j: int, k: int, buffer, offset: int) -> None:
    b = ops[j].bindings[k]
    bindings = list(ops[j].bindings)
    bindings[k] = Binding(buffer, offset, b.size, b.writable)
    ops[j] = dataclasses.replace(ops[j], bindings=tuple(bindings))


__all__ = ["rename_war"]
