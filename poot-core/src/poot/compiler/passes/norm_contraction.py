"""norm_contraction: an RMSNorm (a FusedRow of poot.ops.rms_norm's seven eqns over x and
a weight g) whose result only weight contractions of a few rows read as their activation
(bare, or as the heads of epilogues) goes into each of them:
NormedPackedContraction(weight, eps)(x, g, sources) or NormedDenseContraction(eps)(x, w,
g). A decode GEMV then takes the norm's sums of squares with the activations it reads
anyway: no norm kernel, no normed buffer. Only targets that declare the op get it (where
the GEMV can take the norm in)."""
from __future__ import annotations

from poot.compiler.passes.contraction_match import activation_readers
from poot.compiler.rewrite import Rewriter
from poot.compiler.view import GraphView, NoMatch
from poot.ir import region
from poot.ir.graph import Lit
from poot.ir.ops import (
    ContractionEpilogue,
    DenseContraction,
    FusedRow,
    NormedDenseContraction,
    NormedPackedContraction,
    PackedContraction,
)
from poot.ir.ops.composite import rms_norm_chain

NAME = "norm_contraction"
#: normed rows up to which the contractions take the norm (a decode step's; a prefill
#: chunk's norm stays one kernel that all its contractions read)
ROWS = 4
#: readers a norm may go into (an FFN's gate and up): where a contraction cannot take it
#: in (a K split), it runs apart once per reader, so q, k and v apart keep their one norm
READERS = 2


def run(graph, ctx):
    view, rw = GraphView(graph), Rewriter(graph)
    for e in view.eqns:
        if not isinstance(e.op, FusedRow):
            continue
        try:
            eps = rms_norm_eps(view, e)
            readers = activation_readers(view, e, (PackedContraction, DenseContraction),
                                         READERS, ROWS, "a norm")
        except NoMatch as why:
            ctx.record.kept(NAME, e.out, str(why))
            continue
        new = [(r, *_normed(r, e, eps)) for r in readers]
        refused = next(filter(None, (ctx.refusal(op, args, r, view) for r, op, args in new)),
                       None)
        if refused:
            ctx.record.kept(NAME, e.out, f"target refuses: {refused}")
            continue
        for r, op, args in new:
            rw.replace(r, op, args)
        rw.remove(e)
        ctx.record.rewrote(NAME, e.out, f"RMSNorm into {len(new)} contractions")
    return rw.commit()


def rms_norm_eps(view: GraphView, e) -> float:
    """eps of a FusedRow whose body is poot.ops.rms_norm(x, g, eps) over its two operands
    (x [..., K] F32, g [K] F32), else NoMatch."""
    body = e.op.body
    eqns = body.eqns()
    if len(e.inputs) != 2 or len(eqns) != 7:
        raise NoMatch("not a norm's two operands and seven eqns")
    shift = eqns[3]
    if not isinstance(shift.inputs[-1], Lit):
        raise NoMatch("no eps literal where rms_norm adds it")
    eps = float(shift.inputs[-1].value)
    types = [body.type_of(v) for v in body.inputs()]
    want = region(types, lambda b, x, g: rms_norm_chain(b, x, g, eps), "region")
    if str(want) != str(body):
        raise NoMatch("the region is not poot.ops.rms_norm's chain")
    return eps


def _normed(r, e, eps: float):
    """(op, operands) of reader `r` with norm `e` inside."""
    x, g = e.inputs
    epilogue = isinstance(r.op, ContractionEpilogue)
    head = r.op.head if epilogue else r.op
    n_head = r.op.n_head if epilogue else len(r.inputs)
    weight, rest = r.inputs[1:n_head], list(r.inputs[n_head:])
    if isinstance(head, DenseContraction):
        op, args = NormedDenseContraction(eps), [x, *weight, g]
    else:
        op, args = NormedPackedContraction(head.weight, eps), [x, g, *weight]
    if epilogue:
        return ContractionEpilogue(op, n_head + 1, r.op.body), args + rest
    return op, args
