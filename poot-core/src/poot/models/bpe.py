r"""Byte-level BPE encoding of a GGUF "gpt2" vocabulary, held in a few flat arrays.

It computes what HF `tokenizers` computes for the same vocabulary (a BPE model with the
byte-level pre-tokenizer, its added tokens matched first), which the tests check on the
real SmolLM2 vocabulary and on random text: added tokens are found leftmost-longest in
the raw text; the rest is split by the pre-tokenizer's regex (digits isolated first where
the rule says so), each piece spelled in GPT-2's byte alphabet and merged by the lowest
merge rank first, the leftmost on a tie, exactly as `tokenizers`' merge queue does.

`tokenizers` holds a vocabulary twice as hash maps of owned strings (token -> id and id
-> token) beside the merge table, plus its library, for the life of a model (the
resident cost: docs/performance.md, issue 49's memory section). Here the merges are one sorted array of (left id, right id)
keys with their ranks and results; the token spellings stay in the Tokenizer's packed
`Spellings`; a hash index of the spellings exists only for a rule that looks whole words
up (llama3's ignore_merges). The pre-tokenizer regexes, written with `\p{L}`/`\p{N}` as
llama.cpp gives them, run on the standard library's `re` (see `re_pattern`) rather than
the `regex` package, another resident library; so letters and numbers are those of this
Python's Unicode database (a character it does not know yet is neither).
"""
from __future__ import annotations

import functools
import heapq
import re
from array import array
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from poot.errors import CheckpointError

#: GPT-2's pre-tokenizer regex (HF tokenizers' ByteLevel(use_regex=True) uses this one)
GPT2_REGEX = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"
              r"|\s+(?!\S)|\s+")
#: the words kept in the cache of merged words (as tokenizers' BPE cache)
CACHE_WORDS = 10_000


@dataclass(frozen=True)
class PreTokenizerRule:
    """How a `tokenizer.ggml.pre` value splits text before the merges."""
    pattern: str = GPT2_REGEX      # each match, and each stretch between matches, a piece
    digits: bool = False           # every number character its own piece first
    ignore_merges: bool = False    # a piece found whole in the vocab is one token


@dataclass(frozen=True)
class Encoding:
    """The ids of one encoded text (the `.ids` of a tokenizers Encoding)."""
    ids: list[int]


def byte_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: the character that spells each byte 0..255 (printable
    Latin-1 bytes stand for themselves, every other byte b is chr(256 + n) with n
    counting those bytes in order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    spelled = {b: chr(b) for b in printable}
    rest = (b for b in range(256) if b not in spelled)
    for n, b in enumerate(rest):
        spelled[b] = chr(256 + n)
    return [spelled[b] for b in range(256)]


class ByteLevelBPE:
    """Encodes text to token ids for a byte-level BPE vocabulary.

    `tokens` are the vocabulary's spellings (id -> str, read here only; `spellings`, the
    same packed, are kept where the rule looks whole pieces up), `merges`
    its "left right" merge lines in rank order, `added` the (spelling, special) tokens
    matched whole in raw text. Like `tokenizers`, a token spelled twice keeps its first
    id, a merge listed twice keeps its last rank, and with `encode_special_tokens` set
    the special ones among the added tokens are read as plain text."""

    def __init__(self, tokens: Sequence[str], merges: Sequence[str],
                 added: Sequence[tuple[str, bool]], rule: PreTokenizerRule, file: str, *,
                 spellings: Sequence[str] | None = None):
        first: dict[str, int] = {}
        for i, token in enumerate(tokens):
            first.setdefault(token, i)
        self.rule = rule
        self.encode_special_tokens = False
        self._split = re.compile(re_pattern(rule.pattern))
        self._numbers = re.compile(re_pattern(r"\p{N}")) if rule.digits else None
        # each byte's single-character token (-1: none, the byte is dropped, as there)
        self._byte_ids = [first.get(c, -1) for c in byte_alphabet()]
        self._spell = str.maketrans({b: c for b, c in enumerate(byte_alphabet())})
        self._keys, self._merged = _merge_table(first, merges, file)
        self._added, self._added_re = _added_tokens(first, added)
        self._whole = _SpellingIndex(tokens, spellings if spellings is not None else tokens) \
            if rule.ignore_merges else None
        self._cache: dict[str, tuple[int, ...]] = {}
        del first

    def encode(self, text: str, add_special_tokens: bool = False) -> Encoding:
        """The ids of `text` (add_special_tokens: accepted as tokenizers' is; a GGUF
        vocabulary's BOS/EOS are the Tokenizer's to add)."""
        ids: list[int] = []
        for piece, added in self._added_split(text):
            if added is not None:
                ids.append(added)
                continue
            for word in self._pre_tokenize(piece):
                ids.extend(self._word(word))
        return Encoding(ids)

    # -- the pipeline ------------------------------------------------------------------------
    def _added_split(self, text: str):
        """(piece of plain text, None) and (spelling, its id) for each added token found,
        leftmost-longest, in order."""
        if self._added_re is None:
            yield text, None
            return
        at = 0
        for m in self._added_re.finditer(text):
            token_id, special = self._added[m.group()]
            if special and self.encode_special_tokens:
                continue
            if m.start() > at:
                yield text[at:m.start()], None
            yield m.group(), token_id
            at = m.end()
        if at < len(text):
            yield text[at:], None

    def _pre_tokenize(self, text: str):
        """The pieces the rule splits `text` into."""
        parts = _isolate(self._numbers, text) if self._numbers is not None else [text]
        for part in parts:
            yield from _isolate(self._split, part)

    def _word(self, piece: str) -> tuple[int, ...]:
        """The token ids of one piece: its bytes' tokens merged, or the token spelling the
        whole piece in the byte alphabet where the rule looks pieces up first."""
        found = self._cache.get(piece)
        if found is not None:
            return found
        raw = piece.encode("utf-8")
        whole = None
        if self._whole is not None:
            whole = self._whole.get(raw.decode("latin-1").translate(self._spell))
        out = (whole,) if whole is not None else \
            self._merge([self._byte_ids[b] for b in raw])
        if len(self._cache) >= CACHE_WORDS:
            self._cache.clear()
        self._cache[piece] = out
        return out

    def _lookup(self, left: int, right: int) -> int:
        """rank << 32 | merged id of the pair, or -1."""
        key = left << 32 | right
        i = bisect_left(self._keys, key)
        return self._merged[i] if i < len(self._keys) and self._keys[i] == key else -1

    def _merge(self, symbols: list[int]) -> tuple[int, ...]:
        """Merge the symbols of one word: the queue of tokenizers' Word::merge_all
        (lowest rank first, then leftmost; an entry whose pair changed is skipped)."""
        symbols = [s for s in symbols if s >= 0]
        n = len(symbols)
        nxt, prev, alive = list(range(1, n + 1)), list(range(-1, n - 1)), [True] * n
        queue = []
        for pos in range(n - 1):
            found = self._lookup(symbols[pos], symbols[pos + 1])
            if found >= 0:
                queue.append((found >> 32, pos, found & 0xFFFFFFFF))
        heapq.heapify(queue)
        while queue:
            _, pos, new_id = heapq.heappop(queue)
            if not alive[pos] or nxt[pos] >= n:
                continue
            right = nxt[pos]
            now = self._lookup(symbols[pos], symbols[right])
            if now < 0 or now & 0xFFFFFFFF != new_id:
                continue
            symbols[pos], alive[right] = new_id, False
            nxt[pos] = nxt[right]
            if nxt[pos] < n:
                prev[nxt[pos]] = pos
            if prev[pos] >= 0:
                found = self._lookup(symbols[prev[pos]], new_id)
                if found >= 0:
                    heapq.heappush(queue, (found >> 32, prev[pos], found & 0xFFFFFFFF))
            if nxt[pos] < n:
                found = self._lookup(new_id, symbols[nxt[pos]])
                if found >= 0:
                    heapq.heappush(queue, (found >> 32, pos, found & 0xFFFFFFFF))
        return tuple(s for s, keep in zip(symbols, alive, strict=True) if keep)


#: Unicode's White_Space characters: what `\s` matches in tokenizers' (Oniguruma's)
#: regexes (`re`'s `\s` adds U+001C..U+001F)
WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


def re_pattern(pattern: str) -> str:
    r"""`pattern`, written with the `regex` syntax of the pre-tokenizer rules (`\p{L}`,
    `\p{N}`, `\s`, and classes `[^\s\p{L}\p{N}]`, `[^\r\n\p{L}\p{N}]`), in `re`'s
    syntax. `re` knows no `\p{..}`, but its `\w` is exactly letters, numbers and "_", and
    `\d` the decimal digits; the other numbers come from `_other_numbers`."""
    others = _other_numbers()
    letter = rf"(?:(?![{others}])[^\W\d_])"
    number = rf"(?:\d|[{others}])"
    out = pattern.replace(r"[^\s\p{L}\p{N}]", rf"(?:[^{WHITE_SPACE}\w]|_)")
    out = out.replace(r"[^\r\n\p{L}\p{N}]", r"(?:[^\r\n\w]|_)")
    out = out.replace(r"\p{L}", letter).replace(r"\p{N}", number)
    out = out.replace(r"\s", f"[{WHITE_SPACE}]").replace(r"\S", f"[^{WHITE_SPACE}]")
    if r"\p{" in out:
        raise ValueError(f"pre-tokenizer regex {pattern!r} uses a Unicode class that "
                         "poot.models.bpe.re_pattern does not translate")
    return out


@functools.cache
def _other_numbers() -> str:
    r"""A `re` class body of the numbers that are not decimal digits (Unicode's Nl and No)
    as this Python's Unicode database has them: the characters `[^\W\d_]` matches that
    are not letters, found in one pass over every code point."""
    points = np.arange(0x110000, dtype=np.uint32)
    points[0xD800:0xE000] = 0x20                      # surrogates are no characters
    every = points.tobytes().decode("utf-32-le")
    found = [c for m in re.finditer(r"[^\W\d_]+", every) if not m.group().isalpha()
             for c in m.group() if not c.isalpha()]
    spans: list[list[int]] = []
    for c in map(ord, found):
        if spans and c == spans[-1][1] + 1:
            spans[-1][1] = c
        else:
            spans.append([c, c])
    return "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}"
                   for a, b in spans)


def _isolate(pattern, text: str) -> list[str]:
    """`text` split into each match of `pattern` and each stretch between (tokenizers'
    "isolated" split behaviour)."""
    out, at = [], 0
    for m in pattern.finditer(text):
        if m.start() > at:
            out.append(text[at:m.start()])
        if m.end() > m.start():
            out.append(m.group())
        at = m.end()
    if at < len(text):
        out.append(text[at:])
    return out


def _merge_table(first: dict[str, int], merges: Sequence[str],
                 file: str) -> tuple[array, array]:
    """(sorted left << 32 | right keys, rank << 32 | merged id of each) of `merges`; a
    pair listed twice keeps its last rank."""
    keys = np.empty(len(merges), np.int64)
    values = np.empty(len(merges), np.int64)
    for rank, line in enumerate(merges):
        left, sep, right = line.partition(" ")
        if not sep or not left or not right:
            raise CheckpointError(f"{file}: GGUF merge {line!r} is not two tokens separated "
                                  "by a space")
        ids = [first.get(left), first.get(right), first.get(left + right)]
        if None in ids:
            missing = (left, right, left + right)[ids.index(None)]
            raise CheckpointError(f"{file}: the GGUF vocabulary and merges do not form a BPE "
                                  f"tokenizer (merge {line!r} needs {missing!r}, which is "
                                  "not in the vocabulary)")
        keys[rank] = ids[0] << 32 | ids[1]
        values[rank] = rank << 32 | ids[2]
    # the last of equal keys: a stable sort of the reversed table, then the first of each
    order = np.argsort(keys[::-1], kind="stable")
    keys, values = keys[::-1][order], values[::-1][order]
    keep = np.ones(len(keys), bool)
    keep[1:] = keys[1:] != keys[:-1]
    return array("q", keys[keep].tobytes()), array("q", values[keep].tobytes())


def _added_tokens(first: dict[str, int], added: Sequence[tuple[str, bool]]):
    """({spelling: (id, special)}, the pattern finding them leftmost-longest) or
    ({}, None) where there are none."""
    table: dict[str, tuple[int, bool]] = {}
    for spelling, special in added:
        if spelling and spelling not in table:
            table[spelling] = (first[spelling], special)
    if not table:
        return table, None
    alternatives = sorted(table, key=len, reverse=True)
    return table, re.compile("|".join(re.escape(s) for s in alternatives))


class _SpellingIndex:
    """Token spelling -> its first id, as a sorted array of the spellings' hashes (this
    process's str hash) checked against the spellings themselves."""

    def __init__(self, tokens: Sequence[str], kept: Sequence[str]):
        self.tokens = kept
        hashes = np.fromiter((hash(t) for t in tokens), np.int64, len(tokens))
        self.order = np.argsort(hashes, kind="stable").astype(np.int32)  # first id first
        self.hashes = hashes[self.order]

    def get(self, word: str) -> int | None:
        h = hash(word)
        i = int(np.searchsorted(self.hashes, h))
        while i < len(self.hashes) and self.hashes[i] == h:
            token_id = int(self.order[i])
            if self.tokens[token_id] == word:
                return token_id
            i += 1
        return None
