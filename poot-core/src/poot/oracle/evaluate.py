"""evaluate(graph, inputs): the oracle. Primitives by rule, composites by definition."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from poot.dtypes import DType
from poot.errors import BindError, SlotRangeError
from poot.ir.builder import Builder
from poot.ir.graph import Graph, Lit, OutputKind
from poot.ir.ops.base import OpKind
from poot.ir.ops.composite import COLLECTIVES
from poot.ir.ops.compute import Scan
from poot.ir.types import StorageClass, TensorType, ValueId
from poot.oracle.rules import RULES

_definitions: dict[tuple, Graph] = {}


def definition(op: OpKind, in_types: Sequence[TensorType]) -> Graph:
    """The primitive graph a composite stands for, at these operand types (cached)."""
    key = (op, tuple(in_types))
    g = _definitions.get(key)
    if g is None:
        b = Builder(f"{op.name}.definition", compiler=True)
        params = [b.param(t) for t in in_types]
        b.result(op.define(b, params))
        g = _definitions[key] = b.finish()
    return g


def apply(op: OpKind, args: Sequence[np.ndarray], in_types: Sequence[TensorType],
          out_type: TensorType) -> np.ndarray:
    """Evaluate one op on arrays."""
    fn = RULES.get(type(op))
    if fn is not None:
        r = fn(op, list(args), list(in_types), out_type)
    else:
        if not op.composite:  # pragma: no cover - every primitive has a rule
            raise AssertionError(f"no oracle rule for {op.name}")
        (r,) = evaluate(definition(op, in_types), list(args), outputs="result")
    r = np.asarray(r)
    if r.dtype != out_type.dtype.numpy:
        r = r.astype(out_type.dtype.numpy)
    return r.reshape(out_type.shape)


def coerce_input(vid: ValueId, t: TensorType, value, what: str) -> np.ndarray:
    """Check (and for integer widths, safely convert) one bound input."""
    a = np.asarray(value)
    if a.shape != t.shape:
        raise BindError(f"{what} ({vid!r}) expects shape {t.shape}, got {a.shape}")
    if a.dtype != t.dtype.numpy:
        if t.dtype.is_int and a.dtype.kind in "iu":
            info = np.iinfo(t.dtype.numpy)
            if a.size and (a.min() < info.min or a.max() > info.max):
                raise BindError(f"{what} ({vid!r}): values do not fit {t.dtype}")
            a = a.astype(t.dtype.numpy)
        else:
            raise BindError(f"{what} ({vid!r}) expects dtype {t.dtype}, got numpy {a.dtype}; "
                            f"cast it first")
    return a


def check_slot(graph: Graph, vid: ValueId, a: np.ndarray, what: str) -> None:
    slot = graph.meta(vid).storage.slot
    lo, hi = slot.valid_range()
    if a.size == 0 or (lo is None and hi is None):  # a role without a range (any value)
        return
    # the common case in two reductions; NaN fails both tests and takes the full check
    if (lo is None or a.min() >= lo) and (hi is None or a.max() < hi):
        return
    # float roles (sampler inputs) are compared as floats, not truncated; NaN lies nowhere
    vals = a.astype(np.float64) if a.dtype.kind not in "iu" else a.astype(np.int64)
    if slot.kind.allows_negative_one:
        vals = vals[vals != -1]
        if vals.size == 0:
            return
    inside = np.ones(vals.shape, bool)
    if lo is not None:
        inside &= vals >= lo
    if hi is not None:
        inside &= vals < hi
    if not inside.all():
        raise SlotRangeError(f"{what}: {slot.kind.label} slot values must lie in "
                             f"[{lo}, {hi if hi is not None else '..'})"
                             f"{' or be -1' if slot.kind.allows_negative_one else ''}; "
                             f"got [{vals.min()}, {vals.max()}]")


def bind_inputs(graph: Graph, inputs) -> dict[ValueId, np.ndarray]:
    """Map inputs (a sequence in `graph.inputs()` order without Computed binders, or a
    mapping by ValueId or binder name) to checked arrays. Computed values are generated."""
    binders = [v for v in graph.inputs() if graph.meta(v).storage.cls is not StorageClass.COMPUTED]
    if isinstance(inputs, Mapping):
        by_name: dict[str, list[ValueId]] = {}
        for v in binders:
            by_name.setdefault(graph.meta(v).identity.label, []).append(v)
        given: dict[ValueId, object] = {}
        for k, val in inputs.items():
            if isinstance(k, ValueId):
                vid = k
            elif isinstance(k, str) and k in by_name:
                if len(by_name[k]) > 1:
                    raise BindError(f"input name {k!r} names {len(by_name[k])} inputs "
                                    f"{by_name[k]}; bind them by ValueId or in order")
                (vid,) = by_name[k]
            else:
                raise BindError(f"unknown input {k!r}; inputs are "
                                f"{[graph.meta(v).identity.label or repr(v) for v in binders]}")
            given[vid] = val
    else:
        seq = list(inputs)
        if len(seq) != len(binders):
            raise BindError(f"graph {graph.name} takes {len(binders)} inputs, got {len(seq)}")
        given = dict(zip(binders, seq))
    env: dict[ValueId, np.ndarray] = {}
    for v in binders:
        meta = graph.meta(v)
        what = f"input {meta.identity.label or repr(v)}"
        if v not in given:
            raise BindError(f"{what} ({meta.storage}, {meta.aval}) is not bound")
        a = coerce_input(v, meta.aval, given[v], what)
        if meta.storage.cls is StorageClass.SLOT:
            check_slot(graph, v, a, what)
        env[v] = a
    for v in graph.computed():
        gen = graph.computed_def(v)
        env[v] = apply(gen, [], [], gen.infer([]))
    return env


def evaluate(graph: Graph, inputs, outputs: str = "all") -> list[np.ndarray]:
    """Run the oracle. Returns the arrays of `graph.outputs()` in order
    (or just the result with outputs="result")."""
    env = bind_inputs(graph, inputs)
    steps = run_eqns(graph, env)
    for eqn, args in steps:  # a collective over several ranks: apply refuses it by name
        in_types = [graph.type_of(x.id) for x in eqn.inputs]
        steps.send(apply(eqn.op, args, in_types, graph.type_of(eqn.out)))
    return output_arrays(graph, env, outputs)


def output_arrays(graph: Graph, env: dict, outputs: str = "all") -> list[np.ndarray]:
    outs = graph.outputs()
    if outputs == "result":
        outs = [o for o in outs if o.kind is OutputKind.RESULT]
    return [env[o.value] for o in outs]


def run_eqns(graph: Graph, env: dict):
    """Evaluate the eqns into `env` (the bound inputs). A collective over more than one rank
    needs the other ranks: it is yielded as (eqn, operand arrays), and its result is sent
    back (poot.oracle.ranks evaluates several rank graphs this way)."""
    for e in graph.eqns():
        args = [np.asarray(x.value, x.dtype.numpy) if isinstance(x, Lit) else env[x.id]
                for x in e.inputs]
        if isinstance(e.op, COLLECTIVES) and e.op.ranks > 1:
            env[e.out] = yield e, args
            yield  # the send's own return; the loop's next() resumes here
            continue
        in_types = [x.type if isinstance(x, Lit) else graph.type_of(x.id) for x in e.inputs]
        with np.errstate(all="ignore"):
            env[e.out] = apply(e.op, args, in_types, graph.type_of(e.out))


def _scan(op, args, ins, out):
    """Scan's rule runs its body through the evaluator, so it lives beside it."""
    carry, *xs = args
    states = []
    for t in range(op.length):
        (carry,) = evaluate(op.body, [carry, *(x[t] for x in xs)], outputs="result")
        states.append(carry)
    return np.stack(states)


RULES[Scan] = _scan

__all__ = ["evaluate", "apply", "definition", "bind_inputs", "DType"]
