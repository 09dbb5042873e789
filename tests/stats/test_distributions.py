"""Student's t, the normal and the binomial against scipy (where installed) and against known values."""

import math

import pytest

from plelab.stats import sign_test_p, t_cdf, t_critical, t_quantile, t_two_sided_p
from plelab.stats.distributions import binomial_tail, regularized_beta


def test_t_critical_known_values():
    # Tables: t_{0.975, 2} = 4.303, t_{0.975, 4} = 2.776, t_{0.975, 1} = 12.706.
    assert t_critical(3) == pytest.approx(4.302653, abs=1e-6)
    assert t_critical(5) == pytest.approx(2.776445, abs=1e-6)
    assert t_critical(2) == pytest.approx(12.706205, abs=1e-6)
    assert math.isnan(t_critical(1))


def test_t_with_one_df_is_cauchy():
    for t in (0.5, 1.0, 3.0, 30.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)


def test_t_against_scipy():
    ss = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 4.5, 10, 100):
        for t in (0.01, 0.3, 1.5, 4.303, 12.7, 60.0):
            assert t_two_sided_p(t, df) == pytest.approx(2 * ss.t.sf(t, df), rel=1e-9, abs=1e-15)
        for p in (0.001, 0.2, 0.6, 0.95, 0.975, 0.9999):
            assert t_quantile(p, df) == pytest.approx(ss.t.ppf(p, df), rel=1e-9, abs=1e-12)
    for x, a, b in ((0.3, 2.0, 3.0), (0.9, 0.5, 7.0), (0.01, 10.0, 0.5)):
        assert regularized_beta(x, a, b) == pytest.approx(ss.beta.cdf(x, a, b), rel=1e-10)


def test_sign_test_and_binomial_tail():
    assert sign_test_p(14, 2) == pytest.approx(2 * (1 + 16 + 120) / 2**16)
    assert sign_test_p(14, 2) < 0.01 < sign_test_p(13, 3)
    assert sign_test_p(16, 0) == sign_test_p(0, 16) and sign_test_p(0, 0) == 1.0
    assert sign_test_p(3, 0) == pytest.approx(0.25)  # three seeds all one way: p = 0.25, never significant
    assert binomial_tail(0, 5) == 1.0 and binomial_tail(6, 5) == 0.0
    assert binomial_tail(2, 3, 0.5) == pytest.approx(0.5)
