"""Q8PackedContraction as a kernel backend's own op: the contraction of int8 activation
rows with a packed weight (the `fast` precision, poot.compiler.passes.precision),
lowered by the shared contraction schedules over PackedContraction's problem with
`Problem.q8` set (contraction.q8_problem): at decode the integer GEMV quantizes each
block of 32 by QuantizeI8's rule and multiplies the codes, four to a word, with the
weight's integers in exact int32 sums (`expr.Dot4`), once per block scaled; wider
problems round the rows first and take the packed schedules (poot.codegen.lower.dot).

The shared lowerings declare the op nowhere (a target must choose it): a backend whose
target prints Dot4 as one instruction (target.DOT2 or DOT4) declares it as its own for
`q8_formats` and lowers it in `KernelBackend.program_for` with `q8_program_for`.
"""
from __future__ import annotations

from poot.codegen.lower.base import Sig
from poot.codegen.lower.contraction import q8_problem
from poot.codegen.lower.dot import contraction_program
from poot.codegen.lower.schedule import DotSchedule, dot_schedule
from poot.codegen.program import KernelProgram
from poot.errors import LoweringError
from poot.formats import get_format
from poot.ir.ops import Q8PackedContraction


def q8_formats(formats) -> frozenset[str]:
    """The packed formats whose contraction of int8 rows a backend declares: those whose
    values are scale * integer (+ offset), the formats `fast` quantizes rows for."""
    return frozenset(f for f in formats if getattr(get_format(f), "integer_codes", False))


def q8_program(op, operands, out, features: frozenset,
               schedule: DotSchedule | None = None) -> KernelProgram:
    """The kernels of one Q8PackedContraction signature for a target of `features`."""
    features = frozenset(features)
    if schedule == dot_schedule(features):
        schedule = None               # named as the default's kernels are
    sig = Sig(op, tuple(operands), out, features, schedule)
    p = q8_problem(sig, None)
    return contraction_program(p, sig, lambda kb: sig.declare_all(kb, p.views))


def q8_program_for(backend, op, operands, out, device):
    """`KernelBackend.program_for` of a backend that declares Q8PackedContraction as its
    own: its compiled program (a lowering's refusal names the backend and device), None
    for every other op."""
    if not isinstance(op, Q8PackedContraction):
        return None
    try:
        program = q8_program(op, operands, out, backend.features(device),
                             backend.schedule(device))
    except LoweringError as exc:
        table = backend.capabilities(device)
        raise exc.on(table.backend, table.device) from None
    return backend.build(program, device)


__all__ = ["q8_formats", "q8_program", "q8_program_for"]
