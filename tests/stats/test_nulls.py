"""Sign-flip permutations and the simulated null of the curve-agreement statistic."""

import numpy as np
import pytest

from plelab.stats import curves_agree, sign_flip_p


def test_sign_flip_exact():
    assert sign_flip_p([1.0, 2.0, 3.0]) == pytest.approx(0.25)  # 2 of 8 flips are as extreme
    assert sign_flip_p([1.0, -1.0]) == pytest.approx(1.0)
    assert sign_flip_p([0.5] * 6) == pytest.approx(2 / 64)
    assert sign_flip_p([]) is None


def _curves(rng, shift=0.0, seeds=3, xs=(1, 2, 4, 8, 16), widths=(32, 64)):
    """Per-seed curves that share one true curve (plus `shift` for the second width) with seed noise 0.04
    and a per-seed offset shared by all points of that seed (the shared reference run)."""
    out = {}
    for k, w in enumerate(widths):
        out[w] = {}
        for s in range(seeds):
            offset = rng.normal(0, 0.03)
            out[w][s] = {x: -0.05 * np.log2(x) + k * shift + offset + rng.normal(0, 0.04) for x in xs}
    return out


def test_coinciding_curves_do_not_have_mean_z2_of_one():
    """The old reading: 'mean z^2 about 1 if one curve fits'. With 3 seeds a side it is ~2 under the null,
    so a 2.0 says nothing; the simulated null says what 2.0 means."""
    rng = np.random.default_rng(1)
    stats = [curves_agree(_curves(rng), draws=10, seed=i)["statistic"] for i in range(300)]
    assert 1.5 < float(np.mean(stats)) < 3.0          # the true null mean is far from 1
    r = curves_agree(_curves(np.random.default_rng(7)), draws=5000)
    assert r["null_median"] > 1.0 and r["null_p95"] > 2.5  # what a single curve pair can show by chance
    # Without the shared-run correlation each z^2 is ~F(1, 4): median of a mean of 5 near 1.5-2, far tail heavy.
    ind = curves_agree(_curves(np.random.default_rng(7)), draws=5000, correlated=False)
    assert ind["null"] == "independent" and 1.2 < ind["null_median"] < 2.5 and ind["null_p95"] > 3.5


def test_null_calibration_and_power():
    rng = np.random.default_rng(3)
    ps = [curves_agree(_curves(rng), draws=400, seed=i)["p"] for i in range(150)]
    assert 0.0 < np.mean(np.array(ps) < 0.05) < 0.12   # about 5 % false alarms under the null
    shifted = curves_agree(_curves(np.random.default_rng(5), shift=0.25), draws=5000)
    assert shifted["p"] < 0.01 and shifted["statistic"] > shifted["null_p95"]


def test_leave_one_out_finds_the_point_that_carries_the_statistic():
    rng = np.random.default_rng(11)
    curves = _curves(rng)
    curves[64][0][1] += 1.0   # one wild value at x = 1: its z dominates
    curves[64][1][1] += 1.0
    curves[64][2][1] += 1.0
    r = curves_agree(curves, draws=2000)
    drop = [i for i, p in enumerate(r["points"]) if p["x"] == 1][0]
    assert r["leave_one_out"][drop] < r["statistic"] / 3
    assert r["k"] == 5 and len(r["leave_one_out"]) == 5


def test_curves_without_shared_points():
    r = curves_agree({32: {0: {1: 0.1}, 1: {1: 0.2}}, 64: {0: {2: 0.1}, 1: {2: 0.3}}})
    assert r["k"] == 0 and r["p"] is None
