"""Run one case on a backend device through the public pipeline, with guards.

    plan = poot.plan.plan(graph, (backend, device))     # refusals are raised here
    ex = poot.runtime.Executor(guarded(plan), runtime=rt)
    ex.step(inputs)

`guarded` moves every arena place GUARD bytes up and grows the arena by two
guards, so each result has sentinel bytes before and after it. Before a step
the whole arena is filled with random sentinel bytes; after it, every byte that
no planned value occupies must still hold its sentinel. `GuardedRuntime` also
puts GUARD sentinel bytes past the end of every buffer (slots, state, weights).
An out-of-bounds write fails, and so does a step that changed an input slot.
The step is then replayed without new inputs: the result must not change a bit.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from poot.ir.graph import OutputKind
from poot.plan import ARENA, Place, Plan

GUARD = 256  # keeps every shifted arena offset on the planner's 256-byte alignment


@dataclass
class Outcome:
    """What a run gave: the result (None when refused), failures, and timing."""

    result: np.ndarray | None
    problems: list[str]
    seconds: float = 0.0          # one replayed step, for the perf mode


class GuardedRuntime:
    """A backend's Runtime whose every buffer (slots, state, weights, arena) is allocated
    GUARD bytes longer, the extra bytes holding random sentinels; `violations()` says
    which buffers' sentinels a step changed. Everything else goes to the wrapped runtime."""

    def __init__(self, inner, rng: np.random.Generator):
        self.inner, self.device, self.rng = inner, inner.device, rng
        self.tails: list[tuple[object, int, np.ndarray]] = []

    def alloc(self, nbytes: int, label: str):
        buf = self.inner.alloc(nbytes + GUARD, label)
        pattern = self.rng.integers(0, 256, GUARD, dtype=np.uint8)
        self.inner.write(buf, nbytes, pattern)
        self.tails.append((buf, nbytes, pattern))
        return buf

    def write(self, buf, offset: int, array) -> None:
        self.inner.write(buf, offset, array)

    def read(self, buf, offset: int, nbytes: int) -> np.ndarray:
        return self.inner.read(buf, offset, nbytes)

    def load(self, plan, buffers):
        return self.inner.load(plan, buffers)

    def violations(self) -> list[str]:
        out = []
        for buf, n, pattern in self.tails:
            changed = self.inner.read(buf, n, GUARD) != pattern
            if changed.any():
                out.append(f"out-of-bounds write: {int(changed.sum())} sentinel byte(s) past "
                           f"the end of buffer {buf.label!r} ({n} bytes) changed")
        return out


def _shift(x, by: int):
    if isinstance(x, Place) and x.region == ARENA:
        return dataclasses.replace(x, offset=x.offset + by)
    return x


def guarded(plan: Plan, guard: int = GUARD) -> Plan:
    """The same plan with its arena places moved up by `guard` and the arena grown by
    two guards (plain data: a backend's Lowering never holds an offset)."""
    s = lambda p: _shift(p, guard)
    steps = [dataclasses.replace(st, inputs=tuple(map(s, st.inputs)), out=s(st.out))
             for st in plan.steps]
    regions = dict(plan.regions)
    regions[ARENA] = dataclasses.replace(regions[ARENA],
                                         nbytes=regions[ARENA].nbytes + 2 * guard)
    return dataclasses.replace(
        plan, steps=steps, regions=regions,
        copies=[dataclasses.replace(c, src=s(c.src), dst=s(c.dst)) for c in plan.copies],
        notes=[dataclasses.replace(n, out=s(n.out)) for n in plan.notes],
        places={v: s(p) for v, p in plan.places.items()},
        outputs=[(o, s(p)) for o, p in plan.outputs])


def occupied(plan: Plan, nbytes: int) -> np.ndarray:
    """A mask of the arena bytes some planned value may legitimately hold."""
    mask = np.zeros(nbytes, bool)
    for p in plan.places.values():
        if p.region != ARENA:
            continue
        t = p.type
        if p.strides is None:
            extent = t.size * t.dtype.itemsize
        else:  # a strided view spans from its first to its last element
            last = sum((d - 1) * st for d, st in zip(t.shape, p.strides, strict=True))
            extent = (last + 1) * t.dtype.itemsize if t.size else 0
        mask[p.offset: p.offset + extent] = True
    return mask


def run_case(graph, inputs: list[np.ndarray], backend, device, runtime,
             rng: np.random.Generator, plan: Plan | None = None,
             timed: bool = False) -> Outcome:
    """Plan (unless given), load, fill sentinels, step, check guards and inputs, replay."""
    from poot.plan import plan as make_plan
    from poot.runtime.executor import Executor

    planned = plan if plan is not None else make_plan(graph, (backend, device))
    plan = guarded(planned)
    runtime = GuardedRuntime(runtime, rng)
    ex = Executor(plan, {}, runtime=runtime)
    arena = ex.buffers[ARENA]
    size = plan.regions[ARENA].nbytes
    sentinel = rng.integers(0, 256, size, dtype=np.uint8)
    runtime.write(arena, 0, sentinel)
    slots = {f"x{i}": a for i, a in enumerate(inputs)}
    res = ex.step(slots).result.copy()
    problems = []
    result_place = next(p for o, p in plan.outputs if o.kind is OutputKind.RESULT)
    free = ~occupied(plan, size)
    after = runtime.read(arena, 0, size)
    hit = free & (after != sentinel)
    if hit.any():  # in the planned arena's offsets (as `poot plan` prints), guards apart
        at = np.flatnonzero(hit) - GUARD
        planned_result = next(p for o, p in planned.outputs if o.kind is OutputKind.RESULT)
        where = (f"planned bytes [{planned_result.offset}, "
                 f"{planned_result.offset + planned_result.nbytes})"
                 if planned_result.region == ARENA else f"region {planned_result.region!r}")
        problems.append(f"out-of-bounds write: {at.size} sentinel byte(s) of the arena "
                        f"changed, first at planned byte {int(at[0])} (the arena holds "
                        f"{planned.arena_size} bytes; the result {planned_result.type} is at "
                        f"{where})")
    problems += runtime.violations()
    for label, (_, buf) in ex.slots.items():
        want = np.ascontiguousarray(slots[label]).reshape(-1).view(np.uint8)
        if not np.array_equal(runtime.read(buf, 0, want.size), want):
            problems.append(f"input {label} was overwritten by the step")
    t0 = time.perf_counter()
    ex.executable.run()
    seconds = time.perf_counter() - t0
    again = ex.read(result_place)
    if not np.array_equal(again.view(np.uint8), res.view(np.uint8)):
        problems.append("replaying the step changed the result")
    if timed:
        seconds = best_time(ex.executable.run, seconds)
    return Outcome(res, problems, seconds)


def best_time(run, first: float, batch_s: float = 0.002, batches: int = 3) -> float:
    """Seconds per call of `run`: the best of a few batches, each long enough (up to 100
    calls) that timer resolution and one-off stalls do not dominate."""
    reps = max(1, min(100, int(batch_s / max(first, 1e-7))))
    best = first
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(reps):
            run()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


__all__ = ["GUARD", "GuardedRuntime", "Outcome", "guarded", "occupied", "run_case"]
