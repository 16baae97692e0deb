"""The attention rewrite: the masked-softmax chain between two matmuls (exactly
poot.ir.ops.attention_chain, what poot.ops.attention_masked records), for decode and
prefill, with GQA, becomes one Attention(scale) with operands [q, k, v, mask].

The policy decides (attention="never", shape limits) and the target must allow it.
"""
from __future__ import annotations

from poot.compiler.match import match_definition
from poot.compiler.rewrite import Rewriter
from poot.compiler.view import GraphView, NoMatch
from poot.ir.ops import Attention, Binary, BinaryOp, MatMul, Reshape, Transpose, Unary, UnaryOp


def guess(view: GraphView, root) -> tuple[Attention, list]:
    """(Attention(scale), [q, k, v, mask]) read along the chain from its last Reshape back."""
    pv = view.defined_by(root.inputs[0], MatMul, "the attention output")
    p = view.defined_by(pv.inputs[0], Reshape, "the probabilities")
    div = view.defined_by(p.inputs[0], Binary, "the softmax")
    ex = view.defined_by(div.inputs[0], Unary, "exp")
    sub = view.defined_by(ex.inputs[0], Binary, "scores - max")
    masked = view.defined_by(sub.inputs[0], Binary, "the masked scores")
    if (div.op.op, ex.op.op, sub.op.op, masked.op.op) != (
            BinaryOp.Div, UnaryOp.Exp, BinaryOp.Sub, BinaryOp.Add):
        raise NoMatch("not exp(scores + mask - max) / sum")
    sc = view.defined_by(view.defined_by(masked.inputs[0], Reshape, "scores").inputs[0],
                         Binary, "scaled scores")
    qk = view.defined_by(sc.inputs[0], MatMul, "q k^T")
    q = view.value(view.defined_by(qk.inputs[0], Reshape, "grouped q"), 0)
    k = view.value(view.defined_by(qk.inputs[1], Transpose, "k^T"), 0)
    scale = view.literal(sc, 1).value
    return Attention(scale), [q, k, view.value(pv, 1), view.value(masked, 1)]


def over_limit(policy, view: GraphView, q, k) -> str | None:
    keys, dim = view.type_of(k).shape[-2], view.type_of(q).shape[-1]
    if policy.attention_max_keys is not None and keys > policy.attention_max_keys:
        return f"{keys} keys exceed policy.attention_max_keys={policy.attention_max_keys}"
    if policy.attention_max_head_dim is not None and dim > policy.attention_max_head_dim:
        return f"head dim {dim} exceeds policy.attention_max_head_dim=" \
               f"{policy.attention_max_head_dim}"
    return None


def candidates(view: GraphView):
    """Reshapes of a MatMul whose left operand is a reshaped softmax: the chain's root."""
    for e in view.eqns:
        if isinstance(e.op, Reshape):
            mm = view.producer(e.inputs[0].id)
            if mm is not None and isinstance(mm.op, MatMul):
                p = view.producer(mm.inputs[0].id)
                if p is not None and isinstance(p.op, Reshape):
                    yield e


def run(graph, ctx):
    view, rw = GraphView(graph), Rewriter(graph)
    for e in candidates(view):
        try:
            op, args = guess(view, e)
            chain = match_definition(view, op, args, e)
        except NoMatch as why:
            ctx.record.kept("Attention", e.out, str(why))
            continue
        if rw.claimed(c.out for c in chain):
            continue
        why = ("policy.attention is 'never'" if ctx.policy.attention == "never" else
               over_limit(ctx.policy, view, args[0], args[1]))
        refused = why or ctx.refusal(op, args, e, view)
        if refused:
            ctx.record.kept("Attention", e.out, refused if why else f"target refuses: {refused}")
            continue
        rw.replace(e, op, args, chain)
        hq, hkv = view.type_of(args[0]).shape[-3], view.type_of(args[1]).shape[-3]
        ctx.record.rewrote("Attention", e.out, f"{len(chain)} eqns -> Attention "
                           f"(T={view.type_of(args[0]).shape[-2]}, "
                           f"S={view.type_of(args[1]).shape[-2]}, Hq={hq}, Hkv={hkv})")
    return rw.commit()
