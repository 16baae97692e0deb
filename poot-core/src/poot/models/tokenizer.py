"""Tokenizers from a GGUF's own vocabulary or an HF tokenizer.json.

Two GGUF vocabulary kinds (`tokenizer.ggml.model`):
- "gpt2": byte-level BPE, encoded by poot.models.bpe (what HF `tokenizers` computes, in a
  fraction of its memory). Tokens spell bytes with GPT-2's byte-to-unicode alphabet
  ("Ġ" = space); the merges come from `tokenizer.ggml.merges`; the pre-tokenizer regex
  follows `tokenizer.ggml.pre` (see PRE_TOKENIZERS).
- "llama": SentencePiece-style BPE, built with HF `tokenizers`, as is an HF folder's
  tokenizer.json. "▁" marks a space, unknown characters fall back to the
  <0xXX> byte tokens, and merge priority is the merged piece's score (`tokenizer.ggml.scores`).

Special tokens (token_type 3 = control, 4 = user-defined) are matched in text as whole tokens.
Decoding works on bytes so that a streamed piece never splits a multi-byte UTF-8 character.
"""
from __future__ import annotations

import codecs
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from poot.checked import Values, load_json, read_text
from poot.errors import CheckpointError, TokenizerError
from poot.models.bpe import GPT2_REGEX, ByteLevelBPE, PreTokenizerRule, byte_alphabet
from poot.optional import require

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE_MARK = "\u2581"  # SentencePiece's "▁"


# Control tokens that end a generation although the metadata names only one EOS id: chat models
# end a turn with one token and a document with another (SmolLM2: <|im_end|>, <|endoftext|>).
END_OF_GENERATION = frozenset({
    "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|end|>",
    "<end_of_turn>", "<|return|>", "</s>",
})
#: harmony (gpt-oss): <|end|> closes one message of a turn (the analysis before the final
#: answer), so generation ends at <|return|> or at a tool call's <|call|> instead
HARMONY_END = END_OF_GENERATION - {"<|end|>"} | {"<|call|>"}


def end_names(arch: str | None) -> frozenset[str]:
    """The special tokens that end generation for a model of `arch` (HF model_type or GGUF
    architecture)."""
    return HARMONY_END if arch in ("gpt_oss", "gpt-oss") else END_OF_GENERATION


# -- pre-tokenizers by GGUF `tokenizer.ggml.pre` ---------------------------------------------
# The regexes are the ones llama.cpp applies for each `pre` value (llama-vocab.cpp).
# "smollm" (SmolLM/SmolLM2) is llama.cpp's STARCODER family: first "\p{N}" isolates every digit,
# then the GPT-2 regex splits words -- the pair SmolLM2's HF tokenizer.json declares
# (Digits(individual_digits=True), then ByteLevel's own regex).
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_GPT2 = PreTokenizerRule(GPT2_REGEX)
_DIGITS_GPT2 = PreTokenizerRule(GPT2_REGEX, digits=True)
_LLAMA3 = PreTokenizerRule(_LLAMA3_REGEX, ignore_merges=True)
_QWEN2 = PreTokenizerRule(_QWEN2_REGEX)
PRE_TOKENIZERS: dict[str, PreTokenizerRule] = {
    **dict.fromkeys(["gpt-2", "mpt", "olmo", "jais"], _GPT2),
    **dict.fromkeys(["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                     "minerva"], _DIGITS_GPT2),
    **dict.fromkeys(["llama3", "llama-v3", "llama-bpe"], _LLAMA3),
    **dict.fromkeys(["qwen2", "stablelm2", "deepseek-r1-qwen"], _QWEN2),
}


# -- bytes of each token ---------------------------------------------------------------------
def gpt2_unicode_to_byte() -> dict[str, int]:
    """GPT-2's byte-level alphabet (poot.models.bpe.byte_alphabet), inverted, in GPT-2's
    order (the printable bytes, then the others): vocabularies are built from it."""
    return {c: b for b, c in sorted(enumerate(byte_alphabet()), key=lambda bc: bc[1])}


def _byte_level_bytes(token: str, table: dict[str, int]) -> bytes:
    if all(c in table for c in token):
        return bytes(table[c] for c in token)
    return token.encode("utf-8")  # not in byte-level spelling: an added token's raw text


def _sentencepiece_bytes(token: str) -> bytes:
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return bytes([int(token[3:5], 16)])
        except ValueError:
            pass
    return token.replace(SPACE_MARK, " ").encode("utf-8")


# -- the tokenizer ---------------------------------------------------------------------------
class Spellings(Sequence):
    """A vocabulary's token spellings (str, or bytes with `text=False`) packed in one buffer:
    as Python objects 50k-260k short strings take ~50 bytes of overhead each, several MiB
    held for the model's life. Indexing gives a new str or bytes."""

    def __init__(self, items: Iterable, *, text: bool = True):
        raw = [x.encode("utf-8") if text else bytes(x) for x in items]
        self.text = text
        self.data = b"".join(raw)
        ends = np.cumsum([len(x) for x in raw], dtype=np.int64)
        self.ends = ends.astype(np.uint32) if len(self.data) < 2**32 else ends

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]                  # IndexError and negative ids as a list's
        raw = self.data[self.ends[i - 1] if i else 0:self.ends[i]]
        return raw.decode("utf-8") if self.text else raw


class ByteLevelBytes(Sequence):
    """The bytes of each token of a byte-level vocabulary, read from its packed spellings
    rather than held a second time: a token spelled in GPT-2's byte alphabet stands for
    those bytes; an added token (control, user-defined), or one with a character outside
    the alphabet, for its text in UTF-8. Indexing gives a new bytes."""

    def __init__(self, tokens: Spellings, added: Iterable[int]):
        self.tokens, self.added = tokens, frozenset(added)
        alphabet = gpt2_unicode_to_byte()
        # alphabet characters to the Latin-1 character of their byte; the Latin-1
        # characters outside the alphabet to one that Latin-1 cannot encode
        self._to_latin1 = {**{c: "\uffff" for c in range(256)},
                           **{ord(c): chr(b) for c, b in alphabet.items()}}

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]
        token = self.tokens[i]
        if i not in self.added:
            try:
                return token.translate(self._to_latin1).encode("latin-1")
            except UnicodeEncodeError:
                pass
        return token.encode("utf-8")


class Tokenizer:
    """Text <-> token ids, with the BOS/EOS policy and special tokens of one model."""

    def __init__(self, backend, *, tokens: Sequence[str], token_bytes: Sequence[bytes],
                 special_ids: Iterable[int],
                 bos_id: int | None, eos_id: int | None, pad_id: int | None = None,
                 add_bos: bool = False, add_eos: bool = False, stop_ids: Iterable[int] = (),
                 strip_leading_space: bool = False, chat_template: str | None = None):
        # a ByteLevelBPE or a tokenizers.Tokenizer: encode(text, add_special_tokens).ids
        # and the encode_special_tokens flag
        self.backend = backend
        self.tokens = tokens if isinstance(tokens, Spellings) else Spellings(tokens)
        # a list is packed; a packed sequence (ByteLevelBytes) is kept as it is
        self.token_bytes = Spellings(token_bytes, text=False) \
            if isinstance(token_bytes, list) else token_bytes
        if len(self.tokens) != len(self.token_bytes):
            raise CheckpointError(
                f"{len(self.tokens)} tokens but {len(self.token_bytes)} byte spellings")
        self.special_ids = frozenset(special_ids)
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.add_bos, self.add_eos = add_bos, add_eos
        # every id that ends a generation: EOS, end-of-turn and end-of-document tokens
        self.stop_ids = frozenset(i for i in (eos_id, *stop_ids) if i is not None)
        # SentencePiece prepends "▁" to the text; decoding a whole text removes it again.
        self.strip_leading_space = strip_leading_space
        self.chat_template = chat_template
        self._encoding = threading.Lock()  # encode_text's flag on the shared backend

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    @property
    def bos_token(self) -> str:
        return self.id_to_token(self.bos_id) if self.bos_id is not None else ""

    @property
    def eos_token(self) -> str:
        return self.id_to_token(self.eos_id) if self.eos_id is not None else ""

    def id_to_token(self, token_id: int) -> str:
        self._check_ids([token_id])
        return self.tokens[token_id]

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of `text`; with add_special, BOS/EOS as the model's metadata asks."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode takes a str, got {type(text).__name__}")
        with self._encoding:
            ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        if add_special and self.add_eos and self.eos_id is not None:
            ids = [*ids, self.eos_id]
        return ids

    def encode_text(self, text: str) -> list[int]:
        """Token ids of `text` with control tokens' spellings read as plain text: for what a
        user wrote (a chat message's content), where "<|im_start|>" must not become the
        control token. No BOS/EOS."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode_text takes a str, got {type(text).__name__}")
        # the flag is the backend's state (a copy of the backend costs hundreds of MiB for a
        # large vocabulary), so encode() waits while it is set
        with self._encoding:
            self.backend.encode_special_tokens = True
            try:
                return self.backend.encode(text, add_special_tokens=False).ids
            finally:
                self.backend.encode_special_tokens = False

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """The text of a whole token sequence (control tokens left out when skip_special).

        Works on the tokens' bytes, like StreamDecoder, so the two always agree."""
        return "".join(StreamDecoder(self, skip_special=skip_special, at_text_start=True)
                       .feed(ids))

    def stream(self, *, skip_special: bool = True, at_text_start: bool = False) -> StreamDecoder:
        """A StreamDecoder for this tokenizer (see StreamDecoder)."""
        return StreamDecoder(self, skip_special=skip_special, at_text_start=at_text_start)

    def _check_ids(self, ids: Sequence[int]) -> None:
        bad = [i for i in ids if not 0 <= i < len(self.token_bytes)]
        if bad:
            raise TokenizerError(
                f"token id {bad[0]} is outside the vocabulary (size {len(self.token_bytes)})")

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any], file: str = "GGUF metadata") -> Tokenizer:
        """Build from the `tokenizer.*` keys of a GGUF (see poot.models.gguf_meta); `file`
        names the GGUF in errors."""
        from poot.models.shapes import LIMITS

        v = Values(meta, file)
        kind = v.text("tokenizer.ggml.model", None)
        tokens = v.text_list("tokenizer.ggml.tokens", [], max_len=LIMITS["vocab"])
        if not tokens:
            raise CheckpointError(f"{file}: GGUF metadata has no tokenizer.ggml.tokens "
                                  "vocabulary")
        n = len(tokens)
        types = v.int_list("tokenizer.ggml.token_type", None, lo=0, hi=BYTE) or [NORMAL] * n
        if len(types) != n:
            raise CheckpointError(f"{file}: GGUF tokenizer has {n} tokens but "
                                  f"{len(types)} token types")

        def token_id(key):
            return v.integer(f"tokenizer.ggml.{key}", None, lo=0, hi=n - 1)

        spellings = Spellings(tokens)
        if kind == "gpt2":
            backend, token_bytes = _byte_level_backend(v, spellings, tokens, types)
            strip = False
        elif kind == "llama":
            backend, token_bytes, strip = _sentencepiece_backend(v, tokens, types,
                                                                 token_id("unknown_token_id"))
            _add_special_tokens(backend, tokens, types)
        else:
            raise CheckpointError(f"{file}: GGUF tokenizer model {kind!r} is not supported; "
                                  "poot reads 'gpt2' (byte-level BPE) and 'llama' "
                                  "(SentencePiece BPE)")
        special = [i for i, t in enumerate(types) if t == CONTROL]
        stop = [token_id(f"{k}_token_id") for k in ("eot", "eom")]
        ends = end_names(v.text("general.architecture", None))
        stop += [i for i in special if tokens[i] in ends]
        return cls(
            backend, tokens=spellings, token_bytes=token_bytes, special_ids=special,
            bos_id=token_id("bos_token_id"), eos_id=token_id("eos_token_id"),
            pad_id=token_id("padding_token_id"),
            add_bos=v.flag("tokenizer.ggml.add_bos_token", kind == "llama"),
            add_eos=v.flag("tokenizer.ggml.add_eos_token", False),
            stop_ids=[i for i in stop if i is not None], strip_leading_space=strip,
            chat_template=v.text("tokenizer.chat_template", None)
            or _builtin_template(v.text("general.architecture", "")),
        )

    @classmethod
    def from_gguf(cls, path: str | Path) -> Tokenizer:
        from poot.models.gguf_meta import read_gguf_metadata

        return cls.from_gguf_metadata(read_gguf_metadata(path), str(path))

    @classmethod
    def from_hf_folder(cls, path: str | Path) -> Tokenizer:
        """Build from an HF folder: tokenizer.json, plus tokenizer_config.json, config.json
        and generation_config.json."""
        HFTokenizer = require("tokenizers").Tokenizer

        folder = Path(path)
        file = folder / "tokenizer.json"
        if not file.is_file():
            raise CheckpointError(f"{folder} has no tokenizer.json")
        spec = load_json(file)  # UTF-8, depth-limited, an object: before the Rust parser sees it
        try:
            backend = HFTokenizer.from_file(str(file))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # a bare Exception, or a Rust panic (a BaseException)
            raise CheckpointError(f"cannot read {file}: {exc}") from exc
        config = _side_file(folder / "tokenizer_config.json")
        model_config = _side_file(folder / "config.json")
        generation = _side_file(folder / "generation_config.json")
        scheme = _hf_byte_scheme(spec, file)
        size = backend.get_vocab_size(with_added_tokens=True)
        added = backend.get_added_tokens_decoder()
        beyond = [i for i in added if not 0 <= i < size]
        if beyond:
            raise CheckpointError(f"{file}: added token id {beyond[0]} lies outside the "
                                  f"vocabulary of {size} tokens")
        table = gpt2_unicode_to_byte()
        tokens, token_bytes = [], []
        for i in range(size):
            token = backend.id_to_token(i) or ""
            tokens.append(token)
            if i in added:
                token_bytes.append(token.encode("utf-8"))
            elif scheme == "byte_level":
                token_bytes.append(_byte_level_bytes(token, table))
            else:
                token_bytes.append(_sentencepiece_bytes(token))
        bos_id = _hf_token_id(backend, config.values.get("bos_token"),
                              model_config.integer("bos_token_id", None, lo=0, hi=size - 1))
        eos_ids = _id_list(model_config, "eos_token_id", size)
        eos_id = _hf_token_id(backend, config.values.get("eos_token"),
                              eos_ids[0] if eos_ids else None)
        special = [i for i, tok in added.items() if tok.special]
        ends = end_names(model_config.text("model_type", None))
        stop_ids = eos_ids + _id_list(generation, "eos_token_id", size) + \
            [i for i in special if tokens[i] in ends]
        probe_bos, probe_eos = _post_processor_adds(backend, bos_id, eos_id)
        return cls(
            backend, tokens=tokens, token_bytes=token_bytes,
            special_ids=special, bos_id=bos_id, eos_id=eos_id,
            pad_id=_hf_token_id(backend, config.values.get("pad_token"), None),
            add_bos=config.flag("add_bos_token", probe_bos),
            add_eos=config.flag("add_eos_token", probe_eos),
            stop_ids=stop_ids, strip_leading_space=scheme == "sentencepiece",
            chat_template=_hf_chat_template(folder, config),
        )


class StreamDecoder:
    """Turns token ids into text pieces as they arrive, holding back incomplete UTF-8 bytes.

    `push(id)` returns the text that became complete (possibly ""); `flush()` returns what is
    held back at the end (invalid bytes become U+FFFD). With at_text_start, the leading space a
    SentencePiece tokenizer prepended is removed, as `Tokenizer.decode` does for a whole text;
    leave it False when streaming a continuation such as generated tokens after a prompt.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = True,
                 at_text_start: bool = False):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip_pending = at_text_start and tokenizer.strip_leading_space

    def push(self, token_id: int) -> str:
        token_id = int(token_id)
        self.tokenizer._check_ids([token_id])
        if self.skip_special and token_id in self.tokenizer.special_ids:
            return ""
        return self._emit(self._utf8.decode(self.tokenizer.token_bytes[token_id], final=False))

    def flush(self) -> str:
        return self._emit(self._utf8.decode(b"", final=True))

    def feed(self, ids: Iterable[int]) -> Iterator[str]:
        """Every non-empty piece of `ids`, then what flush() leaves."""
        for token_id in ids:
            if piece := self.push(token_id):
                yield piece
        if rest := self.flush():
            yield rest

    def _emit(self, text: str) -> str:
        if self._strip_pending and text:
            self._strip_pending = False
            return text[1:] if text.startswith(" ") else text
        return text


def _builtin_template(arch: str) -> str | None:
    from poot.models.chat import BUILTIN_TEMPLATES

    return BUILTIN_TEMPLATES.get(arch)


# -- GGUF vocabularies -----------------------------------------------------------------------
def _first_id_vocab(tokens: Sequence[str]) -> dict[str, int]:
    """token -> id, the first id winning where a vocabulary repeats a token."""
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    return vocab


def _byte_level_backend(v: Values, spellings: Spellings, tokens: list[str], types: list[int]):
    pre = v.text("tokenizer.ggml.pre", "default")
    rule = PRE_TOKENIZERS.get(pre)
    if rule is None:
        raise CheckpointError(
            f"{v.file}: GGUF pre-tokenizer {pre!r} is not supported; poot knows "
            f"{', '.join(sorted(PRE_TOKENIZERS))}")
    added = [(t, kind == CONTROL) for t, kind in zip(tokens, types, strict=True)
             if kind in (CONTROL, USER_DEFINED)]
    backend = ByteLevelBPE(tokens, v.text_list("tokenizer.ggml.merges", []), added, rule,
                           str(v.file), spellings=spellings)
    return backend, ByteLevelBytes(spellings, [i for i, kind in enumerate(types)
                                               if kind in (CONTROL, USER_DEFINED)])


def _bpe(file: str, vocab: dict[str, int], merges: list[tuple[str, str]], **options):
    """A tokenizers BPE model, or a CheckpointError (e.g. a merge of tokens not in the
    vocabulary: tokenizers raises a bare Exception)."""
    models = require("tokenizers").models

    try:
        return models.BPE(vocab, merges, **options)
    except Exception as exc:
        raise CheckpointError(f"{file}: the GGUF vocabulary and merges do not form a BPE "
                              f"tokenizer ({exc})") from exc


def _sentencepiece_backend(v: Values, tokens: list[str], types: list[int], unk_id: int | None):
    tk = require("tokenizers")
    HFTokenizer, decoders, normalizers = tk.Tokenizer, tk.decoders, tk.normalizers

    scores = v.number_list("tokenizer.ggml.scores", None) or \
        [-float(i) for i in range(len(tokens))]
    if len(scores) != len(tokens):
        raise CheckpointError(f"{v.file}: GGUF tokenizer has {len(tokens)} tokens but "
                              f"{len(scores)} scores")
    model = _bpe(
        v.file, _first_id_vocab(tokens), _merges_from_scores(tokens, types, scores),
        unk_token=tokens[unk_id] if unk_id is not None else None,
        fuse_unk=True, byte_fallback=True)
    backend = HFTokenizer(model)
    prefix = v.flag("tokenizer.ggml.add_space_prefix", True)
    steps = [normalizers.Prepend(SPACE_MARK)] if prefix else []
    backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPACE_MARK)])
    tail = [decoders.Strip(" ", 1, 0)] if prefix else []
    backend.decoder = decoders.Sequence(
        [decoders.Replace(SPACE_MARK, " "), decoders.ByteFallback(), decoders.Fuse(), *tail])
    return backend, [_sentencepiece_bytes(t) for t in tokens], prefix


def _merges_from_scores(tokens: list[str], types: list[int],
                        scores: list[float]) -> list[tuple[str, str]]:
    """SentencePiece BPE as merges: every split of a piece into two pieces of the vocabulary,
    ranked by the merged piece's score (highest first, then lowest id), which is the order in
    which SentencePiece joins adjacent pieces."""
    mergeable = {t for t, kind in zip(tokens, types, strict=True) if kind in (NORMAL, USER_DEFINED)}
    ranked = []
    for i, (token, kind) in enumerate(zip(tokens, types, strict=True)):
        if kind not in (NORMAL, USER_DEFINED):
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in mergeable and right in mergeable:
                ranked.append((-scores[i], i, left, right))
    ranked.sort()
    return [(left, right) for _, _, left, right in ranked]


def _add_special_tokens(backend, tokens: list[str], types: list[int]) -> None:
    """Make control and user-defined tokens match as whole tokens in raw text."""
    AddedToken = require("tokenizers").AddedToken

    control = [AddedToken(t, special=True, normalized=False)
               for t, kind in zip(tokens, types, strict=True) if kind == CONTROL]
    user = [AddedToken(t, special=False, normalized=False)
            for t, kind in zip(tokens, types, strict=True) if kind == USER_DEFINED]
    backend.add_special_tokens(control)
    backend.add_tokens(user)


# -- HF folders ------------------------------------------------------------------------------
def _side_file(path: Path) -> Values:
    """A side file of an HF folder (an empty one where it is absent), for checked reads."""
    return Values(load_json(path) if path.is_file() else {}, path)


def _hf_byte_scheme(spec: dict[str, Any], file: Path) -> str:
    """'byte_level' or 'sentencepiece', read from the tokenizer.json decoder."""
    def kinds(node) -> list[str]:  # spec is depth-limited (poot.checked.load_json)
        if not isinstance(node, dict):
            return []
        inner = node.get("decoders")
        return [str(node.get("type", ""))] + \
            [k for d in (inner if isinstance(inner, list) else []) for k in kinds(d)]

    found = kinds(spec.get("decoder"))
    if "ByteLevel" in found:
        return "byte_level"
    if "ByteFallback" in found or "Metaspace" in found:
        return "sentencepiece"
    raise CheckpointError(f"{file}: decoder {found or 'none'} is neither byte-level nor "
                          "SentencePiece; poot cannot stream its text")


def _hf_token_id(backend, token, fallback: int | None) -> int | None:
    if isinstance(token, dict):  # tokenizer_config.json may spell a token as an AddedToken
        token = token.get("content")
    if isinstance(token, str):
        found = backend.token_to_id(token)
        if found is not None:
            return found
    return fallback


def _post_processor_adds(backend, bos_id: int | None, eos_id: int | None) -> tuple[bool, bool]:
    """Whether tokenizer.json's post-processor adds BOS / EOS (Llama 3 says so only there)."""
    plain = backend.encode("a", add_special_tokens=False).ids
    full = backend.encode("a", add_special_tokens=True).ids
    if full == plain:
        return False, False
    return (bos_id is not None and full[:1] == [bos_id],
            eos_id is not None and full[-1:] == [eos_id])


def _id_list(v: Values, key: str, size: int) -> list[int]:
    """A token id or a list of them (config.json / generation_config.json eos_token_id)."""
    if isinstance(v.values.get(key), list):
        return v.int_list(key, lo=0, hi=size - 1, max_len=size)
    found = v.integer(key, None, lo=0, hi=size - 1)
    return [] if found is None else [found]


def _hf_chat_template(folder: Path, config: Values) -> str | None:
    template = config.values.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        named = {}
        for i, t in enumerate(template):
            entry = Values(t, f"{config.file} chat_template[{i}]")
            name = entry.text("name")
            named[name] = entry.text("template")
        template = named.get("default")
    elif template is not None:
        template = config.text("chat_template")
    if template is None and (folder / "chat_template.jinja").is_file():
        template = read_text(folder / "chat_template.jinja")
    return template
