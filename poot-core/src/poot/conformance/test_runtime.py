"""Runtime checks through the Executor: slot rewrites take effect, state is carried
(and donated in place), replay is identical, the weight cache never reuses different
bytes. A check whose ops the backend does not declare checks the refusal instead."""
from __future__ import annotations

import numpy as np
import pytest

from poot.conformance.compare import mismatch
from poot.conformance.roles import input_role
from poot.conformance.runner import GuardedRuntime
from poot.dtypes import DType
from poot.errors import LoweringError
from poot.ir import Builder
from poot.ir import ops as O
from poot.ir.types import SlotKind, TensorType
from poot.oracle import evaluate

F32 = DType.F32
ADD, MUL = O.Binary(O.BinaryOp.Add), O.Binary(O.BinaryOp.Mul)
TOL = 1e-10


def executor(target, graph, consts=None, **kw):
    """The graph's Executor on the target, or None after checking its typed refusal."""
    from poot.plan import plan
    from poot.runtime.executor import Executor

    if not target.declares(graph):
        with pytest.raises(LoweringError):
            plan(graph, (target.backend, target.device))
        return None
    weights = kw.get("weights")
    runtime = weights.runtime if weights is not None else \
        GuardedRuntime(target.runtime, target.rng(graph.name))
    return Executor(plan(graph, (target.backend, target.device)), consts or {},
                    runtime=runtime, **kw)


def step(ex, slots):
    """One step, then the sentinels past every buffer (state included) must be intact."""
    out = ex.step(slots).result
    assert not ex.runtime.violations(), ex.runtime.violations()
    return out


def rand(rng, *shape):
    return (rng.standard_normal(shape) + 3).astype(np.float32)  # never zero in practice


def check(want, got, what):
    bad = mismatch(np.asarray(want), np.asarray(got), False, TOL)
    assert bad is None, f"{what}: {bad}"


def test_slot_rewrites_take_effect(target):
    b = Builder("slots", compiler=True)
    x = b.slot(input_role(F32), (3, 33), "x0")
    y = b.slot(input_role(F32), (33,), "x1")
    b.result(b.eqn(MUL, b.eqn(ADD, x, y), y))
    g = b.finish()
    ex = executor(target, g)
    if ex is None:
        return
    rng = target.rng("slots")
    for i in range(3):
        ins = {"x0": rand(rng, 3, 33), "x1": rand(rng, 33)}
        got = step(ex, ins)
        check(evaluate(g, ins, outputs="result")[0], got, f"step {i} after rewriting slots")


def _softmax_graph():
    b = Builder("softmax", compiler=True)
    x = b.slot(input_role(F32), (5, 67), "x0")
    m = b.eqn(O.Reduce(O.ReduceOp.Max, -1, True), x)
    ex = b.eqn(O.Unary(O.UnaryOp.Exp), b.eqn(O.Binary(O.BinaryOp.Sub), x, m))
    s = b.eqn(O.Reduce(O.ReduceOp.Sum, -1, True), ex)
    b.result(b.eqn(O.Binary(O.BinaryOp.Div), ex, s))
    return b.finish()


def test_replay_is_identical(target):
    g = _softmax_graph()
    ex = executor(target, g)
    if ex is None:
        return
    x = rand(target.rng("replay"), 5, 67)
    first = step(ex, {"x0": x}).copy()
    check(evaluate(g, [x], outputs="result")[0], first, "first step")
    for _ in range(3):
        again = step(ex, {"x0": x})
        assert np.array_equal(again.view(np.uint8), first.view(np.uint8)), \
            "a replayed step with the same inputs changed the result"


def check_state_steps(target, g, name: str, shape, steps) -> None:
    """Run `steps` (each rng -> slot values, in binder order after the state) from a random
    state; after each, the result and the state buffer must match the oracle's."""
    ex = executor(target, g)
    if ex is None:
        return
    rng = target.rng(g.name)
    state = rand(rng, *shape)
    ex.write_state(name, state)
    for i, make in enumerate(steps):
        slots = make(rng)
        res, state = evaluate(g, [state, *slots.values()])
        check(res, step(ex, slots), f"result of step {i}")
        check(state, ex.read_state(name), f"state {name} after step {i}")


def test_state_is_carried(target):
    b = Builder("accumulate", compiler=True)
    s = b.state(TensorType((4, 33), F32), "acc")
    x = b.slot(input_role(F32), (4, 33), "x0")
    nxt = b.eqn(ADD, s, x)
    b.state_next(s, nxt)
    b.result(b.eqn(MUL, nxt, x))
    check_state_steps(target, b.finish(), "acc", (4, 33),
                      [lambda rng: {"x0": rand(rng, 4, 33)}] * 3)


def test_state_updated_in_place(target):
    """A dense KV write (DynamicUpdateSlice of the state at a Pos slot) is donated."""
    b = Builder("kv", compiler=True)
    cache = b.state(TensorType((6, 5), F32), "cache")
    row = b.slot(input_role(F32), (1, 5), "x0")
    pos = b.slot(SlotKind.POS, (1,), "pos", bound=6)
    nxt = b.eqn(O.DynamicUpdateSlice(0), cache, row, pos)
    b.state_next(cache, nxt)
    b.result(b.eqn(O.Reduce(O.ReduceOp.Sum, 0), nxt))
    check_state_steps(target, b.finish(), "cache", (6, 5), [
        lambda rng, p=p: {"x0": rand(rng, 1, 5), "pos": np.array([p], np.int32)}
        for p in (0, 3, 5)])


def test_weight_cache_never_reuses_different_bytes(target):
    from poot.runtime.weights import WeightCache

    b = Builder("weights", compiler=True)
    w = b.const(TensorType((33,), F32), "w")
    x = b.slot(input_role(F32), (3, 33), "x0")
    b.result(b.eqn(MUL, x, w))
    g = b.finish()
    if executor(target, g, {"w": np.ones(33, np.float32)}) is None:
        return
    rng = target.rng("weights")
    cache = WeightCache(GuardedRuntime(target.runtime, rng))
    w1, w2, x = rand(rng, 33), rand(rng, 33), rand(rng, 3, 33)
    for w_value in (w1, w2, w1.copy(), w2):
        ex = executor(target, g, {"w": w_value}, weights=cache)
        check(evaluate(g, [w_value, x], outputs="result")[0], step(ex, {"x0": x}),
              "a weight bound after others")
    assert cache.uploads == 2 and cache.hits == 2, \
        f"two distinct weights bound twice each: {cache.uploads} uploads, {cache.hits} hits"
