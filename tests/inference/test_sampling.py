"""The one sampler: greedy at temperature 0, seeded, top-k / top-p keep exactly the tokens they should."""

from __future__ import annotations

import numpy as np
import pytest

from plelab.inference.sampling import Sampling, SamplingError, sample


def draws(logits, n: int = 2000, **settings) -> np.ndarray:
    s = Sampling(**settings)
    rng = s.rng()
    return np.array([sample(np.asarray(logits, np.float32), s, rng) for _ in range(n)])


def test_temperature_zero_is_argmax():
    logits = np.array([0.1, 3.0, -2.0, 2.9], np.float32)
    assert set(draws(logits, 20, temperature=0)) == {1}


def test_same_seed_same_tokens_other_seed_other_tokens():
    logits = np.zeros(50, np.float32)
    assert np.array_equal(draws(logits, 50, seed=3), draws(logits, 50, seed=3))
    assert not np.array_equal(draws(logits, 50, seed=3), draws(logits, 50, seed=4))


def test_frequencies_follow_the_softmax_at_the_temperature():
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    got = np.bincount(draws(logits, 20000, temperature=1.0), minlength=3) / 20000
    assert np.allclose(got, [0.5, 0.3, 0.2], atol=0.02)
    hot = np.bincount(draws(logits, 20000, temperature=2.0), minlength=3) / 20000
    want = np.sqrt([0.5, 0.3, 0.2]) / np.sqrt([0.5, 0.3, 0.2]).sum()
    assert np.allclose(hot, want, atol=0.02)


def test_top_k_keeps_the_k_most_likely():
    logits = np.array([1.0, 5.0, 4.0, 3.0, 0.0])
    assert set(draws(logits, 2000, temperature=5.0, top_k=2)) == {1, 2}
    assert set(draws(logits, 20, temperature=1.0, top_k=1)) == {1}  # top-k 1 is greedy


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    logits = np.log(np.array([0.1, 0.5, 0.25, 0.15]))
    assert set(draws(logits, 3000, temperature=1.0, top_p=0.7)) == {1, 2}  # 0.5 < 0.7 <= 0.75
    assert set(draws(logits, 3000, temperature=1.0, top_p=0.75)) == {1, 2}
    assert set(draws(logits, 3000, temperature=1.0, top_p=0.76)) == {1, 2, 3}
    assert set(draws(logits, 100, temperature=1.0, top_p=0.01)) == {1}


def test_masked_logits_are_never_drawn():
    logits = np.array([-np.inf, 0.0, -np.inf, 0.0])
    assert set(draws(logits, 2000)) == {1, 3}


def test_nan_logits_are_an_error():
    with pytest.raises(SamplingError, match="NaN"):
        sample(np.array([0.0, np.nan]), Sampling(), np.random.default_rng(0))


@pytest.mark.parametrize("bad", [{"temperature": -0.1}, {"temperature": float("nan")}, {"top_k": -1},
                                 {"top_p": 0.0}, {"top_p": 1.5}, {"seed": -1}])
def test_out_of_range_settings_are_refused(bad):
    with pytest.raises(SamplingError):
        Sampling(**bad)
