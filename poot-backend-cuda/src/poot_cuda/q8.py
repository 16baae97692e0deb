"""Q8PackedContraction on CUDA: the contraction of int8 activation rows with a packed
weight (the `fast` precision, poot.compiler.passes.precision), lowered by the shared
contraction schedules over PackedContraction's problem with `Problem.q8` set
(poot.codegen.lower.contraction.q8_problem): at decode the integer GEMV quantizes each
block of 32 by QuantizeI8's rule and multiplies the codes, four to a word, with the
weight's integers in exact int32 sums (dp4a), once per block scaled; wider problems
round the rows first and take the packed schedules (poot.codegen.lower.dot).

The shared lowerings declare the op nowhere (a target must choose it), so the CUDA table
declares it as its own for every format with integer codes, and `program_for` lowers it.
"""
from __future__ import annotations

from poot.codegen.lower.base import Sig
from poot.codegen.lower.contraction import q8_problem
from poot.codegen.lower.dot import contraction_program
from poot.codegen.lower.schedule import DotSchedule, dot_schedule
from poot.codegen.program import KernelProgram
from poot.compiler.passes.precision import integer_codes


def q8_formats(formats) -> frozenset[str]:
    """The packed formats whose contraction of int8 rows the backend declares: those
    whose values are scale * integer (+ offset), the formats `fast` quantizes rows for."""
    return frozenset(f for f in formats if integer_codes(f))


def q8_program(op, operands, out, features: frozenset,
               schedule: DotSchedule | None = None) -> KernelProgram:
    """The kernels of one Q8PackedContraction signature for a target of `features`."""
    features = frozenset(features)
    if schedule == dot_schedule(features):
        schedule = None               # named as the default's kernels are
    sig = Sig(op, tuple(operands), out, features, schedule)
    p = q8_problem(sig, None)
    return contraction_program(p, sig, lambda kb: sig.declare_all(kb, p.views))


__all__ = ["q8_formats", "q8_program"]
