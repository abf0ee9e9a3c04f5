"""The head-scaling fit (lookahead.tools.scaling_fit): contrasts of points scored on the same windows,
resampled jointly, against closed forms."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from lookahead.tools.scaling_fit import LEG, contrast, fit, overdispersion, slope_weights


def test_the_slope_contrast_is_the_least_squares_slope():
    x = np.array([4.0, 5.0, 6.0])
    y = 0.3 - 0.05 * x + np.array([0.01, -0.02, 0.01])
    assert slope_weights(x) @ y == pytest.approx(np.polyfit(x, y, 1)[0])


def test_a_window_effect_shared_by_the_points_cancels_in_their_contrast():
    """Each point = a window's own difficulty (shared, large) + the point's level: the slope's window
    component is near 0, where each point alone has a large one — what treating the points' errors as
    independent gets wrong."""
    rng = np.random.default_rng(0)
    hard = rng.normal(0.0, 0.3, 256)  # (W,): shared by every point
    levels = [-0.26, -0.17, -0.07]
    points = [(level + hard + rng.normal(0.0, 0.01, (3, 256))) for level in levels]
    x = np.array([4.0, 5.0, 6.0])
    slope = contrast(points, slope_weights(x), resamples=500)
    alone = contrast(points[:1], np.array([1.0]), resamples=500)
    assert slope["estimate"] == pytest.approx(np.polyfit(x, [p.mean() for p in points], 1)[0])
    assert slope["window_se"] < 0.1 * alone["window_se"]
    assert slope["ci_low"] < slope["estimate"] < slope["ci_high"]


def test_the_between_base_component_enters_every_point_with_its_degrees_of_freedom():
    """No window or seed spread: the interval is the base component's alone, Student's t at B − 1."""
    points = [np.full((1, 64), v) for v in (0.1, 0.2)]
    diff = contrast(points, np.array([-1.0, 1.0]), base_sd=0.05, bases=3, resamples=200)
    se = np.sqrt(2) * 0.05
    assert diff["estimate"] == pytest.approx(0.1) and diff["base_se"] == pytest.approx(se)
    assert diff["df"] == pytest.approx(2.0)
    assert diff["ci_high"] - diff["estimate"] == pytest.approx(stats.t.ppf(0.975, 2) * se)
    plain = contrast(points, np.array([-1.0, 1.0]), resamples=200)
    assert plain["se"] == pytest.approx(0.0, abs=1e-12) and plain["df"] is None


def test_the_fit_gives_the_legs_slope_and_adjacent_differences_and_nothing_past_the_last_point():
    rng = np.random.default_rng(1)
    names = [*LEG, "8x16"]
    rows = [{"point": n, "log2_heads": x} for n, x in zip(names, (4.0, 5.0, 6.0, 7.0))]
    data = {n: -0.3 + 0.06 * r["log2_heads"] + rng.normal(0.0, 0.05, (3, 128)) for n, r in zip(names, rows)}
    out = fit(rows, lambda r: data[r["point"]], resamples=300)
    assert out["slope_per_doubling"]["estimate"] == pytest.approx(
        np.polyfit([4.0, 5.0, 6.0], [data[n].mean() for n in LEG], 1)[0])
    assert list(out["adjacent"]) == ["4x4 → 4x8", "4x8 → 4x16", "4x16 → 8x16"]
    assert out["adjacent"]["4x16 → 8x16"]["estimate"] == pytest.approx(data["8x16"].mean() - data["4x16"].mean())
    assert out["overdispersion"] is not None and "predicted" not in str(out)
    # a leg point without per-window data: no slope, the differences where both ends have them
    partial = fit(rows, lambda r: None if r["point"] == "4x8" else data[r["point"]], resamples=50)
    assert partial["slope_per_doubling"] is None and list(partial["adjacent"]) == ["4x4 → 4x16", "4x16 → 8x16"]


def test_overdispersion_is_one_for_points_scattered_as_their_errors_say():
    x = np.array([4.0, 5.0, 6.0])
    assert overdispersion(x, 1 + 2 * x, np.ones(3)) == pytest.approx(0.0, abs=1e-12)
    y = 1 + 2 * x + np.array([1.0, -2.0, 1.0])  # residuals orthogonal to the line: chi2 = 6 over 1 df
    assert overdispersion(x, y, np.ones(3)) == pytest.approx(6.0)
    assert overdispersion(x[:2], y[:2], np.ones(2)) is None
