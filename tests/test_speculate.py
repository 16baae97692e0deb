"""Speculative decoding (poot.models.speculate): a verification step scores proposed tokens
and drops the rejected ones' KV rows; greedy text is the same as without speculation for
prompt lookup, a self-draft and a second draft model, dense and paged, on the reference
and cpu backends; under sampling the rejection rule keeps the target's distribution (a
chi-square test on a model of 8 tokens, which the rule "accept every draft" fails)."""
from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
import seeds  # noqa: E402

PROMPT = "the in the in the thin then the"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("spec")
    # a second checkpoint of the same weights: as a draft, each proposal is the target's
    return seeds.tiny_llama_gguf(d / "tiny.gguf"), seeds.tiny_llama_gguf(d / "twin.gguf")


@pytest.fixture(scope="module")
def models(files):
    import poot

    return {kv: poot.load(files[0], "reference", max_seq=seeds.CTX, kv=kv)
            for kv in ("dense", "paged")}


def _chi2_critical(df: int, z: float = 3.09) -> float:
    """The chi-square value a df-degree statistic exceeds with probability 0.001
    (Wilson-Hilferty)."""
    a = 2.0 / (9 * df)
    return df * (1 - a + z * math.sqrt(a)) ** 3


def _chi2(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic of `counts` against `probs`, cells of expected count under 5
    pooled into one; and its degrees of freedom."""
    n = counts.sum()
    exp = probs * n
    small = exp < 5
    c = np.append(counts[~small], counts[small].sum())
    e = np.append(exp[~small], exp[small].sum())
    keep = e > 0
    return float(((c[keep] - e[keep]) ** 2 / e[keep]).sum()), int(keep.sum()) - 1


# -- the verification step --------------------------------------------------------------
@pytest.mark.parametrize("kv", ["dense", "paged"])
def test_verify_scores_every_token_and_rollback_drops_the_rest(models, kv):
    """verify's rows are the logits one decode step per token gives; after dropping the
    last two positions the next step sees only the kept ones."""
    m = models[kv]
    s = m.session()
    ids = m.tokenize(PROMPT)
    a, b = object(), object()
    s.open(a)
    s.prefill(a, ids)
    rows = s.verify(a, [5, 9, 7, 11], 4)
    assert rows.shape == (4, m.config.vocab)
    assert s.length(a) == len(ids) + 4
    s.rollback(a, 2)
    assert s.length(a) == len(ids) + 2
    after = s.decode({a: 30})[a]
    s.close(a)
    s.open(b)
    s.prefill(b, ids)
    one = [s.decode({b: t})[b] for t in (5, 9)]
    again = s.decode({b: 30})[b]
    s.close(b)
    np.testing.assert_allclose(rows[:2], one, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(after, again, rtol=1e-4, atol=1e-4)


def test_one_step_verifies_several_paged_sequences(models):
    m = models["paged"]
    s = m.session("paged", batch=2)
    ids = m.tokenize(PROMPT)
    for seq in "ab":
        s.open(seq)
        s.prefill(seq, ids[: len(ids) - (seq == "b")])
    a, b = s.verify_rows({"a": [5, 9, 7], "b": [4]}, 4)
    assert a.shape == (3, m.config.vocab) and b.shape == (1, m.config.vocab)
    s.rollback("a", 1)
    assert (s.length("a"), s.length("b")) == (len(ids) + 2, len(ids))
    alone = s.verify("a", [11], 2)
    s.close("a")
    s.close("b")
    s.open("c")
    s.prefill("c", ids)
    np.testing.assert_allclose(s.verify("c", [5, 9, 11], 4)[[0, 1, 2]],
                               np.concatenate([a[:2], alone]), rtol=1e-4, atol=1e-4)
    s.close("c")


def _argmax_verification_matches(m, s, batch: int) -> None:
    """On open session `s` of model `m`: verify_rows (or verify, for one sequence) with
    sample="argmax" gives each row's argmax of the logits the same step gives."""
    ids = m.tokenize(PROMPT)
    rows = {"a": [5, 9, 7, 11], "b": [4, 30]}
    rows = dict(list(rows.items())[:batch])
    for seq in rows:
        s.open(seq)
        s.prefill(seq, ids)
    if batch == 1:
        logits = [s.verify("a", rows["a"], 4)]
        s.rollback("a", 4)
        got = [s.verify("a", rows["a"], 4, sample="argmax")]
    else:
        logits = s.verify_rows(rows, 4)
        for seq, toks in rows.items():
            s.rollback(seq, len(toks))
        got = s.verify_rows(rows, 4, sample="argmax")
    for seq in rows:
        s.close(seq)
    for row, want, toks in zip(got, logits, rows.values(), strict=True):
        assert row.shape == (len(toks),)
        np.testing.assert_array_equal(row, np.argmax(want, axis=-1))


@pytest.mark.parametrize("kv", ["dense", "paged"])
def test_argmax_verification_gives_the_argmax_of_the_logits(models, kv):
    m = models[kv]
    _argmax_verification_matches(m, m.session(), 1)
    if kv == "paged":
        _argmax_verification_matches(m, m.session("paged", batch=2), 2)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="the cpu backend needs gcc")
def test_argmax_verification_on_the_cpu_backend(files):
    import poot

    m = poot.load(files[0], "cpu", max_seq=seeds.CTX, kv="paged")
    _argmax_verification_matches(m, m.session(), 1)


def test_greedy_acceptance_from_ids_is_accept_on_one_hot_logits():
    """accept_ids keeps what accept keeps for a greedy sampler given the same argmaxes."""
    from poot.models.sampling import Sampler
    from poot.models.speculate import accept, accept_ids

    rng = np.random.default_rng(3)
    for _ in range(50):
        k = int(rng.integers(1, 6))
        logits = rng.normal(size=(k + 1, 8)).astype(np.float32)
        top = np.argmax(logits, axis=-1)
        drafts = [int(t) if rng.random() < 0.7 else int(rng.integers(8)) for t in top[:k]]
        assert accept_ids(top, drafts) == accept(logits, drafts, None, Sampler(), [1, 2])


def test_a_paged_rollback_frees_blocks_and_keeps_cached_ones():
    from poot.errors import CapacityError
    from poot.runtime.kv import BlockAllocator

    al = BlockAllocator(64, 4, 32, prefix_cache=True)
    al.open("s")
    al.reserve("s", 6, list(range(6)))
    al.seal("s")                                     # block 0 registered
    free = al.free
    al.reserve("s", 5, [1] * 5)                      # 11 positions: 3 blocks
    al.rollback("s", 5)
    assert al.length("s") == 6 and len(al.blocks("s")) == 2 and al.free == free
    with pytest.raises(CapacityError, match="cannot be dropped"):
        al.rollback("s", 3)                          # position 3 lies in a cached block
    al.rollback("s", 2)
    assert al.length("s") == 4 and len(al.blocks("s")) == 1


# -- proposers and K --------------------------------------------------------------------
def test_prompt_lookup_proposes_what_followed_the_latest_match():
    from poot.models.speculate import PromptLookup

    look = PromptLookup(ngram=3)
    hist = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3]
    assert look.propose(hist, 3, None) == ([4, 5, 9], None)     # the longest n-gram first
    hist = [5, 2, 3, 7, 2, 3, 8, 2, 3]
    assert look.propose(hist, 2, None) == ([8, 2], None)        # "2 3": the latest match
    assert look.propose([4, 5, 6], 2, None) == ([], None)
    assert look.propose([4, 5, 4], 5, None) == ([5, 4], None)   # runs to the end
    assert look.propose([4], 2, None) == ([], None)
    rng = np.random.default_rng(5)          # against the rule itself, n-gram by n-gram
    for _ in range(200):
        h = [int(t) for t in rng.integers(0, 4, int(rng.integers(1, 30)))]
        want: list[int] = []
        for n in range(min(3, len(h) - 1), 0, -1):
            starts = [s for s in range(len(h) - n) if h[s: s + n] == h[len(h) - n:]]
            if starts:
                want = h[starts[-1] + n: starts[-1] + n + 4]
                break
        assert look.propose(h, 4, None) == (want, None), h


def test_adaptive_k_follows_the_acceptance_rate_and_turns_off():
    from poot.models.speculate import AdaptiveK

    k = AdaptiveK(7)
    assert [k.k() for _ in range(AdaptiveK.TRIALS)] == [3, 3]      # trials: the prior's k
    for _ in range(10):
        k.update(7, 7)
    assert k.k() == 7
    for _ in range(20):
        k.update(3, 0)
    picks = [k.k() for _ in range(12)]
    assert picks[:1] == [0] and 1 in picks and picks.count(0) >= 9   # off, probing rarely
    costly = AdaptiveK(7, cost=0.8)             # a draft reading 80% of the target's weights
    assert [costly.k() for _ in range(AdaptiveK.TRIALS)] == [2, 2]
    costly.update(2, 0)
    costly.update(2, 0)
    assert not any(costly.k() for _ in range(300))                   # off for good


def test_adaptive_k_costs_verification_against_the_fastest_plain_step():
    from poot.models.speculate import AdaptiveK

    k = AdaptiveK(7)
    for _ in range(AdaptiveK.TRIALS):
        k.k()
    for _ in range(10):
        k.update(7, 5)                  # ~70% accepted: worth speculating at cost ~1.5
    k.timed("plain", 0.6e-3)            # a long run of queued-ahead plain steps
    for _ in range(5):
        k.timed("plain", 2.5e-3)        # one-step runs right after a verification
        k.timed(8, 4.7e-3)              # a verification step of width 8
    assert k.step_cost(7) > 7           # against the 0.6 ms step, not the 2.5 ms ones
    assert k.k() == 0


def test_adaptive_k_stops_trials_and_probes_rarely_where_verification_is_dear():
    """The H100's SmolLM2 times (2026-12-07): a plain step 0.5 ms, verifications of width 2
    and 4 1.66 and 1.98 ms. Once one trial has timed its width and found little accepted,
    no second trial runs, and probes come after runs as long as their cost in plain steps."""
    from poot.models.speculate import AdaptiveK

    k = AdaptiveK(7)
    k.timed("plain", 0.5e-3)
    assert k.k() >= 2                   # the first trial: nothing verified yet
    k.timed(2, 1.66e-3)
    k.timed(4, 1.98e-3)
    k.update(2, 0)
    assert k.k() == 0 and k.trials == 0
    run = k.plain_run(1000)
    assert run >= 2 * 1.66 / 0.5 - 1    # the first run of k = 0 before the probe
    assert k.k() == 1                   # the probe


@pytest.mark.parametrize("text,ok", [("lookup", True), ("self:3", True), ("draft:x.gguf", True),
                                     ("self:0", False), ("draft:", False), ("nope", False)])
def test_the_speculate_spec_is_parsed(text, ok):
    from poot.errors import RequestError
    from poot.models.speculate import parse

    if ok:
        assert str(parse(text)) == text
    else:
        with pytest.raises(RequestError, match="lookup, draft:MODEL or self:N"):
            parse(text)


# -- exactness under greedy -------------------------------------------------------------
@pytest.mark.parametrize("kv", ["dense", "paged"])
def test_greedy_text_is_the_same_with_every_proposer(models, files, kv):
    m = models[kv]
    plain = m.generate(PROMPT, max_tokens=40)
    from poot.models.speculate import widths

    for spec in ("lookup", "self:1", f"draft:{files[1]}"):
        m.proposer(spec).cost = 0.0         # costless drafts: every step proposes
        # and every step as dear as a plain one (AdaptiveK keeps the fastest time
        # measured): each proposes the most, whatever this machine's timings
        m.proposer(spec).step_seconds.update({"plain": 1e-9, "propose": 0.0,
                                              **dict.fromkeys(widths(5), 1e-9)})
        assert m.generate(PROMPT, max_tokens=40, speculate=spec, draft_tokens=5) == plain, spec
        assert m.stats.verified > 0 and m.stats.generated_tokens == 40
        assert "speculation:" in str(m.stats)
        if spec == "lookup":
            assert 0 < m.stats.acceptance < 1
        if spec.startswith("draft"):        # the twin proposes the target's own tokens
            # (how many per step follows the measured step times: AdaptiveK's own tests)
            assert m.stats.acceptance == 1


def test_later_greedy_sequences_start_from_the_step_times_measured(models):
    """A proposer keeps AdaptiveK's measured times: the second sequence weighs the first's
    (its plain step is timed already, so it needs no calibration run of its own); a
    sampled sequence weighs none."""
    m = models["dense"]
    clock = m.proposer("lookup").step_seconds
    m.generate(PROMPT, max_tokens=12, speculate="lookup")
    assert m.stats.step_seconds is clock and "plain" in clock
    m.generate(PROMPT, max_tokens=12, speculate="lookup", temperature=0.8, seed=1)
    assert m.stats.step_seconds is not clock


def test_a_plans_first_run_is_not_timed(files, monkeypatch):
    """A backend may record a plan on its first run (a CUDA graph), so AdaptiveK is given
    the time of each verification width's later runs only (Session.ran)."""
    import poot
    from poot.models import speculate as spec
    from poot.runtime.session import SCORE

    m = poot.load(files[0], "reference", max_seq=seeds.CTX, kv="dense")
    timed, keep = [], spec.AdaptiveK.timed
    monkeypatch.setattr(spec.AdaptiveK, "timed",
                        lambda self, what, s: (timed.append(what), keep(self, what, s)))
    m.generate(PROMPT, max_tokens=40, speculate="lookup")
    runs = {key[0]: ex.steps for key, ex in m.session().executors.items()
            if key[0] > 1 and key[2:] and key[2] in ("argmax", SCORE)}
    assert runs and max(runs.values()) > 1, runs      # some width ran more than once
    for width, n in runs.items():
        assert timed.count(width) == max(n - 1, 0), (width, n, timed)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="the cpu backend needs gcc")
def test_greedy_text_is_the_same_on_the_cpu_backend(files):
    import poot

    m = poot.load(files[0], "cpu", max_seq=seeds.CTX)
    plain = m.generate(PROMPT, max_tokens=30)
    assert m.generate(PROMPT, max_tokens=30, speculate="lookup", draft_tokens=3) == plain
    assert m.stats.accepted > 0


def test_a_draft_model_with_another_tokenizer_is_refused(models, tmp_path):
    from poot.errors import RequestError

    kvs = seeds.set_kv(seeds.llama_kvs(), "tokenizer.ggml.merges", seeds.ARRAY,
                       (seeds.STRING, ["Ġ t"]))
    other = seeds.tiny_llama_gguf(tmp_path / "merges.gguf", kvs=kvs)
    with pytest.raises(RequestError, match="does not share the target.s tokenizer"):
        models["dense"].generate(PROMPT, max_tokens=3, speculate=f"draft:{other}")


# -- exactness under sampling -------------------------------------------------------------
def _small_vocab_model(vocab: int = 8, kv: str = "dense", **config):
    """A random-weight model of `vocab` tokens, reference backend (no tokenizer)."""
    from poot.models.llama import random_weights, tiny_config
    from poot.models.runner import Model
    from poot.plugin import select_backend

    config = tiny_config(vocab=vocab, max_seq=32, **config)
    b, dev = select_backend("reference")
    return Model(None, config, None, b, dev, kv=kv, weights=random_weights(config, seed=3))


def test_sliding_window_layers_speculate_on_paged_kv_and_are_refused_on_dense():
    """A sliding layer's paged rows are dropped like any other; its dense ring is not."""
    from poot.errors import BindError
    from poot.models import speculate as spec
    from poot.models.runner import Stats
    from poot.models.sampling import Sampler

    window = dict(sliding=(True, False), window=4)
    with pytest.raises(BindError, match="kv='paged'"):
        _small_vocab_model(16, **window).proposer("lookup")
    m = _small_vocab_model(16, "paged", **window)
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    texts, stats = [], Stats()
    for propose in (None, spec.PromptLookup()):
        s = m.session()
        s.open("a")
        s.prefill("a", prompt[:-1])
        history = list(prompt)
        gen = m._following(s, "a", prompt[-1], Sampler(), history, None, 20) if propose is \
            None else spec.tokens(m, s, "a", prompt[-1], Sampler(), history, None, 20,
                                  propose, 4, stats)
        for t in gen:
            history.append(t)
        s.close("a")
        texts.append(history)
    assert texts[0] == texts[1] and stats.verified > 0 and stats.accepted > 0


def _target_joint(m, prefix: list[int], sampler_args: dict) -> np.ndarray:
    """P(t1, t2 | prefix) under the target's sampler, from its own logits."""
    from poot.models.sampling import Sampler

    s = Sampler(**sampler_args, seed=0)
    first = s.distribution(m.prefill_logits(prefix)[-1], prefix)
    joint = np.zeros((first.size, first.size))
    for t in range(first.size):
        joint[t] = first[t] * s.distribution(m.prefill_logits(prefix + [t])[-1], prefix + [t])
    return joint


def _speculative_pairs(m, prefix: list[int], sampler_args: dict, propose, runs: int):
    """Counts of (t1, t2), the two tokens after `prefix`, each from one seeded speculative
    run whose verification step judges proposals of 2 tokens."""
    from poot.models import speculate as spec
    from poot.models.runner import Stats
    from poot.models.sampling import Sampler

    session = m.session()
    counts = np.zeros((m.config.vocab, m.config.vocab), np.int64)
    stats = Stats()
    for seed in range(runs):
        sampler = Sampler(**sampler_args, seed=seed)
        seq = object()
        session.open(seq)
        session.prefill(seq, prefix[:-1])
        propose.start(prefix[:-1])
        history = list(prefix)
        gen = spec.tokens(m, session, seq, prefix[-1], sampler, history, None, 2, propose,
                          2, stats)
        t1 = next(gen)
        history.append(t1)
        t2 = next(gen)
        gen.close()
        propose.close()
        session.close(seq)
        counts[t1, t2] += 1
    return counts, stats


@pytest.mark.parametrize("proposer", ["lookup", "draft"])
def test_sampled_tokens_follow_the_target_distribution(proposer):
    from poot.models import speculate as spec

    from poot.models.sampling import Sampler

    m = _small_vocab_model()
    args = dict(temperature=12.0, top_k=0, top_p=0.97, repetition_penalty=1.2)

    def p_of(c):        # the target's probability of c, which lookup proposes after 5 6
        ids = [5, 6, c, 5, 6]
        return Sampler(**args).distribution(m.prefill_logits(ids)[-1], ids)[c]

    c = min(range(m.config.vocab), key=lambda c: abs(p_of(c) - 0.5))
    assert 0.1 < p_of(c) < 0.9                      # both of the rule's branches run
    prefix = [5, 6, c, 5, 6]
    propose = spec.PromptLookup() if proposer == "lookup" else \
        spec.DraftModel(m.self_draft(1))            # costless: every step proposes
    counts, stats = _speculative_pairs(m, prefix, args, propose, 700)
    want = _target_joint(m, prefix, args).reshape(-1)
    chi2, df = _chi2(counts.reshape(-1), want)
    assert chi2 < _chi2_critical(df), (chi2, df)
    assert stats.verified > 600 and 0 < stats.accepted < stats.proposed


def test_the_rejection_rule_keeps_p_and_the_chi_square_test_can_fail():
    """accept() on fixed rows: its first token follows p for a draft q far from p; the
    same test refuses q itself (what accepting every draft would give)."""
    from poot.models.sampling import Sampler
    from poot.models.speculate import accept

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 6)).astype(np.float32) * 2
    q = np.array([0.02, 0.5, 0.03, 0.05, 0.3, 0.1])
    p = Sampler(1.0).distribution(logits[0])
    firsts, as_q = np.zeros(6, np.int64), np.zeros(6, np.int64)
    draws = np.random.default_rng(1)
    for seed in range(4000):
        d = int(draws.choice(6, p=q))
        firsts[accept(logits, [d], [q], Sampler(1.0, seed=seed), [])[0]] += 1
        as_q[d] += 1
    chi2, df = _chi2(firsts, p)
    assert chi2 < _chi2_critical(df), (chi2, df)
    bad, df = _chi2(as_q, p)
    assert bad > _chi2_critical(df), (bad, df)


# -- the command ----------------------------------------------------------------------------
def test_poot_run_checks_the_flags_first_and_reports_acceptance(files, capsys):
    from poot.cli import main

    for flags, why in ((["--speculate", "self:0"], "lookup, draft:MODEL or self:N"),
                       (["--draft-tokens", "3"], "give --speculate too"),
                       (["--speculate", "lookup", "--draft-tokens", "99"], "1..32"),
                       (["--speculate", "draft:/no/such.gguf"], "no such model file")):
        assert main(["run", "/no/model.gguf", "--prompt", "x", *flags]) == 2
        assert why in capsys.readouterr().err
    rc = main(["run", str(files[0]), "--backend", "reference", "--prompt", PROMPT,
               "--max-seq", "64", "--max-tokens", "20", "--speculate", "lookup",
               "--draft-tokens", "4", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 0 and "decode: 20 tokens" in err and "proposed tokens accepted" in err, err
