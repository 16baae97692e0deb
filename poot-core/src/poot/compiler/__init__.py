"""compile: the pass pipeline that finds the composites a target can lower.

    compiled = poot.compile(graph)                 # best available backend
    compiled = poot.compile(graph, "reference")    # or a (backend, device) pair
    print(compiled.report.explain())

Every pass keeps the oracle's answer: `poot.evaluate` on `compiled.graph` equals it
on the source graph. See poot.compiler.pipeline.PASSES for the order.
"""
from poot.compiler.pipeline import PASSES, Compiled, compile, resolve_target, run_pass
from poot.compiler.policy import Policy, PolicyError
from poot.compiler.report import CompileReport, Decision, PassRecord
from poot.compiler.targets import LimitedBackend

__all__ = ["compile", "Compiled", "Policy", "PolicyError", "PASSES", "CompileReport",
           "Decision", "PassRecord", "resolve_target", "run_pass", "LimitedBackend"]
