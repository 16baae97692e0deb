"""The text of one sequence's generated tokens, piece by piece, cut at its first stop string.

Pieces are UTF-8-safe (the tokenizer's StreamDecoder holds back a character's incomplete
bytes). A tail that could be the start of a stop string is held back too, until the next
tokens show whether it is one, so a streaming client never receives part of a stop string.
"""
from __future__ import annotations

from collections.abc import Sequence


class TextStream:
    def __init__(self, tokenizer, stop: Sequence[str] = ()):
        self.decoder = tokenizer.stream(at_text_start=False)
        self.stop = [s for s in stop if s]
        self.pending = ""        # decoded, not yet released
        self.stopped = False     # a stop string was found; nothing more is released

    def push(self, token_id: int) -> str:
        """The text that token_id completes and that cannot be part of a stop string."""
        if self.stopped:
            return ""
        self.pending += self.decoder.push(token_id)
        return self._release(final=False)

    def flush(self) -> str:
        """Everything still held back, at the end of the sequence."""
        if self.stopped:
            return ""
        self.pending += self.decoder.flush()
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        text = self.pending
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.pending, self.stopped = "", True
            return text[: min(hits)]
        keep = 0 if final else self._stop_prefix(text)
        self.pending = text[len(text) - keep:]
        return text[: len(text) - keep]

    def _stop_prefix(self, text: str) -> int:
        """The length of the longest tail of text that begins some stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if s.startswith(text[-n:]):
                    best = n
                    break
        return best
