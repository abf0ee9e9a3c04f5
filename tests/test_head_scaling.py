"""The head-scaling study's script (scripts/head_scaling.py): its family of shapes and
the committed figures it collects, against the metrics they come from."""

from __future__ import annotations


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
                                     "oracle.candidates": 4, "static_baselines.candidates": 4}
    assert points[0].oracle == "exact greedy" and all(p.oracle.startswith("lazy greedy") for p in points[1:])
    # the greedy static mask: exact up to 32 heads, the lazy search from 64 (the "64+ heads")
    assert [p.static_mask.split(" (")[0] for p in points] == ["exact greedy"] * 2 + ["lazy greedy"] * 3


def test_the_default_point_holds_the_default_runs_committed_claims():
    with consistency.committed() as root:  # as committed: a rerun rewrites the working tree's metrics
        consistency.head_scaling_default_point_is_the_default_run(root)


def test_the_pages_tables_are_a_fresh_render_of_the_committed_study():
    with consistency.committed() as root:
        consistency.head_scaling_page_is_a_fresh_render(root)


@pytest.mark.parametrize("moved, caught", [(1e-6, True), (1e-12, False)])
def test_a_refitted_value_moved_by_one_part_in_a_million_fails_the_check_naming_its_key(study, monkeypatch, moved,
                                                                                        caught):
    """The refit is compared within relative 1e-9 (lookahead.core.floats): a CPU's last bits (1e-15 .. 1e-12)
    pass, a value moved by 1e-6 fails, and the error names the key."""
    fits = study.fits

    def moved_fits(rows, scoring, *args):
        out = fits(rows, scoring, *args)
        if not args:  # the half-off fits; the 75 % rows' stay as refitted
            out["phase2_minus_control"]["overdispersion"] *= 1 + moved
        return out

    monkeypatch.setattr(study, "fits", moved_fits)
    with consistency.committed() as root:
        if not caught:
            consistency.head_scaling_page_is_a_fresh_render(root)
            return
        with pytest.raises(AssertionError, match=r"fits\.phase2_minus_control\.overdispersion: recomputed .*"
                                                 r"relative difference 1\.0e-06"):
            consistency.head_scaling_page_is_a_fresh_render(root)


def test_the_75_percent_rows_are_fitted_as_points_of_their_own_and_leave_the_report_without_windows(study):
    """A point's 75 % row with per-window NLLs enters the 75 % fits (its adjacent difference is the difference
    of the rows' mean claims, a closed form); a row without them stays out, and the report keeps neither's
    windows, saying which had them."""
    import numpy as np

    from lookahead.artifacts.val_scores import ScoringConfig

    rng = np.random.default_rng(0)

    def row(name: str, heads: int, effect: float | None) -> dict:
        out = {"point": name, "log2_heads": float(np.log2(heads)), "off_75": {"keep": 0.25}}
        if effect is not None:
            static = 4.0 + rng.normal(0.0, 0.2, (1, 32))
            deployed = static + effect + rng.normal(0.0, 0.05, (3, 32))
            out["off_75"]["windows"] = {"phase1": {"static": static.tolist(), "deployed": deployed.tolist()}}
        return out

    rows = [row("4x4", 16, -0.2), row("4x8", 32, -0.5), row("4x16", 64, None)]
    quarter = study.quarter_rows(rows)
    assert [q["point"] for q in quarter] == ["4x4", "4x8"] and all(q["keep"] == 0.25 for q in quarter)
    fitted = study.fits(quarter, ScoringConfig(resamples=200), study.QUARTER_FIT_CLAIMS)
    assert set(fitted) == {"deployed_minus_static_pruning", "deployed_minus_static_at_equal_macs"}
    assert fitted["deployed_minus_static_at_equal_macs"]["adjacent"] == {}  # it reads arrays these rows lack
    diff = fitted["deployed_minus_static_pruning"]["adjacent"]["4x4 → 4x8"]
    means = [np.mean(np.asarray(q["windows"]["phase1"]["deployed"]) - q["windows"]["phase1"]["static"]) for q in quarter]
    assert diff["estimate"] == pytest.approx(means[1] - means[0])
    assert diff["ci_low"] < diff["estimate"] < diff["ci_high"]
    assert fitted["deployed_minus_static_pruning"]["slope_per_doubling"] is None  # the leg needs all three points
    kept = [study.without_windows(r["off_75"]) for r in rows]
    assert [k["per_window"] for k in kept] == [True, True, False] and not any("windows" in k for k in kept)
