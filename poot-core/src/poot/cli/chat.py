"""`poot run MODEL` on a terminal without --prompt: a chat.

Each line typed is a user message; the answer streams as it is decoded, and the whole
conversation (the --system prompt first) goes through the model's chat template on every
turn, so the model sees the history. When the history no longer fits the context
(--max-seq), its oldest turns are dropped. Ctrl-C stops an answer; Ctrl-D or /bye leaves.
"""
from __future__ import annotations

import sys

PROMPT = ">>> "
HELP = """commands:
  /bye      leave (Ctrl-D too)
  /clear    forget the conversation (the system prompt stays)
  /system TEXT   set the system prompt (and forget the conversation)
  /?        this help
Ctrl-C stops an answer."""


class Conversation:
    """The messages of one chat and what the next turn feeds the model."""

    def __init__(self, model, system: str | None):
        self.model, self.system = model, system
        self.turns: list[tuple[str, str]] = []      # (user, assistant)

    def messages(self, user: str) -> list[dict]:
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        for u, a in self.turns:
            msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        return msgs + [{"role": "user", "content": user}]

    def fitted(self, user: str) -> tuple[list[dict], int]:
        """The messages of the next turn, the oldest turns dropped until they leave room
        for at least one token of answer; and how many turns were dropped."""
        dropped = 0
        while True:
            msgs = self.messages(user)
            if len(self.model.prompt_ids(msgs)) < self.model.config.max_seq or not self.turns:
                return msgs, dropped
            self.turns.pop(0)
            dropped += 1


def _read(prompt: str) -> str | None:
    """A line typed at the prompt; None at end of input."""
    try:
        return input(prompt)
    except EOFError:
        return None


def chat(model, args, out=None) -> int:
    from poot.cli.generating import context_note
    from poot.errors import PootError

    out = out or sys.stdout
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    conv = Conversation(model, args.system)
    name = model.checkpoint.path.name
    print(f"chatting with {name} on {model.backend.name}; /? for help, /bye or Ctrl-D to "
          f"leave", file=out, flush=True)
    while True:
        try:
            line = _read(PROMPT)
        except KeyboardInterrupt:
            print("\n(Ctrl-D or /bye to leave)", file=out, flush=True)
            continue
        if line is None:
            print(file=out)
            return 0
        text = line.strip()
        if not text:
            continue
        if text == "/bye":
            return 0
        if text in ("/?", "/help"):
            print(HELP, file=out, flush=True)
            continue
        if text == "/clear":
            conv.turns.clear()
            print("(the conversation is forgotten)", file=out, flush=True)
            continue
        if text.startswith("/system"):
            conv.system = text[len("/system"):].strip() or None
            conv.turns.clear()
            print(f"(system prompt {'set' if conv.system else 'cleared'}; the conversation "
                  f"is forgotten)", file=out, flush=True)
            continue
        if text.startswith("/"):
            print(f"unknown command {text.split()[0]}; /? lists them", file=out, flush=True)
            continue
        try:
            msgs, dropped = conv.fitted(text)
            if dropped:
                print(f"(the {dropped} oldest turns no longer fit --max-seq "
                      f"{model.config.max_seq} and were dropped)", file=out, flush=True)
            answer = _answer(model, msgs, args, out)
        except PootError as exc:
            print(f"poot: error: {exc}", file=out, flush=True)
            continue
        if answer is not None:
            conv.turns.append((text, answer))
            context_note(model)


def _answer(model, msgs: list[dict], args, out) -> str | None:
    """Stream the answer to `msgs`; None when Ctrl-C stopped it (the turn is not kept)."""
    from poot.cli.generating import check_room, sampling_kwargs

    check_room(model, len(model.prompt_ids(msgs)))
    room = model.config.max_seq
    pieces = model.generate(msgs, max_tokens=args.max_tokens or room, stream=True,
                            **sampling_kwargs(args))
    text = ""
    try:
        for piece in pieces:
            text += piece
            out.write(piece)
            out.flush()
    except KeyboardInterrupt:
        pieces.close()
        print("\n(stopped)", file=out, flush=True)
        return None
    print(file=out, flush=True)
    return text
