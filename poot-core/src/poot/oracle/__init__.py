"""The CPU reference evaluator ("the oracle"): the ground truth of every test."""
from poot.oracle.evaluate import apply, bind_inputs, definition, evaluate

__all__ = ["evaluate", "apply", "definition", "bind_inputs"]
