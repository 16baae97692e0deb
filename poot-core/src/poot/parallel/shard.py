"""The sharding pass: one traced graph and its weight splits -> one ordinary graph per rank.

Each value of the source graph becomes, on a rank, a *box* of it (a contiguous range per
axis, in the source's coordinates) and possibly a *partial sum* (the ranks' values add up to
it). The seeds are the weights' splits (poot.parallel.megatron: column-parallel Q/K/V and
gate/up rows, row-parallel output and down columns, vocabulary rows of the embedding and the
head); every eqn then maps its operands' boxes to its result's box by its op's rule:

- elementwise ops and MatMul's batch axes line their operands' boxes up; a whole operand
  meeting a split one is sliced to it on the rank (a bias, a broadcast mask);
- MatMul over a contraction axis both operands split alike gives a partial sum (the
  row-parallel projections); Reshape maps a box through its axis groups (heads x head_dim
  to the flat features, query heads to KV-group x queries) or is refused;
- a partial sum flows through the ops linear in it (Add of two partial sums, Mul or Div by a
  whole value, Neg, Reshape, Transpose, Slice, Broadcast, Sum) and is summed by an AllReduce
  where anything else reads it: so an AllReduce follows every row-parallel projection, just
  before the residual add;
- Gather from a table split along its gathered axis (the vocabulary-parallel embedding) reads
  only the ids the rank holds and is zero elsewhere: a partial sum;
- state (KV caches and pools) takes the box of what is written into it: each rank keeps the
  KV heads it computes;
- the result, split along one axis in rank order (the logits' vocabulary), is gathered by an
  AllGather along a leading axis (Transposes around it where the axis is not the first).
Everything else must see whole operands; what cannot be placed is refused with a ShardError
naming the op and the value. The rank graphs take the source's slots and state names and
sliced consts (`RankGraph.consts` gives each rank views of the source's arrays, not copies).
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from poot.errors import FormatError, ShardError
from poot.formats import PackedWeight
from poot.ir import ops as O
from poot.ir.builder import Builder, Ref
from poot.ir.graph import Graph, Lit, OutputKind
from poot.ir.types import StorageClass, TensorType, ValueId, WeightRef

Box = tuple[tuple[int, int], ...]

#: reshape groups larger than this are not mapped element by element
_GROUP_LIMIT = 1 << 24


@dataclass(frozen=True)
class Split:
    """One rank's share of a weight: elements [lo, hi) of logical axis `axis`."""

    axis: int
    lo: int
    hi: int


@dataclass(frozen=True)
class ConstSlice:
    """A rank's const: `source`'s array (a const label of the source graph) cut to [lo, hi)
    along `axis` (a numpy view)."""

    source: str
    axis: int
    lo: int
    hi: int

    def take(self, array: np.ndarray) -> np.ndarray:
        index = [slice(None)] * np.ndim(array)
        index[self.axis] = slice(self.lo, self.hi)
        return np.asarray(array)[tuple(index)]


class RankConsts(Mapping):
    """The const arrays of one rank: the source's, and views of the sliced ones."""

    def __init__(self, base: Mapping, slices: Mapping[str, ConstSlice]):
        self.base, self.slices = base, slices

    def __getitem__(self, label: str) -> np.ndarray:
        s = self.slices.get(label)
        return s.take(self.base[s.source]) if s is not None else self.base[label]

    def __iter__(self) -> Iterator[str]:
        yield from self.slices
        yield from (k for k in self.base if k not in self.slices)

    def __len__(self) -> int:
        return len(self.slices) + sum(1 for k in self.base if k not in self.slices)


@dataclass(frozen=True)
class RankGraph:
    """One rank's graph and the slices its consts are views of."""

    graph: Graph
    rank: int
    ranks: int
    slices: Mapping[str, ConstSlice]
    #: the part of each state (by name) the rank holds, in the source state's coordinates
    state: Mapping[str, Box]

    def state_part(self, name: str, array: np.ndarray) -> np.ndarray:
        """The rank's part of a whole state array (a view)."""
        return np.asarray(array)[tuple(slice(lo, hi) for lo, hi in self.state[name])]

    def consts(self, base: Mapping) -> RankConsts:
        return RankConsts(base, self.slices)


def shard(graph: Graph, splits: Callable[[int, str], Split | None], ranks: int,
          only: int | None = None) -> list[RankGraph]:
    """Rank graphs of `graph` for `ranks` ranks (just rank `only`'s if given); `splits(rank,
    tensor)` is the rank's share of a weight by its tensor name (None: whole on every rank)."""
    return [_Rank(graph, lambda name, r=r: splits(r, name), r, ranks).run()
            for r in (range(ranks) if only is None else (only,))]


@dataclass
class _Val:
    ref: Ref
    box: Box
    partial: bool = False


def _full(shape) -> Box:
    return tuple((0, d) for d in shape)


def _sizes(box: Box) -> tuple[int, ...]:
    return tuple(hi - lo for lo, hi in box)


class _Rank:
    def __init__(self, graph: Graph, split: Callable[[str], Split | None], rank: int,
                 ranks: int):
        self.g, self.split, self.rank, self.ranks = graph, split, rank, ranks
        self.b = Builder(f"{graph.name}.tp{rank}of{ranks}", compiler=True)
        self.env: dict[ValueId, _Val] = {}
        self.summed: dict[ValueId, _Val] = {}
        self.states: dict[ValueId, _Val] = {}
        self.slices: dict[str, ConstSlice] = {}
        self.bound: dict[tuple, _Val] = {}    # consts by (binder, source split)

    def fail(self, msg: str, vid: ValueId) -> ShardError:
        return ShardError(f"{self.g.name}: {msg}", dim=repr(vid), ranks=self.ranks)

    # -- binders -----------------------------------------------------------------------
    def run(self) -> RankGraph:
        g = self.g
        for v in g.inputs():
            meta = g.meta(v)
            cls = meta.storage.cls
            if cls in (StorageClass.SLOT, StorageClass.COMPUTED):
                gen = g.computed_def(v) if cls is StorageClass.COMPUTED else None
                self.env[v] = _Val(self.b.binder_like(meta, gen), _full(meta.aval.shape))
        # consts bind on first use (a packed weight's sources are cut by their PackedDequant);
        # state binds with the box of what is first written into it
        for e in g.eqns():
            self.env[e.out] = self.eqn(e)
        self.outputs()
        state = {self.g.meta(v).identity.label: x.box for v, x in self.states.items()}
        return RankGraph(self.b.finish(), self.rank, self.ranks, dict(self.slices), state)

    def const(self, vid: ValueId, split: Split | None = None, source_shape=None) -> _Val:
        """Bind a const whole, or cut along `split` (in the source array's own axis and
        elements, which for a packed source differ from the logical weight's)."""
        key = (vid, split)
        if key not in self.bound:
            self.bound[key] = self._bind_const(vid, split)
        return self.bound[key]

    def _bind_const(self, vid: ValueId, split: Split | None) -> _Val:
        meta = self.g.meta(vid)
        shape = meta.aval.shape
        if split is None:
            split = self._dense_split(vid)
        if split is None:
            return _Val(self.b.binder_like(meta), _full(shape))
        label = meta.identity.label
        local = list(shape)
        local[split.axis] = split.hi - split.lo
        cut = f"{label}[{split.axis}:{split.lo}:{split.hi}]"
        self.slices[cut] = ConstSlice(label, split.axis, split.lo, split.hi)
        w = meta.identity.weight
        ident = WeightRef(w.checkpoint, cut, _digest(w.payload, cut), w.format) \
            if w is not None else cut
        box = list(_full(shape))
        box[split.axis] = (split.lo, split.hi)
        return _Val(self.b.const(TensorType(tuple(local), meta.aval.dtype), ident), tuple(box))

    def _dense_split(self, vid: ValueId) -> Split | None:
        meta = self.g.meta(vid)
        label = meta.identity.label
        s = self.split(label) if label else None
        if s is not None and not 0 <= s.lo < s.hi <= meta.aval.shape[s.axis]:
            raise self.fail(f"split {s} of {label!r} lies outside its shape "
                            f"{meta.aval.shape}", vid)
        return s

    def get(self, vid: ValueId) -> _Val:
        got = self.env.get(vid)
        if got is not None:
            return got
        meta = self.g.meta(vid)
        if meta.storage.cls is StorageClass.CONST:
            got = self.env[vid] = self.const(vid)
            return got
        if meta.storage.cls is StorageClass.STATE:
            return self.state(vid, _full(meta.aval.shape))
        raise AssertionError(f"{vid!r} read before it is defined")  # pragma: no cover

    def state(self, vid: ValueId, box: Box) -> _Val:
        """The rank's state binder of `vid`, bound with `box` on first use."""
        got = self.states.get(vid)
        if got is None:
            meta = self.g.meta(vid)
            ref = self.b.binder_like(meta, aval=TensorType(_sizes(box), meta.aval.dtype))
            got = self.states[vid] = self.env[vid] = _Val(ref, box)
        return got

    def unbound_state(self, x) -> bool:
        return not isinstance(x, Lit) and x.id not in self.env and \
            self.g.meta(x.id).storage.cls is StorageClass.STATE

    # -- helpers -------------------------------------------------------------------------
    def emit(self, op, *args) -> Ref:
        return self.b.eqn(op, *(a.ref if isinstance(a, _Val) else a for a in args))

    def summed_of(self, vid: ValueId) -> _Val:
        """The value with its partial sums added up over the ranks (one AllReduce, shared
        by every reader)."""
        v = self.get(vid)
        if not v.partial:
            return v
        if vid not in self.summed:
            self.summed[vid] = _Val(self.emit(O.AllReduce(self.ranks), v), v.box)
        return self.summed[vid]

    def restrict(self, v: _Val, box: Box, vid: ValueId) -> _Val:
        """`v` sliced on the rank to `box` (which must lie inside v's box)."""
        ref = v.ref
        for axis, ((lo, hi), (nlo, nhi)) in enumerate(zip(v.box, box, strict=True)):
            if (lo, hi) == (nlo, nhi):
                continue
            if not lo <= nlo < nhi <= hi:
                raise self.fail(f"{vid!r} holds [{lo}, {hi}) of axis {axis} on rank "
                                f"{self.rank}, which needs [{nlo}, {nhi})", vid)
            ref = self.b.eqn(O.Slice(axis, nlo - lo, nhi - lo), ref)
        return _Val(ref, box, v.partial)

    def aligned(self, e, vals: list, shapes: list, out_shape) -> tuple[list, Box]:
        """Line the operands' boxes up on the broadcast axes of `out_shape`: every operand
        spanning an axis (not broadcast along it) holds the same part of it, a whole one is
        sliced to the split one's part. `shapes` are the operands' source shapes."""
        target = self.target(e, vals, shapes, out_shape)
        rank = len(out_shape)
        out = []
        for v, shape in zip(vals, shapes):
            if not isinstance(v, _Val):
                out.append(v)
                continue
            box = list(v.box)
            for j in range(len(shape)):
                i = j + rank - len(shape)
                if i >= 0 and shape[j] == out_shape[i]:
                    box[j] = target[i]
            out.append(self.restrict(v, tuple(box), e.out))
        return out, target

    def target(self, e, vals: list, shapes: list, out_shape) -> Box:
        """The part of each axis of `out_shape` the operands agree on (see `aligned`)."""
        rank = len(out_shape)
        target = []
        for i in range(rank):
            split = set()
            for v, shape in zip(vals, shapes):
                j = i - (rank - len(shape))
                if isinstance(v, _Val) and j >= 0 and shape[j] == out_shape[i] and \
                        v.box[j] != (0, out_shape[i]):
                    split.add(v.box[j])
            if len(split) > 1:
                raise self.fail(f"{e.op!r}: operands hold different parts {sorted(split)} of "
                                f"axis {i}", e.out)
            target.append(split.pop() if split else (0, out_shape[i]))
        return tuple(target)

    def shapes(self, e) -> list:
        return [() if isinstance(x, Lit) else self.g.type_of(x.id).shape for x in e.inputs]

    # -- eqns ------------------------------------------------------------------------------
    def eqn(self, e) -> _Val:
        rule = _RULES.get(type(e.op), _Rank.whole_rule)
        return rule(self, e)

    def operands(self, e, keep_partial=()) -> list:
        """The operands' values: partial sums summed unless `keep_partial` lists them (and
        no reader has summed them already)."""
        return [x if isinstance(x, Lit) else
                (self.get(x.id) if i in keep_partial and x.id not in self.summed
                 else self.summed_of(x.id)) for i, x in enumerate(e.inputs)]

    def whole_rule(self, e) -> _Val:
        args = []
        for x in e.inputs:
            if self.unbound_state(x):
                self.state(x.id, _full(self.g.type_of(x.id).shape))
            v = x if isinstance(x, Lit) else self.summed_of(x.id)
            if not isinstance(v, Lit) and v.box != _full(self.g.type_of(x.id).shape):
                raise self.fail(f"{e.op!r} reads {x.id!r} split on rank {self.rank} "
                                f"({v.box}); it has no sharded rule", x.id)
            args.append(v)
        return _Val(self.emit(e.op, *args), _full(self.g.type_of(e.out).shape))

    def elementwise(self, e) -> _Val:
        op = e.op
        out_shape = self.g.type_of(e.out).shape
        values = [i for i, x in enumerate(e.inputs) if not isinstance(x, Lit)]
        vals = self.operands(e, keep_partial=values)
        partial = [i for i in values if vals[i].partial]
        linear = False   # the op is linear in its partial operands, the others whole
        if partial and isinstance(op, O.Binary):
            if op.op in (O.BinaryOp.Add, O.BinaryOp.Sub):
                linear = partial == values
            elif op.op in (O.BinaryOp.Mul, O.BinaryOp.Div):
                linear = len(partial) == 1 and (op.op is O.BinaryOp.Mul or partial == [0])
        elif partial and isinstance(op, O.Unary):
            linear = op.op is O.UnaryOp.Neg
        # a partial sum is whole on every rank: meeting a split operand, it is summed too
        if partial and (not linear or self.target(e, vals, self.shapes(e), out_shape)
                        != _full(out_shape)):
            vals = self.operands(e)
        args, box = self.aligned(e, vals, self.shapes(e), out_shape)
        return _Val(self.emit(op, *args), box,
                    any(isinstance(v, _Val) and v.partial for v in args))

    def reshape(self, e) -> _Val:
        (v,) = self.operands(e, keep_partial=(0,))
        src = self.g.type_of(e.inputs[0].id).shape
        box = _reshape_box(src, v.box, e.op.shape)
        if box is None:
            raise self.fail(f"Reshape {src} -> {e.op.shape} cannot carry the part {v.box} "
                            f"rank {self.rank} holds", e.out)
        return _Val(self.emit(O.Reshape(_sizes(box)), v), box, v.partial)

    def transpose(self, e) -> _Val:
        (v,) = self.operands(e, keep_partial=(0,))
        return _Val(self.emit(e.op, v), tuple(v.box[p] for p in e.op.perm), v.partial)

    def slice(self, e) -> _Val:
        (v,) = self.operands(e, keep_partial=(0,))
        op = e.op
        axis = op.axis % len(v.box)
        lo, hi = v.box[axis]
        nlo, nhi = max(lo, op.start), min(hi, op.end)
        if nlo >= nhi:
            raise self.fail(f"{op!r} takes nothing of the part [{lo}, {hi}) rank {self.rank} "
                            f"holds", e.out)
        box = list(v.box)
        box[axis] = (nlo - op.start, nhi - op.start)
        ref = v.ref if (nlo, nhi) == (lo, hi) else self.emit(O.Slice(axis, nlo - lo, nhi - lo), v)
        return _Val(ref, tuple(box), v.partial)

    def broadcast(self, e) -> _Val:
        (v,) = self.operands(e, keep_partial=(0,))
        shape = e.op.shape
        src = self.g.type_of(e.inputs[0].id).shape
        box = [(0, d) for d in shape]
        for j, d in enumerate(src):
            i = j + len(shape) - len(src)
            if d == shape[i]:
                box[i] = v.box[j]
        return _Val(self.emit(O.Broadcast(_sizes(box)), v), tuple(box), v.partial)

    def reduce(self, e) -> _Val:
        op = e.op
        linear = op.op is O.ReduceOp.Sum
        (v,) = self.operands(e, keep_partial=(0,) if linear else ())
        axis = op.axis % len(v.box)
        split = v.box[axis] != (0, self.g.type_of(e.inputs[0].id).shape[axis])
        if split and not linear:
            raise self.fail(f"{op!r} over an axis split across ranks", e.out)
        box = list(v.box)
        if op.keepdim:
            box[axis] = (0, 1)
        else:
            del box[axis]
        return _Val(self.emit(op, v), tuple(box), v.partial or split)

    def concat(self, e) -> _Val:
        axis = e.op.axis % self.g.type_of(e.out).rank
        known = [self.summed_of(x.id) for x in e.inputs if not self.unbound_state(x)]
        for x in e.inputs:
            if self.unbound_state(x):
                box = list(known[0].box) if known else list(_full(self.g.type_of(x.id).shape))
                box[axis] = (0, self.g.type_of(x.id).shape[axis])
                self.state(x.id, tuple(box))
        vals = [self.summed_of(x.id) for x in e.inputs]
        for x, v in zip(e.inputs, vals):
            if v.box[axis] != (0, self.g.type_of(x.id).shape[axis]):
                raise self.fail(f"{e.op!r} along an axis split across ranks", x.id)
        out_shape = list(self.g.type_of(e.out).shape)
        # line up every axis but the concatenated one
        per_axis = []
        for i in range(len(out_shape)):
            if i == axis:
                per_axis.append((0, out_shape[i]))
                continue
            split = {v.box[i] for v in vals} - {(0, out_shape[i])}
            if len(split) > 1:
                raise self.fail(f"{e.op!r}: operands hold different parts of axis {i}", e.out)
            per_axis.append(split.pop() if split else (0, out_shape[i]))
        args = []
        for x, v in zip(e.inputs, vals):
            box = list(per_axis)
            box[axis] = v.box[axis]
            args.append(self.restrict(v, tuple(box), x.id))
        return _Val(self.emit(e.op, *args), tuple(per_axis))

    def matmul(self, e) -> _Val:
        a, b = self.operands(e, keep_partial=(0, 1))
        if a.partial and b.partial:
            a, b = self.operands(e, keep_partial=(0,))
        out = self.g.type_of(e.out).shape
        ta, tb = (self.g.type_of(x.id).shape for x in e.inputs)
        fa, fb = _full(ta), _full(tb)
        if (a.partial or b.partial) and (a.box[:-1] != fa[:-1] or
                                         b.box[:-2] + b.box[-1:] != fb[:-2] + fb[-1:]):
            a, b = self.operands(e)    # a partial sum meeting a split operand is summed
        ka, kb = a.box[-1], b.box[-2]
        whole = (0, ta[-1])
        if ka != kb:
            if ka == whole:
                a = self.restrict(a, a.box[:-1] + (kb,), e.out)
            elif kb == whole:
                b = self.restrict(b, b.box[:-2] + (ka,) + b.box[-1:], e.out)
            else:
                raise self.fail(f"MatMul operands hold different parts {ka}, {kb} of the "
                                f"contraction", e.out)
        k = a.box[-1]
        (a, b), box = self.aligned_batch(e, [a, b], [ta, tb], out[:-2])
        box = box + (a.box[-2], b.box[-1])
        if k != whole and box != _full(out):
            raise self.fail(f"MatMul over a split contraction whose result is split too "
                            f"({box})", e.out)
        return _Val(self.emit(e.op, a, b), box, a.partial or b.partial or k != whole)

    def aligned_batch(self, e, vals, shapes, batch):
        """`aligned` over MatMul's batch axes (all but the last two of each operand)."""
        heads = [_Val(v.ref, v.box[:-2], v.partial) for v in vals]
        target = self.target(e, heads, [s[:-2] for s in shapes], batch)
        out = []
        for v, shape in zip(vals, shapes):
            box = list(v.box)
            for j in range(len(shape) - 2):
                i = j + len(batch) - (len(shape) - 2)
                if shape[j] == batch[i]:
                    box[j] = target[i]
            out.append(self.restrict(v, tuple(box), e.out))
        return out, target

    def gather(self, e) -> _Val:
        src, idx = self.operands(e)
        axis = e.op.axis % len(src.box)
        lo, hi = src.box[axis]
        box = src.box[:axis] + idx.box + src.box[axis + 1:]
        if (lo, hi) == (0, self.g.type_of(e.inputs[0].id).shape[axis]):
            return _Val(self.emit(e.op, src, idx), box)
        if axis:
            raise self.fail("a table split along an inner gathered axis", e.out)
        # the rank holds table rows [lo, hi): ids elsewhere read row 0 and are zeroed
        i32 = idx.ref.dtype
        inside = self.emit(O.Binary(O.BinaryOp.And),
                           self.emit(O.Binary(O.BinaryOp.Ge), idx, Lit(lo, i32)),
                           self.emit(O.Binary(O.BinaryOp.Ge), Lit(hi - 1, i32), idx))
        local = self.emit(O.Select(), inside, self.emit(O.Binary(O.BinaryOp.Sub), idx,
                                                        Lit(lo, i32)), Lit(0, i32))
        rows = self.emit(e.op, src, local)
        shape = _sizes(box)
        mask = self.b.eqn(O.Reshape(idx.ref.shape + (1,) * (len(shape) - axis -
                                                            len(idx.ref.shape))), inside)
        out = self.emit(O.Select(), mask, rows, Lit(0.0, src.ref.dtype))
        return _Val(out, box, True)

    def update(self, e) -> _Val:
        """DynamicUpdateSlice (axis) and ScatterUpdate (axis 0): state takes the update's
        box on every other axis."""
        axis = e.op.axis if isinstance(e.op, O.DynamicUpdateSlice) else 0
        tgt, upd = e.inputs[0], e.inputs[1]
        u = self.summed_of(upd.id)
        shape = self.g.type_of(tgt.id).shape
        axis %= len(shape)
        if self.unbound_state(tgt):
            box = list(u.box) if isinstance(e.op, O.DynamicUpdateSlice) else \
                [(0, shape[0])] + list(u.box[1:])
            box[axis] = (0, shape[axis])
            self.state(tgt.id, tuple(box))
        t = self.summed_of(tgt.id)
        want = list(t.box)
        if isinstance(e.op, O.DynamicUpdateSlice):
            want[axis] = u.box[axis]
        else:
            want[0] = u.box[0]
        u = self.restrict(u, tuple(want), e.out)
        rest = [self.summed_of(x.id) if not isinstance(x, Lit) else x for x in e.inputs[2:]]
        return _Val(self.emit(e.op, t, u, *rest), t.box)

    def dequant(self, e) -> _Val:
        pw: PackedWeight = e.op.weight
        label = self.g.meta(e.inputs[0].id).identity.label or ""
        roles = [s.role for s in pw.sources()]
        name = next((label[:-len(r) - 1] for r in roles if label.endswith(":" + r)), label)
        s = self.split(name)
        if s is None:
            args = [self.get(x.id) for x in e.inputs]
            return _Val(self.emit(e.op, *args), _full(pw.shape))
        n, k = pw.shape
        local = (s.hi - s.lo, k) if s.axis == 0 else (n, s.hi - s.lo)
        cut = PackedWeight(pw.format, local, pw.attrs)
        try:
            cut_sources = cut.sources()
        except FormatError as err:
            raise ShardError(f"{name}: {pw.format} source cannot be cut to {local} for "
                             f"elements [{s.lo}, {s.hi}) of axis {s.axis}: {err}", dim=name,
                             ranks=self.ranks) from None
        args = []
        for x, old, new in zip(e.inputs, pw.sources(), cut_sources, strict=True):
            args.append(self.const(x.id, _source_split(pw, s, old.type.shape, new.type.shape,
                                                       name, self.ranks)))
        box = [(0, n), (0, k)]
        box[s.axis] = (s.lo, s.hi)
        return _Val(self.emit(O.PackedDequant(cut), *args), tuple(box))

    # -- outputs ---------------------------------------------------------------------------
    def outputs(self) -> None:
        for o in self.g.outputs():
            if o.kind is OutputKind.STATE_NEXT:
                st = self.states.get(o.input) or self.state(
                    o.input, _full(self.g.type_of(o.input).shape))
                v = self.restrict(self.summed_of(o.value), st.box, o.value)
                self.b.state_next(st.ref, v.ref)
                continue
            ref = self.gathered(o.value)
            if o.kind is OutputKind.RESULT:
                self.b.result(ref)
            elif o.kind is OutputKind.WITNESS:
                self.b.witness(ref, o.label)
            else:
                self.b.export(ref, o.boundary.name)

    def gathered(self, vid: ValueId) -> Ref:
        """The whole value on every rank: an AllGather where it is split along one axis in
        rank order and equal parts."""
        v = self.summed_of(vid)
        shape = self.g.type_of(vid).shape
        split = [i for i, r in enumerate(v.box) if r != (0, shape[i])]
        if not split:
            return v.ref
        part = shape[split[0]] // self.ranks
        if len(split) > 1 or shape[split[0]] % self.ranks or \
                v.box[split[0]] != (self.rank * part, (self.rank + 1) * part):
            raise self.fail(f"output {vid!r} is split as {v.box} on rank {self.rank}, not in "
                            f"equal parts of one axis in rank order", vid)
        axis = split[0]
        if axis == 0:
            return self.b.eqn(O.AllGather(self.ranks, 0), v.ref)
        perm = (axis,) + tuple(i for i in range(len(shape)) if i != axis)
        back = tuple(int(i) for i in np.argsort(perm))
        whole = self.b.eqn(O.AllGather(self.ranks, 0), self.b.eqn(O.Transpose(perm), v.ref))
        return self.b.eqn(O.Transpose(back), whole)


def _source_split(pw: PackedWeight, s: Split, old, new, name: str, ranks: int) -> Split | None:
    """How a packed source array is cut for a split of its weight: rows with the weight's
    rows, columns in proportion to the weight's (whole blocks only), or not at all where the
    source does not depend on that axis."""
    if tuple(old) == tuple(new):
        return None
    n, k = pw.shape
    if len(old) == 2 and s.axis == 0 and old[0] == n and old[1] == new[1]:
        return Split(0, s.lo, s.hi)
    if len(old) == 2 and s.axis == 1 and old[0] == new[0] and \
            (s.lo * old[1]) % k == 0 and (s.hi * old[1]) % k == 0 and \
            (s.hi - s.lo) * old[1] // k == new[1]:
        return Split(1, s.lo * old[1] // k, s.hi * old[1] // k)
    raise ShardError(f"{name}: {pw.format} source {tuple(old)} cannot be cut to {tuple(new)} "
                     f"for elements [{s.lo}, {s.hi}) of axis {s.axis}", dim=name, ranks=ranks)


def _digest(payload: str, cut: str) -> str:
    return hashlib.blake2b(f"{payload}|{cut}".encode(), digest_size=16).hexdigest()


def _reshape_box(src, box: Box, dst) -> Box | None:
    """The box of `dst` holding the elements `box` holds of `src`, or None if none does."""
    out: list = []
    for ia, oa in _groups(src, dst):
        whole = all(box[i] == (0, src[i]) for i in ia)
        if whole:
            out += [(0, dst[j]) for j in oa]
            continue
        size = int(np.prod([src[i] for i in ia]))
        if size > _GROUP_LIMIT:
            return None
        mask = np.zeros([src[i] for i in ia], bool)
        mask[tuple(slice(*box[i]) for i in ia)] = True
        m = mask.reshape([dst[j] for j in oa])
        rng = []
        for axis in range(m.ndim):
            hit = np.nonzero(m.any(axis=tuple(x for x in range(m.ndim) if x != axis)))[0]
            rng.append((int(hit[0]), int(hit[-1]) + 1))
        if m.sum() != np.prod([hi - lo for lo, hi in rng]) or \
                not m[tuple(slice(*r) for r in rng)].all():
            return None
        out += rng
    return tuple(out)


def _groups(src, dst) -> list[tuple[list[int], list[int]]]:
    """Axis groups of equal element count that a reshape maps onto each other."""
    groups, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        ia, oa, pi, pj = [], [], 1, 1
        if i < len(src):
            ia.append(i)
            pi *= src[i]
            i += 1
        if j < len(dst):
            oa.append(j)
            pj *= dst[j]
            j += 1
        while pi != pj:
            if pi < pj:
                ia.append(i)
                pi *= src[i]
                i += 1
            else:
                oa.append(j)
                pj *= dst[j]
                j += 1
        groups.append((ia, oa))
    return groups


_RULES = {
    O.Unary: _Rank.elementwise, O.Binary: _Rank.elementwise, O.Select: _Rank.elementwise,
    O.Cast: _Rank.elementwise, O.Reshape: _Rank.reshape, O.Transpose: _Rank.transpose,
    O.Slice: _Rank.slice, O.Broadcast: _Rank.broadcast, O.Reduce: _Rank.reduce,
    O.Concat: _Rank.concat, O.MatMul: _Rank.matmul, O.Gather: _Rank.gather,
    O.DynamicUpdateSlice: _Rank.update, O.ScatterUpdate: _Rank.update,
    O.PackedDequant: _Rank.dequant,
}

__all__ = ["shard", "Split", "RankGraph", "RankConsts", "ConstSlice"]
