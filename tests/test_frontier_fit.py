"""The frontier's claims (lookahead.tools.frontier_fit): interpolation between measured points and
nowhere else, the contrast against hand-computed means, Holm's adjusted p-values by hand."""

from __future__ import annotations

import numpy as np
import pytest

from lookahead.tools.frontier_fit import frontier_claim, holm, interpolation, p_value, verdict


def test_interpolation_is_piecewise_linear_between_the_points_around_x_and_refuses_outside():
    xs = [1.0, 0.5, 0.75]  # any order
    assert interpolation(xs, 0.625) == [(1, 0.5), (2, 0.5)]
    assert [(i, pytest.approx(w)) for i, w in interpolation(xs, 0.9)] == [(2, pytest.approx(0.4)), (0, pytest.approx(0.6))]
    assert interpolation(xs, 0.75) == [(2, 1.0)] and interpolation(xs, 1.0) == [(0, 1.0)]
    assert interpolation(xs, 0.49) is None and interpolation(xs, 1.01) is None and interpolation([], 0.5) is None
    assert interpolation([0.8], 0.8) == [(0, 1.0)]


def test_a_claim_against_the_frontier_is_the_routed_mean_minus_the_interpolated_frontier():
    """Routed at 0.6 of dense MACs between frontier points at 0.5 and 0.75 (weights 0.6, 0.4): the
    estimate is the routed mean minus 0.6 · the first and 0.4 · the second, by hand."""
    rng = np.random.default_rng(0)
    windows = 200
    low, high = 5.0 + rng.normal(0, 0.3, (1, windows)), 4.8 + rng.normal(0, 0.3, (1, windows))
    routed = 4.7 + rng.normal(0, 0.3, (3, windows))
    out = frontier_claim(routed, 0.6, [(0.5, low), (0.75, high), (1.0, high - 0.1)], resamples=500)
    expected = routed.mean() - (0.6 * low.mean() + 0.4 * high.mean())
    assert out["estimate"] == pytest.approx(expected)
    assert out["frontier_nll"] == pytest.approx(0.6 * low.mean() + 0.4 * high.mean())
    assert out["between"] == [[0, pytest.approx(0.6)], [1, pytest.approx(0.4)]]
    assert out["ci_low"] < expected < out["ci_high"] and out["seed_se"] > 0
    assert verdict(out) == "below" and out["p_value"] < 1e-6
    assert frontier_claim(routed, 0.45, [(0.5, low), (0.75, high)]) is None
    assert verdict(None) == "outside"


def test_p_values_come_from_the_intervals_quantile():
    """At the interval's edge the two-sided p-value is 1 − confidence: the same t (or normal) quantile."""
    from scipy import stats

    q = stats.t.ppf(0.975, 7)
    assert p_value({"estimate": q * 0.1, "se": 0.1, "df": 7}) == pytest.approx(0.05)
    assert p_value({"estimate": -1.959963985 * 0.2, "se": 0.2, "df": None}) == pytest.approx(0.05)


def test_holms_adjusted_p_values_by_hand():
    """p = (0.01, 0.04, 0.03, 0.005): sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03,
    0.06, 0.04, made non-decreasing: 0.02, 0.03, 0.06, 0.06."""
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0]) and holm([]) == []
    interval = {"estimate": -0.1, "ci_low": -0.2, "ci_high": -0.01}
    assert verdict(interval) == "below" and verdict(interval, 0.06) == "unresolved" and verdict(interval, 0.01) == "below"
