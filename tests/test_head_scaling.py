"""The head-scaling study's script (scripts/head_scaling.py): its family of shapes, its trend fit, and
the committed figures it collects, against the metrics they come from."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("head_scaling", ROOT / "scripts" / "head_scaling.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_family_changes_one_thing_at_a_time_from_16_to_256_heads(study):
    points = study.POINTS
    assert points[0] == study.DEFAULT and (points[0].layers, points[0].heads) == (4, 4)
    assert [p.total for p in points] == [16, 32, 64, 128, 256]
    for a, b in zip(points, points[1:]):
        assert (a.layers != b.layers) + (a.heads != b.heads) == 1, (a.name, b.name)
    args = points[2].overrides()
    assert dict(zip(args[1::2], args[::2])) and "base.arch.n_heads=16" in args and "oracle.candidates=4" in args
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


def test_the_default_point_holds_the_default_runs_committed_claims(study):
    """metrics/head_scaling/4x4.json is the default run's figures: phase 1's claims as its committed
    metrics have them, phase 2's as evaluate's (the same score files), the shape of params.yaml."""
    point = json.loads((ROOT / "metrics" / "head_scaling" / "4x4.json").read_text())
    metrics = ROOT / "metrics"
    phase1 = {**json.loads((metrics / "phase1.json").read_text()), **json.loads((metrics / "phase1_ci.json").read_text())}
    evaluate = {**json.loads((metrics / "evaluate.json").read_text()),
                **json.loads((metrics / "evaluate_ci.json").read_text())}
    for key in ("deployed_minus_static_pruning", "deployed_minus_static_at_equal_macs", "greedy_capture"):
        for suffix in ("", "_ci_low", "_ci_high"):
            assert point[key + suffix] == pytest.approx(phase1[key + suffix], abs=1e-12), key + suffix
    for key in ("phase2_minus_control", "phase2_minus_static_control"):
        for suffix in ("", "_ci_low", "_ci_high"):
            assert point[key + suffix] == pytest.approx(evaluate[key + suffix], abs=1e-12), key + suffix
    assert (point["n_layers"], point["n_heads"], point["heads"]) == (4, 4, 16)
    report = json.loads((ROOT / study.REPORT).read_text())
    assert report["points"][0]["point"] == "4x4" and report["points"][0] == point


def test_the_pages_tables_are_a_fresh_render_of_the_committed_study(study):
    """docs/research/head-scaling.md's generated block is what the script renders from
    metrics/head_scaling_report.json, that file's trend is refitted from its points, and the headline
    metrics/head_scaling.json is drawn from it: the main claims at the largest point and their trend at
    256 heads, with their intervals, in a couple of dozen keys (DESIGN §1)."""
    report = json.loads((ROOT / study.REPORT).read_text())
    page = (ROOT / study.PAGE).read_text()
    block = page.split(study.BEGIN, 1)[1].split(study.END, 1)[0]
    assert block.strip() == study.markdown(report).strip()
    for key, _ in study.CLAIMS:
        assert report["trend_at_256_heads"][key] == study.trend(report["points"], key)
    table = json.loads((ROOT / study.TABLE).read_text())
    assert table == study.headline(report)
    assert table["points"] == [r["point"] for r in report["points"]] and table["largest_point"] == "8x16"
    largest = next(r for r in report["points"] if r["point"] == table["largest_point"])
    for key in study.HEADLINE_CLAIMS:
        trend = report["trend_at_256_heads"][key]
        for suffix in ("", "_ci_low", "_ci_high"):
            assert table["at_largest_point"][key + suffix] == largest[key + suffix], key + suffix
            assert table["trend_at_256_heads"][key + suffix] == trend["predicted" + suffix], key + suffix

    def count(node) -> int:
        return sum(count(v) for v in node.values()) if isinstance(node, dict) else 1

    assert count(table) <= 24  # headline figures only
