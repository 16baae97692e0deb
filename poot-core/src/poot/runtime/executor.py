"""The Executor: a Plan bound to a Runtime, run step after step.

    ex = Executor(plan, consts)                # or poot.runtime.load(plan, consts)
    out = ex.step({"tokens": [5], "pos": [0]}) # one step; out.result is numpy

At construction it allocates every buffer once (the arena, one buffer per slot, the
state buffers, the weights through the WeightCache) and has the runtime load the plan.
A step checks every slot value against its slot's declared range before anything is
written (an out-of-range value raises SlotRangeError and changes nothing, state
included), writes the slots in place, runs the plan (state is donated: updated in place
or copied into its buffer at the end of the step) and reads the outputs. A step
allocates nothing.

`launch(slots, feed=...)` is a step that does not wait: it queues the slot writes and the
run and returns a `Pending` whose `result()` waits for the Result alone (on a runtime that
queues work, the device runs the step while the host goes on; elsewhere the step has run by
then). A slot in `feed` takes an earlier pending step's Result on the device (a decode
step's sampled tokens as the next step's input tokens), with no host round trip.

Two plans of one model (a prefill plan for T tokens and a decode plan for one) share
weights and state by sharing the caches: `Executor(decode_plan, consts,
weights=prefill.weights, state=prefill.state)`. Weights are found by payload identity,
state buffers by the state binder's name (its type must match).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from poot.contract import ARENA, DeviceBuffer, Place, Plan, Region, Runtime, WeightSpec
from poot.errors import BindError
from poot.ir.graph import OutputKind
from poot.ir.types import ValueId
from poot.oracle.evaluate import check_slot, coerce_input
from poot.runtime.weights import WeightCache


@dataclass
class StepResult:
    """What one step returns: the Result and every witness and export, as numpy."""

    result: np.ndarray
    witnesses: dict[str, np.ndarray] = field(default_factory=dict)
    exports: dict[str, np.ndarray] = field(default_factory=dict)


class Pending:
    """A launched step's Result, read back when `result()` is first asked for."""

    def __init__(self, executor: Executor, place: Place, wait):
        self.executor, self.runtime, self.place = executor, executor.runtime, place
        self._wait, self._value = wait, None

    def result(self) -> np.ndarray:
        if self._value is None:
            raw = self._wait()
            self._value = raw.view(self.place.type.dtype.numpy).reshape(self.place.type.shape)
        return self._value


class StateStore:
    """State buffers on one runtime by state name, shared by the executors handed it."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.buffers: dict[str, tuple[DeviceBuffer, str]] = {}

    def buffer(self, name: str, nbytes: int, type_text: str) -> DeviceBuffer:
        got = self.buffers.get(name)
        if got is not None:
            buf, have = got
            if have != type_text:
                raise BindError(f"state {name!r} is {have} in an earlier plan but {type_text} "
                                f"here; plans that share state must agree on its type")
            return buf
        zeroed = getattr(self.runtime, "alloc_zeroed", None)
        if zeroed is not None:   # a KV cache's pages become resident only as rows are written
            buf = zeroed(max(nbytes, 1), name)
        else:
            buf = self.runtime.alloc(max(nbytes, 1), name)
            self.runtime.write(buf, 0, np.zeros(nbytes, np.uint8))
        self.buffers[name] = (buf, type_text)
        return buf


class Executor:
    """Runs one Plan; see the module docstring."""

    def __init__(self, plan: Plan, consts: Mapping | None = None, *,
                 runtime: Runtime | None = None, weights: WeightCache | None = None,
                 state: StateStore | None = None, progress=None):
        """`progress(done, total, label)`, if given, is called as each buffer is bound
        (weights are decoded and uploaded here: the slow part of loading a model)."""
        self.plan = plan
        self.graph = g = plan.graph
        if runtime is None:
            runtime = weights.runtime if weights is not None else \
                plan.backend.runtime(plan.device)
        self.runtime = runtime
        self.weights = weights if weights is not None else WeightCache(runtime)
        self.state = state if state is not None else StateStore(runtime)
        self._consts = _ConstSource(g, consts or {})
        self.buffers: dict[str, DeviceBuffer] = {}
        self.slots: dict[str, tuple[ValueId, DeviceBuffer]] = {}
        regions = list(plan.regions.values())
        for i, region in enumerate(regions):
            self.buffers[region.name] = self._allocate(region)
            if progress is not None:
                progress(i + 1, len(regions), region.name)
        self.executable = runtime.load(plan, self.buffers)
        self._outputs = [(o, place) for o, place in plan.outputs]
        # what each step's slot check reads, looked up once
        self._slot_labels = {vid: label for label, (vid, _) in self.slots.items()}
        self._slot_types = {label: g.type_of(vid) for label, (vid, _) in self.slots.items()}
        self.steps = 0

    def _allocate(self, region: Region) -> DeviceBuffer:
        rt, g = self.runtime, self.graph
        if region.kind == "arena":
            return rt.alloc(max(region.nbytes, 1), ARENA)
        if region.kind == "slot":
            buf = rt.alloc(max(region.nbytes, 1), region.name)
            self.slots[g.meta(region.value).identity.label] = (region.value, buf)
            return buf
        if region.kind == "state":
            return self.state.buffer(g.meta(region.value).identity.label, region.nbytes,
                                     str(g.type_of(region.value)))
        return self.weights.bind(region.weight, self._consts, region.name)

    # -- a step ----------------------------------------------------------------------
    def step(self, slot_values: Mapping) -> StepResult:
        """Run one step with these slot values (by slot name or ValueId)."""
        arrays = self._checked_slots(slot_values)
        for label, a in arrays.items():
            self.runtime.write(self.slots[label][1], 0, a)
        self.executable.run()
        self.steps += 1
        return self._read_outputs()

    def launch(self, slot_values: Mapping, feed: Mapping[str, Pending] | None = None
               ) -> Pending:
        """Queue one step (slot values as in `step`; each slot in `feed` takes that pending
        step's Result, which must have the slot's type) and return at once; only the Result
        is read back, by `Pending.result()`."""
        feed = dict(feed or {})
        arrays = self._checked_slots(slot_values, fed=feed)
        for label, a in arrays.items():
            self.runtime.write(self.slots[label][1], 0, a)
        for label, src in feed.items():
            self._feed(label, src)
        place = self._result_place()
        buf = self.buffers[place.region]
        nbytes = place.type.size * place.type.dtype.itemsize
        read_later = getattr(self.runtime, "read_later", None)
        queue = getattr(self.executable, "launch", None)
        if queue is not None and read_later is not None:
            queue()
            wait = read_later(buf, place.offset, nbytes)
        else:
            self.executable.run()
            raw = self.runtime.read(buf, place.offset, nbytes)
            wait = lambda: raw  # noqa: E731 - the step has run; its value is here
        self.steps += 1
        return Pending(self, place, wait)

    def _result_place(self) -> Place:
        for o, place in self._outputs:
            if o.kind is OutputKind.RESULT:
                return place
        raise BindError(f"{self.graph.name} has no Result to read")

    def _feed(self, label: str, src: Pending) -> None:
        """Slot `label` takes `src`'s Result: copied on the device where the runtime
        copies between buffers (queued after src's step), else written from the host."""
        vid, dst = self.slots[label]
        want, have = self.graph.type_of(vid), src.place.type
        if want.dtype != have.dtype or want.size != have.size:
            raise BindError(f"slot {label} of {self.graph.name} is {want}; the fed Result "
                            f"is {have}")
        copy = getattr(self.runtime, "copy", None)
        if copy is None or src.runtime is not self.runtime:
            self.runtime.write(dst, 0, src.result())
            return
        copy(dst, 0, src.executor.buffers[src.place.region], src.place.offset,
             have.size * have.dtype.itemsize)

    def _checked_slots(self, values: Mapping, fed: Mapping = ()) -> dict[str, np.ndarray]:
        given: dict[str, object] = {}
        for k, v in values.items():
            label = self._slot_labels.get(k) if isinstance(k, ValueId) else k
            if label not in self.slots:
                raise BindError(f"{self.graph.name} has no slot {k!r}; slots: "
                                f"{', '.join(self.slots)}")
            given[label] = v
        missing = [s for s in self.slots if s not in given and s not in fed]
        if missing:
            raise BindError(f"{self.graph.name}: slots {missing} are not given a value")
        out = {}
        for label, v in given.items():
            vid = self.slots[label][0]
            what = f"slot {label}"
            a = coerce_input(vid, self._slot_types[label], v, what)
            check_slot(self.graph, vid, a, what)
            out[label] = a
        return out

    def _read_outputs(self) -> StepResult:
        res = StepResult(result=None)
        for o, place in self._outputs:
            a = self.read(place)
            if o.kind is OutputKind.RESULT:
                res.result = a
            elif o.kind is OutputKind.WITNESS:
                res.witnesses[o.label] = a
            elif o.kind is OutputKind.EXPORT:
                res.exports[o.boundary.name] = a
        return res

    # -- host access ----------------------------------------------------------------
    def read(self, place: Place) -> np.ndarray:
        if not place.contiguous:
            raise BindError(f"{place} is a strided view; only contiguous places are read")
        raw = self.runtime.read(self.buffers[place.region], place.offset,
                                place.type.size * place.type.dtype.itemsize)
        return raw.view(place.type.dtype.numpy).reshape(place.type.shape)

    def _state_region(self, name: str) -> Region:
        region = self.plan.regions.get(f"state:{name}")
        if region is None:
            names = [r.name.removeprefix("state:") for r in self.plan.state_regions()]
            raise BindError(f"{self.graph.name} has no state {name!r}; state: {names}")
        return region

    def read_state(self, name: str) -> np.ndarray:
        """The current content of the state buffer `name` (a state binder's name)."""
        region = self._state_region(name)
        return self.read(Place(region.name, 0, self.graph.type_of(region.value)))

    def write_state(self, name: str, value) -> None:
        """Replace the content of the state buffer `name` (checked like any input)."""
        region = self._state_region(name)
        a = coerce_input(region.value, self.graph.type_of(region.value), value,
                         f"state {name}")
        self.runtime.write(self.buffers[region.name], 0, a)

    def state_names(self) -> list[str]:
        return [self.graph.meta(r.value).identity.label for r in self.plan.state_regions()]


class _ConstSource:
    """Host arrays of a graph's const binders, by label or ValueId, checked on first use."""

    def __init__(self, graph, consts: Mapping):
        self.graph = graph
        self.by_id = {k: v for k, v in consts.items() if isinstance(k, ValueId)}
        self.by_label = {k: v for k, v in consts.items() if not isinstance(k, ValueId)}
        labels = [graph.meta(v).identity.label for v in graph.consts()]
        self.ambiguous = {x for x in labels if labels.count(x) > 1}
        self.checked: dict[ValueId, np.ndarray] = {}

    def __call__(self, spec: WeightSpec) -> np.ndarray:
        vid = spec.binder
        got = self.checked.get(vid)
        if got is None:
            meta = self.graph.meta(vid)
            label = meta.identity.label
            if vid in self.by_id:
                value = self.by_id[vid]
            elif label in self.ambiguous:
                raise BindError(f"{self.graph.name} has several consts named {label!r}; "
                                f"pass them by ValueId")
            elif label in self.by_label:
                value = self.by_label[label]
            else:
                raise BindError(f"const {label} ({meta.aval}) of {self.graph.name} is not "
                                f"given; pass it in consts by name")
            got = coerce_input(vid, meta.aval, value, f"const {label}")
            self.checked[vid] = got
        return got


def load(plan: Plan, consts: Mapping | None = None, **kw) -> Executor:
    """`Executor(plan, consts, **kw)`."""
    return Executor(plan, consts, **kw)


__all__ = ["Executor", "Pending", "StepResult", "StateStore", "load"]
