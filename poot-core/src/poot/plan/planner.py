"""make_plan: turn a graph and a target into a Plan (see poot.plan).

The walk over the eqns decides, for each value, where it lives:
- a const or computed binder, or an eqn the backend folds at bind time: a weight region;
- a slot or state binder: its own region at a stable address;
- Reshape of a contiguous value: an alias (same bytes, new type), no dispatch;
- Slice of a contiguous value that keeps one contiguous run of its bytes (only size-1
  dims before its axis), starting on an ALIGN boundary: an alias at a byte offset, no
  dispatch, unless the slice reaches an output;
- Transpose or Slice whose every reader accepts strided operands: a strided view, no
  dispatch;
- DynamicUpdateSlice / ScatterUpdate / RopeScatter / RopeUpdateSlice / TransposedUpdateSlice
  producing a state_out
  from its own state_in binder, with no later reader of state_in: in place in the state
  buffer (donation);
- anything else: an arena block, live from its eqn to its last reader.
On a backend that `inlines_composites` (the reference), composites are first checked
against its table and then replaced by their primitive definitions (poot.plan.inline), so
a packed contraction's weight is decoded once at bind time.
"""
from __future__ import annotations

import math

from poot.contract import ALIGN, ARENA, Copy, Lowering, Note, Place, Plan, Region, Step, WeightSpec
from poot.contract import Backend, Device
from poot.errors import GraphError
from poot.ir import ops as O
from poot.ir.graph import Eqn, Graph, Lit, OutputKind, Value
from poot.ir.types import StorageClass, TensorType, ValueId
from poot.plan.arena import Interval, assign_offsets
from poot.plan.inline import has_composites, inline_composites
from poot.plugin import get_backend, select_backend

_IN_PLACE_OPS = (O.DynamicUpdateSlice, O.ScatterUpdate, O.RopeScatter, O.RopeUpdateSlice,
                 O.TransposedUpdateSlice)


def collective_lowering(eqn) -> Lowering:
    """A collective is no kernel: a step of its own (a cut between the kernels before and
    after it) that the runtime's communicator runs; `program` is the op."""
    return Lowering(eqn.op.name, f"{eqn.op.ranks} ranks", eqn.op, extra={"collective": True})


def resolve_target(obj, target) -> tuple[Graph, Backend, Device]:
    """The graph to plan and the (backend, device) to plan it for."""
    graph = obj if isinstance(obj, Graph) else getattr(obj, "graph", None)
    if not isinstance(graph, Graph):
        raise TypeError(f"plan takes a Graph or a compiled result with .graph, "
                        f"not {type(obj).__name__}")
    if target is None and not isinstance(obj, Graph):
        backend = getattr(obj, "backend", None)
        if backend is not None:
            target = (backend, getattr(obj, "device", None))
    if isinstance(target, tuple):
        backend, device = target
        backend = get_backend(backend) if isinstance(backend, str) else backend
        return graph, backend, device or backend.default_device()
    if isinstance(target, Backend):
        return graph, target, target.default_device()
    backend, device = select_backend(target)
    return graph, backend, device


def make_plan(obj, target=None) -> Plan:
    graph, backend, device = resolve_target(obj, target)
    # a compile result's table declares the collectives where it was compiled with a
    # communicator; a graph's own target table does not
    table = getattr(obj, "table", None) or backend.capabilities(device)
    for e in graph.eqns():
        if isinstance(e.op, O.COLLECTIVES):
            table.check_eqn(e, graph)
    if backend.inlines_composites and has_composites(graph):
        table = backend.capabilities(device)
        for e in graph.eqns():  # the composite itself must be declared: refuse it here
            if e.op.composite and not isinstance(e.op, O.COLLECTIVES):
                table.check_eqn(e, graph)
        graph = inline_composites(graph)
    return _Planner(graph, backend, device).run()


def storage_bytes(t: TensorType) -> int:
    """Bytes a tensor occupies in a buffer: one element per numpy item (F4E2M1 takes a
    byte per element, as the oracle holds it)."""
    return t.size * t.dtype.itemsize


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


class _Planner:
    def __init__(self, graph: Graph, backend: Backend, device: Device):
        self.g, self.backend, self.device = graph, backend, device
        self.eqns = graph.eqns()
        self.places: dict[ValueId, Place] = {}
        self.weights: dict[ValueId, WeightSpec] = {}
        self.root: dict[ValueId, ValueId] = {}        # alias/view -> the value owning bytes
        self.regions: dict[str, Region] = {}
        self.weight_region: dict[int, str] = {}       # id(WeightSpec) -> region name
        self.steps: list[Step] = []
        self.notes: list[Note] = []
        self.arena_values: list[ValueId] = []
        self.state_out = {out: st for st, out in graph.state()}
        self.view_strides: dict[ValueId, tuple[int, ...]] = {}   # element strides of views
        self.view_offset: dict[ValueId, int] = {}                # element offset of views
        self.folded: dict[tuple, WeightSpec] = {}

    # -- the walk ------------------------------------------------------------------
    def run(self) -> Plan:
        self.lowerings = [collective_lowering(e) if isinstance(e.op, O.COLLECTIVES) else
                          self.backend.lower(e, self.g, self.device) for e in self.eqns]
        self.users = self._users()
        self._bind_inputs()
        self.last_read = self._last_reads()
        for i, e in enumerate(self.eqns):
            self._plan_eqn(i, e)
        intervals = self._intervals()
        offsets, size = assign_offsets(intervals)
        self.regions[ARENA] = Region(ARENA, "arena", size)
        for v in self.arena_values:
            self.places[v] = Place(ARENA, offsets[v], self.g.type_of(v))
        self._resolve_arena_places()
        outputs, copies, state = self._outputs()
        return Plan(self.g, self.backend, self.device, self._final_steps(), copies,
                    self._final_notes(), self.regions, dict(self.places), outputs, state,
                    unshared_bytes=sum(iv.nbytes for iv in intervals),
                    intervals={iv.key: (iv.start, iv.end) for iv in intervals})

    def _users(self) -> dict[ValueId, list[int]]:
        users: dict[ValueId, list[int]] = {}
        for i, e in enumerate(self.eqns):
            for v in e.value_inputs():
                users.setdefault(v, []).append(i)
        return users

    def _bind_inputs(self) -> None:
        g = self.g
        for v in g.inputs():
            meta = g.meta(v)
            cls = meta.storage.cls
            label = meta.identity.label or f"v{v.index}"
            if cls is StorageClass.CONST:
                self.weights[v] = WeightSpec(meta.aval, binder=v, ref=meta.identity.weight,
                                             representation=str(meta.aval))
            elif cls is StorageClass.COMPUTED:
                gen = g.computed_def(v)
                self.weights[v] = WeightSpec(meta.aval, op=gen, representation="computed")
            elif cls in (StorageClass.SLOT, StorageClass.STATE):
                kind = "slot" if cls is StorageClass.SLOT else "state"
                name = f"{kind}:{label}"
                if name in self.regions:
                    raise GraphError(f"{g.name}: two {kind} binders are named {label!r}; the "
                                     f"executor addresses {kind}s by name, so name them apart")
                self.regions[name] = Region(name, kind, storage_bytes(meta.aval), value=v)
                self.places[v] = Place(name, 0, meta.aval)
            else:
                raise GraphError(f"{g.name}: binder {v!r} has Device storage (a region body "
                                 f"parameter); only whole graphs can be planned")

    def _last_reads(self) -> dict[ValueId, int]:
        return {v: max(ix) for v, ix in self.users.items()}

    def _plan_eqn(self, i: int, e: Eqn) -> None:
        vins = e.value_inputs()
        if isinstance(e.op, O.Reshape) and self._contiguous(vins[0]) or self._same_cast(e):
            self._alias(i, e, vins[0], "alias")
            return
        run = self._slice_run(e)
        if run is not None:
            self._alias(i, e, vins[0], "alias", offset=run)
            return
        if isinstance(e.op, (O.Transpose, O.Slice)) and self._view_ok(e):
            self._alias(i, e, vins[0], "view", *self._view_of(e.op, vins[0]))
            return
        if all(v in self.weights for v in vins) and not isinstance(e.op, O.COLLECTIVES):
            rep = self.backend.bind_time(e, self.g, self.device)
            if rep is not None:
                self.weights[e.out] = self._folded(e, rep)
                self.notes.append(Note(i, e, "bind", None))
                return
        lw = self.lowerings[i]
        inplace = self._donates(i, e)
        if inplace:
            self.root[e.out] = vins[0]
        else:
            self.arena_values.append(e.out)
        self.steps.append(Step(i, e, lw, (), None, inplace))  # places filled in later

    def _folded(self, e: Eqn, rep: str) -> WeightSpec:
        """The folded value of a constant eqn; the same op on the same weights (a tied
        embedding decoded for its gather and for the head) is one WeightSpec, one buffer."""
        ops = tuple(x if isinstance(x, Lit) else self.weights[x.id] for x in e.inputs)
        key = (e.op, rep, tuple((x.value, x.dtype) if isinstance(x, Lit) else id(x)
                                for x in ops))
        spec = self.folded.get(key)
        if spec is None:
            spec = self.folded[key] = WeightSpec(self.g.type_of(e.out), op=e.op, operands=ops,
                                                 representation=rep)
        return spec

    # -- aliases and views ------------------------------------------------------------
    def _same_cast(self, e: Eqn) -> bool:
        """A Cast to the dtype its operand already has changes nothing: an alias (the
        oracle returns the operand itself), so an f32 weight is not copied to "widen" it."""
        return (isinstance(e.op, O.Cast) and isinstance(e.inputs[0], Value)
                and self.g.type_of(e.inputs[0].id).dtype is e.op.to
                and self._contiguous(e.inputs[0].id))

    def _contiguous(self, v: ValueId) -> bool:
        return v not in self.view_strides

    def _stride_of(self, v: ValueId) -> tuple[int, ...]:
        return self.view_strides.get(v) or contiguous_strides(self.g.type_of(v).shape)

    def _view_of(self, op, src: ValueId) -> tuple[tuple[int, ...], int]:
        """Element strides and offset of a Transpose or Slice of `src`, as a view."""
        strides, offset = self._stride_of(src), self.view_offset.get(src, 0)
        if isinstance(op, O.Transpose):
            return tuple(strides[p] for p in op.perm), offset
        axis = op.axis % len(strides)
        return strides, offset + op.start * strides[axis]

    def _slice_run(self, e: Eqn) -> int | None:
        """The element offset of a Slice that may alias its operand's bytes: the operand is
        contiguous and the result one contiguous run of it (only size-1 dims before the
        axis); None where it stays a copy or a strided view."""
        if not isinstance(e.op, O.Slice) or not isinstance(e.inputs[0], Value):
            return None
        src = e.inputs[0].id
        t = self.g.type_of(src)
        axis = e.op.axis % t.rank
        if (not self._contiguous(src) or math.prod(t.shape[:axis]) != 1
                or not self.g.type_of(e.out).size):
            return None
        offset = self.view_offset.get(src, 0) + e.op.start * math.prod(t.shape[axis + 1:])
        # a contiguous place starts on an ALIGN boundary of its buffer, as arena places do:
        # GPU runtimes bind storage buffers only at aligned offsets
        if offset * t.dtype.itemsize % ALIGN or self._feeds_output(e.out):
            return None
        return offset

    def _feeds_output(self, v: ValueId) -> bool:
        """v is an output or reaches one through the Reshapes and Casts that alias it.
        An output keeps bytes of its own: it is read after the step's end-of-step copies
        into state buffers, which could overwrite or overlap a root it aliased."""
        return self._is_output(v) or any(
            (isinstance(r.op, O.Reshape) or self._same_cast(r)) and self._feeds_output(r.out)
            for r in (self.eqns[j] for j in self.users.get(v, [])))

    def _view_ok(self, e: Eqn) -> bool:
        """A Transpose or Slice becomes a strided view when every reader's kernel takes
        strided operands and nothing else (an alias, an output, a state copy) needs its
        bytes."""
        if self._is_output(e.out):
            return False
        readers = self.users.get(e.out, [])
        return bool(readers) and all(
            self.lowerings[j].strided_inputs and not isinstance(self.eqns[j].op, O.Reshape)
            for j in readers)

    def _alias(self, i, e, src: ValueId, kind: str, strides=None, offset=None) -> None:
        """e.out takes src's bytes, at `offset` elements into its root (by default where
        src starts: a Reshape or same-dtype Cast keeps the order of the elements)."""
        self.root[e.out] = self.root.get(src, src)
        if strides is not None:
            self.view_strides[e.out] = strides
        offset = self.view_offset.get(src, 0) if offset is None else offset
        if offset:
            self.view_offset[e.out] = offset
        if src in self.weights:
            # still a constant for folding, but its bytes are its root weight's
            self.weights[e.out] = WeightSpec(self.g.type_of(e.out), op=e.op,
                                             operands=(self.weights[src],),
                                             representation=kind)
        self.notes.append(Note(i, e, kind, None))

    def _is_output(self, v: ValueId) -> bool:
        return any(o.value == v for o in self.g.outputs())

    # -- donation ------------------------------------------------------------------------
    def _donates(self, i: int, e: Eqn) -> bool:
        """The donate contract: state_out = update(state_in, ...) with state_in read by
        nothing after this eqn, so the update may happen in the state buffer itself."""
        if not isinstance(e.op, _IN_PLACE_OPS) or not isinstance(e.inputs[0], Value):
            return False
        base = e.inputs[0].id
        if self.state_out.get(e.out) != base:
            return False
        aliases = self._aliases_of(base)
        if any(x.id in aliases for x in e.inputs[1:] if isinstance(x, Value)):
            return False   # an operand in the buffer being updated could change as it is read
        readers_after = [j for v in aliases for j in self.users.get(v, []) if j > i]
        return not readers_after and not any(
            o.value in aliases for o in self.g.outputs()
            if o.kind is not OutputKind.STATE_NEXT)

    def _aliases_of(self, v: ValueId) -> set[ValueId]:
        return {v} | {a for a, r in self.root.items() if r == v}

    # -- lifetimes ------------------------------------------------------------------------
    def _intervals(self) -> list[Interval]:
        end_of_step = len(self.eqns)
        last: dict[ValueId, int] = {}
        for v, j in self.last_read.items():
            r = self.root.get(v, v)
            last[r] = max(last.get(r, -1), j)
        for o in self.g.outputs():
            r = self.root.get(o.value, o.value)
            last[r] = end_of_step
        start = {e.out: i for i, e in enumerate(self.eqns)}
        return [Interval(v, start[v], max(last.get(v, start[v]), start[v]),
                         storage_bytes(self.g.type_of(v))) for v in self.arena_values]

    def _resolve_arena_places(self) -> None:
        """Places of aliases, views, in-place outputs and weights, now that roots are placed."""
        for e in self.eqns:
            v = e.out
            if v in self.places or v not in self.root or v in self.weights:
                continue
            base = self.places[self.root[v]]
            self.places[v] = Place(base.region, base.offset + self._offset_bytes(v),
                                   self.g.type_of(v), self.view_strides.get(v))

    def _place(self, v: ValueId) -> Place:
        """A value's place; a weight gets its region only when a step or an output reads
        it (a packed source decoded at bind is never uploaded as it is)."""
        if v not in self.places:
            owner = self.weights[self.root.get(v, v)]
            self.places[v] = self._weight_place(owner, self.g.type_of(v), v)
        return self.places[v]

    def _weight_place(self, w: WeightSpec, t: TensorType, v: ValueId) -> Place:
        name = self.weight_region.get(id(w))
        if name is None:
            label = (self.g.meta(w.binder).identity.label if w.binder is not None
                     else f"{w.op.name}.{v.index}")
            name = f"w:{label}"
            while name in self.regions:
                name += "'"
            self.regions[name] = Region(name, "weight", storage_bytes(w.type), weight=w)
            self.weight_region[id(w)] = name
        return Place(name, self._offset_bytes(v), t, self.view_strides.get(v))

    def _offset_bytes(self, v: ValueId) -> int:
        return self.view_offset.get(v, 0) * self.g.type_of(v).dtype.itemsize

    # -- finishing -----------------------------------------------------------------------
    def _final_steps(self) -> list[Step]:
        out = []
        for s in self.steps:
            ins = tuple(x if isinstance(x, Lit) else self._place(x.id) for x in s.eqn.inputs)
            out.append(Step(s.index, s.eqn, s.lowering, ins, self.places[s.eqn.out], s.inplace))
        return out

    def _final_notes(self) -> list[Note]:
        return [Note(n.index, n.eqn, n.kind, self.places.get(n.eqn.out)) for n in self.notes]

    def _outputs(self):
        outputs, copies, state = [], [], []
        for o in self.g.outputs():
            if o.kind is OutputKind.STATE_NEXT:
                dst = self._place(o.input)
                src = self._place(o.value)
                if src.region != dst.region or src.offset != dst.offset:
                    copies.append(Copy(src, dst))
                state.append((o.input, o.value, dst.region))
            else:
                outputs.append((o, self._place(o.value)))
        dsts = {c.dst.region for c in copies}
        for c in copies:
            if c.src.region in dsts:
                raise GraphError(f"{self.g.name}: state {c.dst.region} takes its next value "
                                 f"from state {c.src.region}, which is overwritten in the same "
                                 f"step; compute the value into a fresh tensor first")
        return outputs, copies, state


__all__ = ["make_plan", "resolve_target", "contiguous_strides"]
