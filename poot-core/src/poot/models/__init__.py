"""Models: builders (poot.models.llama), checkpoints, tokenizer, chat, sampling, runner.

`poot.load(MODEL, backend=None, ...)` returns a Model with `.generate(prompt, ...)` (text,
or an iterator of pieces with stream=True), `.tokenize(text)` and `.prefill_logits(ids)`;
docs/python.md shows them at work.
"""
from poot.models.runner import Model, load

__all__ = ["Model", "load"]
