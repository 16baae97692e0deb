"""Structured outputs: a grammar per request, its token mask per step (llguidance).

llguidance (the `serve` extra) compiles JSON schemas, regular expressions and Lark grammars
into a matcher that, after each token, says which tokens may come next as a bitmask over
the vocabulary, computed lazily from the tokenizer's token bytes (tens of microseconds a
token; no precomputation per grammar). It is built on poot's own Tokenizer: the bytes of
every token as poot decodes them (so GGUF and HF checkpoints alike), control tokens marked
as special so that no grammar spells them, and the tokenizer's stop ids as its end tokens
(allowed once the grammar accepts).

The mask's layout is the sampler's mask slot's (poot.models.sample_graph: bit i % 32 of
u32 word i // 32 allows id i), so a decode step that draws in the graph has llguidance
write each constrained row straight into the slot's array (`Constraint.write_mask`) and
uploads those words alone; a step whose logits the host has anyway sets the disallowed
logits to -inf itself (`Constraint.mask`).

The llguidance tokenizer takes a second or two to build for a large vocabulary: the server
builds it in a worker thread as it starts (poot.serve.app), so the first structured request
does not hold up the event loop.

JSON is constrained to compact whitespace (no free runs of spaces and newlines, which a
weak model can fill without end).
"""
from __future__ import annotations

import threading
import weakref

import numpy as np

from poot.errors import RequestError
from poot.models.sample_graph import WORD_BITS, mask_words
from poot.optional import require

#: llguidance's JSON compiler options for every schema
JSON_OPTIONS = {"whitespace_flexible": False}

_lock = threading.Lock()
_built: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _llg():
    return require("llguidance")


def available() -> bool:
    import importlib.util

    return importlib.util.find_spec("llguidance") is not None


class _Tokens:
    """A poot Tokenizer as llguidance's TokenizerWrapper reads one."""

    def __init__(self, tokenizer):
        self.eos_token_id = tokenizer.eos_id if tokenizer.eos_id is not None else \
            min(tokenizer.stop_ids, default=0)
        self.bos_token_id = tokenizer.bos_id
        special = tokenizer.special_ids
        # llguidance spells a special token as 0xFF then its name, which no text matches
        self.tokens = [b"\xff" + tokenizer.tokens[i].encode() if i in special else bytes(b)
                       for i, b in enumerate(tokenizer.token_bytes)]
        self.special_token_ids = sorted(special)
        self._encode = tokenizer.encode_text

    def __call__(self, text):
        return self._encode(text.decode("utf-8", errors="replace")
                            if isinstance(text, bytes) else text)


def llg_tokenizer(tokenizer):
    """The llguidance tokenizer of a poot Tokenizer, built once (a fraction of a second)."""
    with _lock:
        if tokenizer not in _built:
            llg = _llg()
            _built[tokenizer] = llg.LLTokenizer(
                llg.TokenizerWrapper(_Tokens(tokenizer)), n_vocab=tokenizer.vocab_size,
                eos_token=sorted(tokenizer.stop_ids) or None)
        return _built[tokenizer]


def json_schema_grammar(schema, param: str = "response_format") -> str:
    """The grammar of JSON values valid against `schema` (a dict); `param` names the field
    that gave it, in a refusal."""
    llg = _llg()
    try:
        return llg.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
    except Exception as exc:        # llguidance refuses a malformed schema in several types
        raise RequestError(f"the JSON schema of {param} is not usable: {exc}",
                           param=param) from None


def regex_grammar(pattern: str) -> str:
    return _llg().LLMatcher.grammar_from_regex(pattern)


def lark_grammar(text: str) -> str:
    return _llg().LLMatcher.grammar_from_lark(text)


def checked(grammar: str, tokenizer, param: str = "response_format") -> str:
    """`grammar` once llguidance accepts it for this tokenizer, else a RequestError (400)
    naming llguidance's reason."""
    llg = _llg()
    try:
        error = llg.LLMatcher.validate_grammar(grammar, llg_tokenizer(tokenizer))
    except Exception as exc:        # a grammar too large or deep for llguidance's limits
        error = f"{type(exc).__name__}: {exc}"
    if error:
        raise RequestError(f"the grammar of {param} is not valid: {error}", param=param)
    return grammar


class Constraint:
    """One sequence's matcher: the mask of the tokens it allows next, and the tokens drawn."""

    def __init__(self, grammar: str, tokenizer):
        llg = _llg()
        self.vocab = tokenizer.vocab_size
        self.matcher = llg.LLMatcher(llg_tokenizer(tokenizer), grammar, log_level=0)
        if self.matcher.is_error():
            raise RequestError(f"the grammar is not valid: {self.matcher.get_error()}",
                               param="response_format")
        #: llguidance's mask: bit i % 32 of word i // 32 allows id i (the layout of the
        #: sampler's mask slot, poot.models.sample_graph)
        self._bits = np.zeros(mask_words(self.vocab), np.uint32)

    def write_mask(self, words: np.ndarray) -> None:
        """Write the ids the grammar allows next into `words` U32 [mask_words(V)] (a row of
        a masked step's mask slot, V the model's logits width): llguidance computes straight
        into it when V's words are the tokenizer's, else into its own row, copied; ids past
        the tokenizer's vocabulary are never allowed."""
        if words.dtype != np.uint32 or words.ndim != 1 or not words.flags.c_contiguous:
            raise ValueError(f"a token mask row is contiguous u32 words, not {words.dtype} "
                             f"{words.shape}")
        if words.size == self._bits.size:
            self.matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        else:
            self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
            n = min(words.size, self._bits.size)
            words[:n] = self._bits[:n]
            words[n:] = 0
        if self.vocab % WORD_BITS and words.size >= self._bits.size:
            words[self._bits.size - 1] &= np.uint32((1 << self.vocab % WORD_BITS) - 1)

    def mask(self, z: np.ndarray) -> None:
        """Set the logits [vocab] of every token the grammar does not allow next to -inf
        (ids past the tokenizer's vocabulary too): the host's form of the mask, for a step
        that reads its logits back (poot.serve.logits)."""
        self.write_mask(self._bits)
        n = min(self.vocab, z.size)     # the model may embed more ids, or fewer, than it spells
        allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:n]
        z[:n][allowed == 0] = -np.inf
        z[n:] = -np.inf

    def accept(self, token: int) -> None:
        """The token drawn (always one the mask allowed; a stop token ends the matcher)."""
        self.matcher.consume_token(token)

    @property
    def done(self) -> bool:
        """The grammar is complete and takes no further token."""
        return self.matcher.is_stopped()
