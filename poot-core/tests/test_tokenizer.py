"""Tokenizers from GGUF vocabularies (byte-level and SentencePiece) and HF folders."""
from __future__ import annotations

import json
import unicodedata
from itertools import pairwise

import numpy as np
import pytest
from poot.errors import CheckpointError
from poot.models.tokenizer import (
    BYTE,
    CONTROL,
    NORMAL,
    UNKNOWN,
    USER_DEFINED,
    Tokenizer,
    TokenizerError,
    gpt2_unicode_to_byte,
)

# Characters of 1 to 4 UTF-8 bytes, so random texts cross token boundaries mid-character.
ALPHABET = list("ab c1 2\n") + ["é", "ß", "年", "日本", "🙂", "👍🏽", "  ", "\t"]


def random_texts(seed: int, count: int = 20) -> list[str]:
    rng = np.random.default_rng(seed)
    return ["".join(rng.choice(ALPHABET, size=int(rng.integers(1, 25)))) for _ in range(count)]


def stream_pieces(tokenizer, ids, **options) -> list[str]:
    return list(tokenizer.stream(**options).feed(ids))


def assert_round_trips(tokenizer, seed: int, reference, count: int = 20) -> None:
    """decode, the stream and the HF `tokenizers` reference's own decoder all give back
    random texts exactly, and the reference encodes them alike."""
    for text in random_texts(seed, count):
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text
        assert reference.decode(ids, skip_special_tokens=True) == text
        assert reference.encode(text, add_special_tokens=False).ids == \
            tokenizer.encode(text, add_special=False)
        pieces = stream_pieces(tokenizer, ids, at_text_start=True)
        assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)


# -- the GPT-2 byte alphabet -----------------------------------------------------------------
def test_gpt2_alphabet_matches_tokenizers_and_known_letters():
    from tokenizers import pre_tokenizers

    table = gpt2_unicode_to_byte()
    assert set(table) == set(pre_tokenizers.ByteLevel.alphabet())
    assert sorted(table.values()) == list(range(256))
    assert (table["Ġ"], table["Ċ"], table["Ā"], table["!"], table["Ń"]) == (0x20, 0x0A, 0, 33, 0xAD)


# -- a small byte-level (gpt2) vocabulary ----------------------------------------------------
def byte_level_meta(pre: str = "gpt-2", **extra) -> dict:
    letters = list(gpt2_unicode_to_byte())
    merged = ["Ġt", "he", "Ġthe", "12"]
    tokens = ["<|endoftext|>", "<tool>", *letters, *merged]
    types = [CONTROL, USER_DEFINED] + [NORMAL] * (len(letters) + len(merged))
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": ["Ġ t", "h e", "Ġt he", "1 2"],
            "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 0, **extra}


@pytest.fixture(scope="module")
def byte_level():
    return Tokenizer.from_gguf_metadata(byte_level_meta())


def test_byte_level_merges_and_specials(byte_level):
    tok = byte_level
    assert [tok.tokens[i] for i in tok.encode(" the")] == ["Ġthe"]
    ids = tok.encode("<|endoftext|>the<tool>")
    assert [tok.tokens[i] for i in ids] == ["<|endoftext|>", "t", "he", "<tool>"]
    assert tok.decode(ids) == "the<tool>"  # control tokens hidden, user-defined text kept
    assert tok.decode(ids, skip_special=False) == "<|endoftext|>the<tool>"


def test_byte_level_stream_holds_back_partial_characters(byte_level):
    ids = byte_level.encode("é🙂")
    assert len(ids) == 6  # no merges: one token per byte
    pieces = [byte_level.stream().push(i) for i in ids[:1]]
    assert pieces == [""]
    decoder = byte_level.stream()
    assert [decoder.push(i) for i in ids] == ["", "é", "", "", "", "🙂"]
    assert decoder.flush() == ""


def test_byte_level_round_trip_random_text(byte_level, hf_byte_level):
    assert_round_trips(byte_level, seed=1, reference=hf_byte_level(byte_level_meta()))


def test_stream_flush_marks_a_truncated_character(byte_level):
    ids = byte_level.encode("年")
    assert stream_pieces(byte_level, ids[:2]) == ["\ufffd"]


def test_smollm_pre_tokenizer_isolates_digits():
    plain = Tokenizer.from_gguf_metadata(byte_level_meta("gpt-2"))
    smollm = Tokenizer.from_gguf_metadata(byte_level_meta("smollm"))
    assert [plain.tokens[i] for i in plain.encode("12")] == ["12"]
    assert [smollm.tokens[i] for i in smollm.encode("12")] == ["1", "2"]


def test_bos_eos_flags_follow_metadata():
    meta = byte_level_meta(**{"tokenizer.ggml.add_bos_token": True,
                              "tokenizer.ggml.add_eos_token": True,
                              "tokenizer.ggml.eos_token_id": 1})
    tok = Tokenizer.from_gguf_metadata(meta)
    assert tok.encode("t") == [0, tok.tokens.index("t"), 1]
    assert tok.encode("t", add_special=False) == [tok.tokens.index("t")]
    assert tok.stop_ids == {0, 1}  # <|endoftext|> ends a generation whatever EOS says


def test_refusals(byte_level):
    with pytest.raises(CheckpointError, match="pre-tokenizer 'mystery'"):
        Tokenizer.from_gguf_metadata(byte_level_meta("mystery"))
    with pytest.raises(CheckpointError, match="tokenizer model 'bert'"):
        Tokenizer.from_gguf_metadata({**byte_level_meta(), "tokenizer.ggml.model": "bert"})
    with pytest.raises(CheckpointError, match="no tokenizer.ggml.tokens"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "gpt2"})
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        byte_level.decode([byte_level.vocab_size])
    with pytest.raises(TokenizerError):
        byte_level.stream().push(-1)


# -- a small SentencePiece-style (llama) vocabulary ------------------------------------------
SPM_PIECES = {"▁": -1.0, "h": -10.0, "e": -10.0, "l": -10.0, "o": -10.0, "w": -10.0, "r": -10.0,
              "d": -10.0, "he": -3.0, "ll": -4.0, "▁he": -2.0, "llo": -5.0, "▁hello": -1.5,
              "or": -6.0, "▁w": -6.0, "▁wor": -5.5, "ld": -7.0, "▁world": -1.8}


def spm_meta(**extra) -> dict:
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tokens = ["<unk>", "<s>", "</s>", *byte_tokens, *SPM_PIECES]
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256 + [NORMAL] * len(SPM_PIECES)
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + list(SPM_PIECES.values())
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0, **extra}


@pytest.fixture(scope="module")
def spm():
    return Tokenizer.from_gguf_metadata(spm_meta())


def test_spm_merges_by_score_and_adds_bos(spm):
    ids = spm.encode("hello world")
    assert [spm.tokens[i] for i in ids] == ["<s>", "▁hello", "▁world"]
    assert spm.decode(ids) == "hello world"


def test_spm_byte_fallback_and_streaming(spm):
    ids = spm.encode("héllo", add_special=False)
    assert [spm.tokens[i] for i in ids] == ["▁", "h", "<0xC3>", "<0xA9>", "llo"]
    assert spm.decode(ids) == "héllo"
    # a continuation keeps its space; the start of a text drops the one SentencePiece added
    assert stream_pieces(spm, ids) == [" ", "h", "é", "llo"]
    assert "".join(stream_pieces(spm, ids, at_text_start=True)) == "héllo"


def test_spm_round_trip_random_text(spm):
    assert all(spm.tokens[spm.encode(text)[0]] == "<s>" for text in random_texts(seed=2))
    assert_round_trips(spm, seed=2, reference=spm.backend)


def random_spm_meta(seed: int) -> dict:
    """A SentencePiece vocabulary of random corpus substrings with random scores."""
    rng = np.random.default_rng(seed)
    corpus = "".join(rng.choice(list("abcdefgé▁"), size=3000))
    pieces = sorted({corpus[i:i + n] for n in range(1, 6) for i in range(0, len(corpus) - n, 5)})
    meta = spm_meta()
    meta["tokenizer.ggml.tokens"] = meta["tokenizer.ggml.tokens"][:259] + pieces
    meta["tokenizer.ggml.token_type"] = meta["tokenizer.ggml.token_type"][:259] + \
        [NORMAL] * len(pieces)
    meta["tokenizer.ggml.scores"] = [0.0] * 259 + (-rng.random(len(pieces)) * 10).tolist()
    return meta


def naive_sentencepiece(text: str, meta: dict) -> list[int]:
    """SentencePiece BPE written out: join the adjacent pair whose join scores best, leftmost
    first, until no join is in the vocabulary; spell what is left in <0xXX> byte tokens."""
    ids = {t: i for i, t in enumerate(meta["tokenizer.ggml.tokens"])}
    scores = dict(zip(meta["tokenizer.ggml.tokens"][259:], meta["tokenizer.ggml.scores"][259:],
                      strict=True))
    symbols = list("▁" + text.replace(" ", "▁"))
    while True:
        joins = [(scores[a + b], -i) for i, (a, b) in enumerate(pairwise(symbols))
                 if a + b in scores]
        if not joins:
            break
        i = -max(joins)[1]
        symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
    out = []
    for symbol in symbols:
        known = symbol in scores
        out += [ids[symbol]] if known else [ids[f"<0x{b:02X}>"] for b in symbol.encode()]
    return out


def test_spm_matches_naive_sentencepiece_merging():
    meta = random_spm_meta(seed=5)
    tok = Tokenizer.from_gguf_metadata(meta)
    rng = np.random.default_rng(6)
    for _ in range(200):
        text = "".join(rng.choice(list("abcdefgé 年"), size=int(rng.integers(1, 40))))
        assert tok.encode(text, add_special=False) == naive_sentencepiece(text, meta), text


def test_spm_without_space_prefix():
    tok = Tokenizer.from_gguf_metadata(spm_meta(**{"tokenizer.ggml.add_space_prefix": False,
                                                   "tokenizer.ggml.add_bos_token": False}))
    assert [tok.tokens[i] for i in tok.encode("he world")] == ["he", "▁world"]
    assert tok.decode(tok.encode(" hello")) == " hello"


# -- an HF folder ----------------------------------------------------------------------------
def test_from_hf_folder(tmp_path, byte_level, hf_byte_level):
    hf_byte_level(byte_level_meta()).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|endoftext|>", "eos_token": {"content": "<tool>"},
        "add_bos_token": True, "chat_template": "{{ messages[0]['content'] }}"}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [1, 0]}))
    tok = Tokenizer.from_hf_folder(tmp_path)
    assert (tok.bos_id, tok.eos_id, tok.stop_ids) == (0, 1, {0, 1})
    assert tok.encode(" the") == [0, byte_level.tokens.index("Ġthe")]
    assert tok.chat_template == "{{ messages[0]['content'] }}"
    assert_round_trips(tok, seed=3, reference=tok.backend, count=5)


def test_from_hf_folder_reads_bos_from_the_post_processor(tmp_path, byte_level,
                                                          hf_byte_level):
    from tokenizers import processors

    backend = hf_byte_level(byte_level_meta())
    backend.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)])
    backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|endoftext|>"}))
    tok = Tokenizer.from_hf_folder(tmp_path)
    assert tok.add_bos and not tok.add_eos
    assert tok.encode("t") == [0, byte_level.tokens.index("t")]


def test_from_hf_folder_without_tokenizer_json(tmp_path):
    with pytest.raises(CheckpointError, match="no tokenizer.json"):
        Tokenizer.from_hf_folder(tmp_path)


# -- the real SmolLM2 vocabulary -------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    return Tokenizer.from_gguf(smollm2_gguf)


def test_smollm2_encodes_words_as_whole_vocabulary_tokens(smollm2):
    words = ["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis"]
    assert smollm2.encode("The capital of France is") == [smollm2.tokens.index(w) for w in words]
    assert [smollm2.tokens[i] for i in smollm2.encode("in 2024")] == ["in", "Ġ", "2", "0", "2", "4"]
    assert smollm2.encode("<|im_start|>user")[0] == 1


def test_smollm2_special_ids(smollm2):
    assert (smollm2.bos_id, smollm2.eos_id, smollm2.add_bos) == (1, 2, False)
    assert smollm2.eos_token == "<|im_end|>" and smollm2.stop_ids == {0, 2}


def test_smollm2_round_trip_and_stream(smollm2, smollm2_gguf, hf_byte_level):
    from poot.models.gguf_meta import read_gguf_metadata

    assert_round_trips(smollm2, seed=4, reference=hf_byte_level(read_gguf_metadata(smollm2_gguf)))


#: code points of every Unicode category (but unassigned ones, which Unicode versions
#: assign differently) and surrogates
CODE_POINTS = np.array([c for c in range(0x20000)
                        if unicodedata.category(chr(c)) not in ("Cn", "Cs")])
PLAIN = [*"abcXYZ 0123456789 \n\t\r.,'!?-'s're've  _", "\x1c", "\x85", "\xa0", "\u2009", "\u3000",
         "\u2028", "²", "Ⅻ"]


def mixed_texts(seed: int, count: int) -> list[str]:
    """Texts of ASCII words, digits and spaces mixed with characters from all over Unicode,
    and SmolLM2's control tokens."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        n = int(rng.integers(1, 120))
        wide, plain = rng.choice(CODE_POINTS, n), rng.choice(PLAIN, n)
        chars = [chr(int(c)) if rng.random() < 0.3 else str(x)
                 for c, x in zip(wide, plain, strict=True)]
        for token in ("<|im_start|>", "<|im_end|>")[:k % 3]:
            chars.insert(int(rng.integers(0, n)), token)
        out.append("".join(chars))
    return out


@pytest.mark.parametrize("pre", ["smollm", "gpt-2", "llama3", "qwen2"])
def test_byte_level_encodes_as_tokenizers_on_the_smollm2_vocabulary(smollm2_gguf, pre,
                                                                    hf_byte_level):
    from poot.models.gguf_meta import read_gguf_metadata

    meta = {**read_gguf_metadata(smollm2_gguf), "tokenizer.ggml.pre": pre}
    ours, hf = Tokenizer.from_gguf_metadata(meta), hf_byte_level(meta)
    for text in mixed_texts(seed=len(pre), count=60):
        assert ours.encode(text, add_special=False) == \
            hf.encode(text, add_special_tokens=False).ids, text
        hf.encode_special_tokens = True
        assert ours.encode_text(text) == hf.encode(text, add_special_tokens=False).ids, text
        hf.encode_special_tokens = False


def test_byte_level_merge_order_and_duplicates(hf_byte_level):
    """The lowest rank merges first, the leftmost on a tie; a merge listed twice keeps its
    last rank; a token spelled twice keeps its first id (as tokenizers)."""
    meta = byte_level_meta()
    meta["tokenizer.ggml.tokens"] = [*meta["tokenizer.ggml.tokens"], "aa", "aaa", "Ġt"]
    meta["tokenizer.ggml.token_type"] = [*meta["tokenizer.ggml.token_type"], NORMAL, NORMAL,
                                         NORMAL]
    meta["tokenizer.ggml.merges"] = ["a a", "aa a", "h e", "Ġ t", "Ġt he", "1 2", "h e"]
    ours, hf = Tokenizer.from_gguf_metadata(meta), hf_byte_level(meta)
    for text in ["aaaa", "aaaaa", " the", "the he", "1212 aa"]:
        assert ours.encode(text, add_special=False) == \
            hf.encode(text, add_special_tokens=False).ids, text
    assert [ours.tokens[i] for i in ours.encode("aaaaa")] == ["aa", "aaa"]


def test_byte_level_token_bytes_follow_the_spellings(smollm2, smollm2_gguf):
    """Each token's bytes, derived from its packed spelling: the byte alphabet's bytes, or
    UTF-8 for an added token and a spelling outside the alphabet."""
    from poot.models.gguf_meta import read_gguf_metadata
    from poot.models.tokenizer import ByteLevelBytes, Spellings, _byte_level_bytes

    meta = read_gguf_metadata(smollm2_gguf)
    table = gpt2_unicode_to_byte()
    want = [t.encode() if kind in (CONTROL, USER_DEFINED) else _byte_level_bytes(t, table)
            for t, kind in zip(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"],
                               strict=True)]
    assert list(smollm2.token_bytes) == want
    odd = ByteLevelBytes(Spellings(["a b", "é", "Ġx", "\x01", "日本", "<s>"]), added=[5])
    assert list(odd) == [b"a b", b"\xe9", b" x", b"\x01", "日本".encode(), b"<s>"]
