"""The sampler: greedy, temperature, top-k, top-p, repetition penalty, seeds."""
from __future__ import annotations

import numpy as np
import pytest
from poot.models.sampling import Sampler, SamplingError


@pytest.fixture
def logits():
    return np.random.default_rng(0).standard_normal(50).astype(np.float32) * 3


def test_greedy_is_argmax(logits):
    assert Sampler().sample(logits) == int(np.argmax(logits))


def test_seeded_draws_repeat_and_differ_between_seeds(logits):
    def draws(seed):
        sampler = Sampler(temperature=1.5, seed=seed)
        return [sampler.sample(logits) for _ in range(30)]

    assert draws(1) == draws(1)
    assert draws(1) != draws(2)


def test_temperature_one_draws_from_softmax():
    rng = np.random.default_rng(5)
    logits = rng.standard_normal(6)
    sampler = Sampler(temperature=1.0, seed=11)
    counts = np.bincount([sampler.sample(logits) for _ in range(20000)], minlength=6)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    assert np.abs(counts / 20000 - probs).max() < 0.015


def test_top_k_keeps_only_the_best(logits):
    best3 = set(np.argsort(-logits)[:3].tolist())
    sampler = Sampler(temperature=5.0, top_k=3, seed=3)
    assert {sampler.sample(logits) for _ in range(300)} == best3
    assert all(Sampler(temperature=9.0, top_k=1, seed=s).sample(logits) == np.argmax(logits)
               for s in range(10))


def test_top_p_keeps_the_smallest_sufficient_set():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    sampler = Sampler(temperature=1.0, top_p=0.75, seed=4)
    assert {sampler.sample(logits) for _ in range(500)} == {0, 1}
    assert {Sampler(temperature=1.0, top_p=0.01, seed=s).sample(logits) for s in range(20)} == {0}


def test_repetition_penalty_moves_greedy_choice():
    logits = np.array([2.0, 1.5, -1.0, -0.5])
    assert Sampler(repetition_penalty=1.5).sample(logits, history=[0, 0]) == 1  # 2/1.5 < 1.5
    penalized = Sampler(repetition_penalty=2.0).sample(np.array([-0.3, -0.4]), history=[0])
    assert penalized == 1  # a negative logit grows more negative: -0.6 < -0.4
    assert Sampler(repetition_penalty=1.5).sample(logits, history=[3]) == 0


def test_masked_logits_are_never_drawn(logits):
    masked = logits.copy()
    masked[np.argsort(-logits)[:5]] = -np.inf
    sampler = Sampler(temperature=2.0, seed=9)
    assert not {sampler.sample(masked) for _ in range(200)} & set(np.argsort(-logits)[:5].tolist())


def test_sample_batch_matches_row_by_row(logits):
    batch = np.random.default_rng(8).standard_normal((4, 50))
    histories = [[1, 2], [], [3], [4, 4]]
    together = Sampler(temperature=0.8, top_k=10, repetition_penalty=1.2, seed=6)
    apart = Sampler(temperature=0.8, top_k=10, repetition_penalty=1.2, seed=6)
    expected = [apart.sample(row, h) for row, h in zip(batch, histories, strict=True)]
    got = together.sample_batch(batch, histories)
    assert got.shape == (4,) and got.tolist() == expected
    assert Sampler().sample_batch(batch).tolist() == np.argmax(batch, axis=1).tolist()


@pytest.mark.parametrize("options", [{"temperature": -1}, {"temperature": float("nan")},
                                     {"top_k": -2}, {"top_k": 2.5}, {"top_p": 0},
                                     {"top_p": 1.1}, {"repetition_penalty": 0}])
def test_bad_settings_are_refused(options):
    with pytest.raises(SamplingError):
        Sampler(**options)


def test_broken_logits_are_refused(logits):
    with_nan = logits.copy()
    with_nan[4] = np.nan
    for bad in (with_nan, np.full(5, -np.inf), np.zeros((2, 3)), np.array([1.0, np.inf])):
        with pytest.raises(SamplingError):
            Sampler(temperature=1.0, seed=0).sample(bad)
    with pytest.raises(SamplingError, match="outside the vocabulary"):
        Sampler(repetition_penalty=1.3).sample(logits, history=[50])
    with pytest.raises(SamplingError):
        Sampler().sample_batch(logits)


def test_candidates_are_argtopk_without_a_full_sort():
    from poot.models.sampling import _top

    rng = np.random.default_rng(12)
    y = rng.integers(-3, 4, 5000).astype(np.float32)        # many ties at the k-th value
    for k in (1, 7, 64):
        want = np.argsort(-y.astype(np.float64), kind="stable")[:k]
        assert _top(y, k).tolist() == want.tolist()


def test_top_k_above_the_candidates_is_refused():
    with pytest.raises(SamplingError, match="0..64"):
        Sampler(temperature=1.0, top_k=65)
