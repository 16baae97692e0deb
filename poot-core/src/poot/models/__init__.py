"""Models: builders (poot.models.llama), checkpoints, tokenizer, chat, sampling, runner.

`poot.load(MODEL, backend=None)` returns a Model with `.prefill_logits(ids)`,
`.tokenize(text)` and `.generate(prompt, ...)`.
"""


def load(*args, **kwargs):
    from poot.models.runner import load as _load

    return _load(*args, **kwargs)
