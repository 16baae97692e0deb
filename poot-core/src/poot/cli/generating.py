"""What `poot run` and its chat (poot.cli.chat) share: Model.generate's arguments from the
flags (sampling, stop strings, adapter, speculation), the check that a chat has a template,
and the notes when an answer stops at the end of the context or before it began."""
from __future__ import annotations

import sys


def sampling_kwargs(args) -> dict:
    """Model.generate's sampling, stop and adapter arguments from the flags."""
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                repetition_penalty=args.repetition_penalty, seed=args.seed, stop=args.stop,
                adapter="lora" if args.lora else None, speculate=args.speculate,
                draft_tokens=args.draft_tokens)


def check_chat_template(model, args) -> None:
    """A chat (no --prompt) or a prompt through the template (--chat, --system) needs the
    model's chat template: refused once the tokenizer is read, before any plan is made."""
    from poot.errors import RequestError

    if model.tokenizer.chat_template or getattr(args, "image", None):
        return          # a vision model's prompt is built by its family, not the template
    name = model.checkpoint.path.name
    if args.prompt is None:
        raise RequestError(f"{name} has no chat template (tokenizer.chat_template), so it "
                           f"cannot chat: give --prompt (or pipe a prompt on stdin) for a "
                           f"plain completion")
    if args.chat:
        flags = "--system" if args.system is not None else "--chat"
        raise RequestError(f"{name} has no chat template (tokenizer.chat_template): drop "
                           f"{flags} for a plain completion of --prompt")


def check_room(model, prompt_tokens: int) -> None:
    """A prompt that leaves no position for an answer in --max-seq, refused naming the flag
    (before any plan is made, for a --prompt)."""
    from poot.errors import RequestError

    if prompt_tokens >= model.config.max_seq:
        raise RequestError(f"the prompt has {prompt_tokens} tokens, and --max-seq "
                           f"{model.config.max_seq} leaves no room for an answer: give "
                           f"--max-seq {prompt_tokens + 1} or more")


def empty_answer_note(model, text: str, chat: bool) -> None:
    """A line on stderr when a plain prompt's answer ended before any text (its first token
    was end-of-sequence), as an instruct model often does to a question it is not asked in
    its chat template (a note, printed even with --quiet: nothing else explains it)."""
    s = model.stats
    if chat or text.strip() or s.finish_reason != "stop" or not model.tokenizer.chat_template:
        return
    print("[poot] note: the model ended its answer before any text; an instruct model "
          "answers a question through its chat template: add --chat (or leave out --prompt "
          "to chat)", file=sys.stderr, flush=True)


def context_note(model) -> None:
    """A line on stderr when the answer stopped because the context was full (a note,
    printed even with --quiet: the text is cut short, not finished)."""
    s = model.stats
    if s.finish_reason == "context":
        print(f"[poot] note: stopped after {s.generated_tokens} tokens at the end of the "
              f"context: the prompt's {s.prompt_tokens} tokens and the answer fill --max-seq "
              f"{model.config.max_seq}; a larger --max-seq makes room for more",
              file=sys.stderr, flush=True)
