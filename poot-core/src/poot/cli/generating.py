"""What `poot run` and its chat (poot.cli.chat) share: Model.generate's arguments from the
flags (sampling, stop strings, adapter, speculation), and the note when an answer stops at the end of the context."""
from __future__ import annotations

import sys


def sampling_kwargs(args) -> dict:
    """Model.generate's sampling, stop and adapter arguments from the flags."""
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                repetition_penalty=args.repetition_penalty, seed=args.seed, stop=args.stop,
                adapter="lora" if args.lora else None, speculate=args.speculate,
                draft_tokens=args.draft_tokens)


def context_note(model) -> None:
    """A line on stderr when the answer stopped because the context was full (a note,
    printed even with --quiet: the text is cut short, not finished)."""
    s = model.stats
    if s.finish_reason == "context":
        print(f"[poot] note: stopped after {s.generated_tokens} tokens at the end of the "
              f"context: the prompt's {s.prompt_tokens} tokens and the answer fill --max-seq "
              f"{model.config.max_seq}; a larger --max-seq makes room for more",
              file=sys.stderr, flush=True)
