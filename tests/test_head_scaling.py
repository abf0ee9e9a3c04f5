"""The head-scaling study's script (scripts/head_scaling.py): its family of shapes, its trend fit, and
the committed figures it collects, against the metrics they come from."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests import consistency


@pytest.fixture(scope="module")
def study():
    return consistency.head_scaling_script()


def test_the_family_changes_one_thing_at_a_time_from_16_to_256_heads(study):
    points = study.POINTS
    assert points[0] == study.DEFAULT and (points[0].layers, points[0].heads) == (4, 4)
    assert [p.total for p in points] == [16, 32, 64, 128, 256]
    for a, b in zip(points, points[1:]):
        assert (a.layers != b.layers) + (a.heads != b.heads) == 1, (a.name, b.name)
    assert points[2].overrides() == {"base.arch.n_layers": 4, "base.arch.n_heads": 16, "oracle.per_round": 1,
                                     "oracle.candidates": 4}
    assert points[0].oracle == "exact greedy" and all(p.oracle.startswith("lazy greedy") for p in points[1:])


def test_the_trend_is_weighted_least_squares_with_its_standard_error(study):
    """Exact points on a line: the fit is the line, its prediction at 8 the line's; scattered points:
    numpy's weighted polyfit, and an interval widened by the scatter beyond their standard errors."""
    line = [{"log2_heads": x, "c": 0.1 - 0.02 * x, "c_ci_low": 0.1 - 0.02 * x - 0.0196,
             "c_ci_high": 0.1 - 0.02 * x + 0.0196} for x in (4.0, 5.0, 6.0, 7.0)]
    fit = study.trend(line, "c")
    assert fit["slope_per_doubling"] == pytest.approx(-0.02) and fit["predicted"] == pytest.approx(0.1 - 0.16)
    assert fit["overdispersion"] == 1.0
    se = 0.01 * math.sqrt(1 / 4 + (8 - 5.5) ** 2 / 5)  # a line's prediction error at x = 8 (se 0.01 each)
    assert fit["predicted_ci_high"] - fit["predicted"] == pytest.approx(1.96 * se, rel=1e-6)
    y = [0.0, 0.05, -0.03, 0.08]
    scattered = [dict(row, c=v, c_ci_low=v - 0.0196, c_ci_high=v + 0.0196) for row, v in zip(line, y)]
    fit = study.trend(scattered, "c")
    slope, intercept = np.polyfit([4.0, 5.0, 6.0, 7.0], y, 1)
    assert fit["slope_per_doubling"] == pytest.approx(slope) and fit["predicted"] == pytest.approx(intercept + 8 * slope)
    assert fit["overdispersion"] > 1
    assert study.trend(line[:2], "c") is None  # two points: no trend


def test_the_default_point_holds_the_default_runs_committed_claims():
    with consistency.committed() as root:  # as committed: a rerun rewrites the working tree's metrics
        consistency.head_scaling_default_point_is_the_default_run(root)


def test_the_pages_tables_are_a_fresh_render_of_the_committed_study():
    with consistency.committed() as root:
        consistency.head_scaling_page_is_a_fresh_render(root)
