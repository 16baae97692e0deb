"""The accuracy tool's arithmetic (poot.models.divergence) and windows
(poot.models.perplexity), against sums written out by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest

from poot.errors import RequestError, SamplingError
from poot.models.divergence import BLOCK_ROWS, Tally, log_softmax, mean_estimate
from poot.models.perplexity import scored, windows


def test_log_softmax_is_float64_and_stable_for_large_logits():
    x = np.array([[1000.0, 1001.0, 999.0], [0.0, 0.0, 0.0]], np.float32)
    got = log_softmax(x)
    assert got.dtype == np.float64
    want0 = np.array([-1.0, 0.0, -2.0]) - math.log(math.exp(-1) + 1 + math.exp(-2))
    np.testing.assert_allclose(got[0], want0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got[1], [-math.log(3)] * 3, rtol=0, atol=1e-12)


def test_uniform_logits_have_the_vocabulary_as_perplexity():
    t = Tally(base=False)
    t.add(np.zeros((5, 7), np.float32), [0, 1, 2, 3, 4])
    s = t.summary()
    assert s.count == 5 and s.ppl.value == pytest.approx(7, rel=1e-12) and s.ppl.err < 1e-12
    assert s.kl is None and s.lines()[-1].startswith("PPL = 7")


def test_kl_nll_and_top1_match_sums_written_out():
    q = np.log(np.array([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6]]))
    b = np.log(np.array([[0.4, 0.4, 0.2], [0.1, 0.7, 0.2], [0.5, 0.25, 0.25]]))
    targets = [1, 1, 0]
    t = Tally(base=True)
    t.add(q + 3.0, targets, b - 1.0)     # a shift of the logits changes nothing
    s = t.summary()
    pq, pb = np.exp(q), np.exp(b)
    kl = [sum(pb[i, j] * math.log(pb[i, j] / pq[i, j]) for j in range(3)) for i in range(3)]
    nll_q = [-math.log(pq[i, targets[i]]) for i in range(3)]
    nll_b = [-math.log(pb[i, targets[i]]) for i in range(3)]
    np.testing.assert_allclose(np.concatenate(t.kl), kl, rtol=1e-12)
    assert s.kl.value == pytest.approx(sum(kl) / 3, rel=1e-12)
    assert s.ppl.value == pytest.approx(math.exp(sum(nll_q) / 3), rel=1e-12)
    assert s.ppl_base.value == pytest.approx(math.exp(sum(nll_b) / 3), rel=1e-12)
    diff = [a - c for a, c in zip(nll_q, nll_b)]
    assert s.ratio.value == pytest.approx(math.exp(sum(diff) / 3), rel=1e-12)
    # row 0: top-1 q is token 0, base's tokens 0 and 1 tie (argmax: the first); row 2 differs
    assert list(np.concatenate(t.same_top)) == [True, True, False]
    p = 2 / 3
    assert s.same_top.value == pytest.approx(p)
    assert s.same_top.err == pytest.approx(math.sqrt(p * (1 - p) / 2))


def test_identical_configurations_are_zero_apart():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 4, (40, 50)).astype(np.float32)
    t = Tally(base=True)
    t.add(logits, rng.integers(0, 50, 40), logits.copy())
    s = t.summary()
    assert s.kl.value == 0 and s.kl_max == 0 and s.same_top.value == 1
    assert s.ratio.value == 1 and s.ln_ratio.err == 0 and s.ppl.value == s.ppl_base.value


def test_standard_errors_and_percentiles_are_llama_cpps():
    e = mean_estimate(np.array([1.0, 2.0, 3.0]))
    # sqrt((mean of squares - square of mean) / (N - 1))
    assert e.value == 2 and e.err == pytest.approx(math.sqrt((14 / 3 - 4) / 2))
    # a KL percentile interpolates linearly between sorted values: 99% of 0..100 is 99
    rng = np.random.default_rng(1)
    b = rng.normal(0, 1, (101, 8))
    t = Tally(base=True)
    t.add(b, np.zeros(101, np.int64), b)
    kl = np.sort(np.concatenate(t.kl))
    s = t.summary()
    assert s.kl_percentiles[99.0] == kl[99] and s.kl_percentiles[50.0] == kl[50]


def test_rows_scored_in_blocks_equal_rows_scored_one_by_one():
    rng = np.random.default_rng(2)
    n = 3 * BLOCK_ROWS + 5
    q, b = rng.normal(0, 3, (2, n, 30))
    targets = rng.integers(0, 30, n)
    whole, single = Tally(base=True), Tally(base=True)
    whole.add(q, targets, b)
    for i in range(n):
        single.add(q[i: i + 1], targets[i: i + 1], b[i: i + 1])
    for field in ("nll", "nll_base", "kl", "same_top"):
        np.testing.assert_array_equal(np.concatenate(getattr(whole, field)),
                                      np.concatenate(getattr(single, field)))


def test_non_finite_logits_and_mismatched_rows_are_refused():
    t = Tally(base=True)
    bad = np.zeros((2, 4))
    bad[1, 2] = np.nan
    with pytest.raises(SamplingError, match="tested configuration's logits hold NaN"):
        t.add(bad, [0, 0], np.zeros((2, 4)))
    with pytest.raises(SamplingError, match="base configuration"):
        t.add(np.zeros((2, 4)), [0, 0], np.full((2, 4), np.inf))
    with pytest.raises(ValueError, match="disagree"):
        t.add(np.zeros((2, 4)), [0, 0, 0], np.zeros((2, 4)))
    with pytest.raises(ValueError, match="base logits"):
        t.add(np.zeros((2, 4)), [0, 0])
    with pytest.raises(ValueError, match="no position"):
        Tally(base=False).summary()


def test_windows_cut_whole_windows_and_open_each_with_bos():
    ids = list(range(100, 125))
    got = windows(ids, 8, bos=1)
    assert len(got) == 3                      # the tail of one token is dropped
    assert [list(w) for w in got] == [[1, *range(101 + 8 * k, 108 + 8 * k)] for k in range(3)]
    assert [list(w) for w in windows(ids, 8)][1] == list(range(108, 116))
    assert scored(8) == slice(4, 7)           # positions 4..6, each against the next token
    with pytest.raises(RequestError, match="less than one window"):
        windows(ids, 26)
    with pytest.raises(RequestError, match="at least 4"):
        windows(ids, 3)
