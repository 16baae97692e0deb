"""The conformance suite without the device: what a backend that compiles at plan time
(CUDA's NVRTC, ROCm's hiprtc) checks in CI on a machine without its GPU.

`plan_cases` plans every case of the suite (op cases and model cases) for a
compile-only device, exactly as the suite plans it on a GPU: a case the device
declares must plan, every kernel built; an undeclared one must be refused at plan
time with the typed LoweringError naming op, backend and device; a compiler failure
is a problem, never a refusal. `model_step_graph` traces the real model's decode or
prefill step as `poot run` plans it.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field, replace

from poot.errors import LoweringError


@dataclass
class Planned:
    """The outcome over the suite: plans of declared cases, refusals, what went wrong."""

    cases: int = 0
    plans: list = field(default_factory=list)       # (case id, Plan)
    refused: int = 0
    problems: list[str] = field(default_factory=list)


def conformance_cases() -> list:
    """The suite's cases, op and model ones, with its slot roles registered as it does."""
    from poot import plugin
    from poot.conformance import roles
    from poot.conformance.cases import all_cases
    from poot.conformance.model import model_case_list

    plugin.register(roles, name="poot.conformance.roles")
    return [*all_cases(), *model_case_list()]


def plan_cases(backend, device, compile_error: type = (), brief=str) -> Planned:
    """Plan every case for `device`. `compile_error`: the backend's compiler failure type
    (reported with `brief(exc)` as a problem, not counted as a refusal)."""
    from poot.plan import plan

    table = backend.capabilities(device)
    out = Planned()
    for case in conformance_cases():
        out.cases += 1
        declared = not table.graph_refusals(case.graph)
        try:
            p = plan(case.graph, (backend, device))
        except compile_error as exc:
            out.problems.append(f"{case.id}: the compiler failed: {brief(exc)}")
            continue
        except LoweringError as exc:
            if declared:
                out.problems.append(f"{case.id}: declared but refused: {exc}")
            elif not (exc.backend == backend.name and exc.op and exc.device):
                out.problems.append(f"{case.id}: the refusal must name op, backend and "
                                    f"device: {exc!r}")
            else:
                out.refused += 1
            continue
        if not declared:
            out.problems.append(f"{case.id}: not declared "
                                f"({table.graph_refusals(case.graph)[0][1]}) but planned")
            continue
        out.plans.append((case.id, p))
    return out


def model_step_graph(gguf, backend, device, tokens: int, prefill_tokens: int = 32):
    """(traced step graph, config) of a GGUF model's `tokens`-token dense-KV step, planned
    as `poot run` plans it (its default max_seq)."""
    from poot.models.loader import open_model
    from poot.models.runner import Model, load

    max_seq = inspect.signature(load).parameters["max_seq"].default
    ckpt, config = open_model(str(gguf), max_seq=max_seq)
    config = replace(config, max_seq=min(config.max_seq, max_seq))
    model = Model(ckpt, config, None, backend, device, prefill_tokens=prefill_tokens)
    return model.step_graph(tokens, 1, "dense", pool=config.max_seq, compiled=False), config


__all__ = ["Planned", "conformance_cases", "model_step_graph", "plan_cases"]
