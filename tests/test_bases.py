"""The claims across base LMs (lookahead.tools.bases): each base's figures are its run's, the
across-bases interval covers a known mean as often as it says, and the headline is drawn from the report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lookahead.artifacts.val_scores import ScoringConfig, scoring_from_params
from lookahead.core.floats import close
from lookahead.core.report import read_headline
from lookahead.tools import bases

REPO = Path(__file__).resolve().parents[1]


def synthetic(seed: int, mean: float, base_sd: float, window_sd: float, seed_sd: float, windows: int = 64,
              seeds: int = 2, rng=None) -> dict:
    """A base's record whose deployed − static per-window differences are ``mean`` + a base effect + a seed
    effect + window noise, the static arrays shared (what every base scores: the same windows)."""
    base = rng.normal(0.0, base_sd)
    diffs = mean + base + rng.normal(0.0, seed_sd, (seeds, 1)) + rng.normal(0.0, window_sd, (seeds, windows))
    static = np.full((1, windows), 4.0)
    return {"seed": seed, "rev": "synthetic", "window_set": f"test:{windows}x1:synthetic", "stage_seconds": {},
            "headlines": {}, "windows": {"phase1": {"static": static.tolist(), "deployed": (static + diffs).tolist()}}}


def test_the_across_bases_interval_covers_a_known_mean_at_its_level():
    """Bases drawn with a known between-base spread: the 95 % interval (bases in place of seeds)
    covers the true mean in about 95 % of draws (Welch–Satterthwaite's degrees of freedom are an
    approximation: 93–95 % measured where the base and window components are of one size, 94.5 % where the
    bases dominate), where an interval without the base component (windows and seeds of one base) covers
    it far less often."""
    rng = np.random.default_rng(0)
    scoring = ScoringConfig(resamples=100)
    claim = next(c for c in bases.CLAIMS if c.name == "deployed_minus_static_pruning")
    covered, narrow, draws = 0, 0, 1000
    for _ in range(draws):
        records = [synthetic(s, -0.1, base_sd=0.05, window_sd=0.1, seed_sd=0.01, rng=rng) for s in range(3)]
        across = bases.across_bases(records, claim, scoring)
        covered += across["ci_low"] <= -0.1 <= across["ci_high"]
        one = bases.per_base(records[0], claim, scoring)
        narrow += one["ci_low"] <= -0.1 <= one["ci_high"]
    assert 0.91 <= covered / draws <= 0.98, covered / draws
    assert narrow / draws < 0.75, narrow / draws
    # the interval's parts: sd over the bases' means, Student's t at few degrees of freedom
    assert across["sd"] == pytest.approx(np.std([bases.claim_differences(r, claim).mean() for r in records], ddof=1))
    assert across["df"] is not None and across["df"] < 10


def test_the_prediction_interval_is_t_of_b_minus_1_without_a_window_component():
    from scipy import stats

    low, high = bases.prediction_interval(0.0, 0.1, 3, 0.0)
    assert high == pytest.approx(stats.t.ppf(0.975, 2) * 0.1 * np.sqrt(1 + 1 / 3))
    assert low == pytest.approx(-high)
    wider = bases.prediction_interval(0.0, 0.1, 3, 0.05)
    assert wider[1] > high


def test_each_base_carries_its_runs_claims_and_the_headline_is_drawn_from_the_report(pipeline_repo, tmp_path,
                                                                                         monkeypatch):
    """The tiny run as one base: the claims recomputed from its per-window means are its headline's (the
    same bootstrap of the same windows); two copies of it make a table whose headline is the report's
    across-bases figures (and whose between-base sd is 0)."""
    path, _ = pipeline_repo
    monkeypatch.chdir(path)
    import yaml

    scoring = scoring_from_params(yaml.safe_load((path / "params.yaml").read_text()))
    record = bases.base_record(0, None, {"base": 1.0})
    phase1, evaluate = (read_headline(path / "metrics" / f"{s}.json") for s in ("phase1", "evaluate"))
    assert record["headlines"]["phase1"]["window_set"] == record["window_set"] == phase1["window_set"]
    checked = 0
    for claim in (*bases.CLAIMS, *bases.RATIOS):
        headline = phase1 if claim.stage == "phase1" else evaluate
        if not bases.measured(record, claim) or headline.get(f"{claim.name}_ci_low") is None:
            continue
        figures = bases.per_base(record, claim, scoring)
        assert figures["ci_low"] == pytest.approx(headline[f"{claim.name}_ci_low"], abs=1e-5), claim.name
        assert figures["ci_high"] == pytest.approx(headline[f"{claim.name}_ci_high"], abs=1e-5), claim.name
        checked += 1
    assert checked >= 4
    monkeypatch.chdir(tmp_path)
    (tmp_path / "metrics" / "bases").mkdir(parents=True)
    for seed in (0, 1):
        bases.write_record(tmp_path / "metrics" / "bases" / f"seed{seed}.json", {**record, "seed": seed})
    assert json.loads((tmp_path / "metrics" / "bases" / "seed1.json").read_text())["windows"] == record["windows"]
    report = bases.write_tables(scoring)
    headline = read_headline(tmp_path / bases.HEADLINE)
    assert headline["bases"] == 2 and json.loads((tmp_path / bases.REPORT).read_text())["bases"] == 2
    for name, row in report["claims"].items():
        assert headline[name] == row["across"]["mean"] == pytest.approx(row["per_base"]["0"]["mean"])
        assert headline[f"{name}_sd"] == 0.0
        assert (headline[f"{name}_ci_low"], headline[f"{name}_ci_high"]) == (row["across"]["ci_low"],
                                                                              row["across"]["ci_high"])


def test_bases_scored_on_different_windows_are_refused():
    rng = np.random.default_rng(1)
    a, b = (synthetic(s, 0.0, 0.0, 0.1, 0.0, rng=rng) for s in (0, 1))
    b["window_set"] = "test:64x1:another"
    with pytest.raises(bases.StudyError, match="different windows"):
        bases.tables([a, b], ScoringConfig(resamples=50))


def test_the_committed_report_splits_each_interval_into_its_two_components():
    """What the results page's "what each interval is made of" table reads: se² = window se² + sd² / B, and
    each base's share of static pruning's damage the router pays (``deployed_ratio``, a ratio of sums over
    the per-window means) is its phase-1 NLLs' (deployed − dense) / (static − dense)."""
    report = json.loads((REPO / "metrics" / "bases_report.json").read_text())
    for name, row in report["claims"].items():
        across = row["across"]
        assert close(across["se"] ** 2, across["token_se"] ** 2 + across["sd"] ** 2 / report["bases"]), name
    shares = report["claims"]["deployed_ratio"]["per_base"]
    assert set(shares) == set(report["per_base"]) and len(shares) == report["bases"]
    for seed, share in shares.items():
        record = json.loads((REPO / "metrics" / "bases" / f"seed{seed}.json").read_text())["headlines"]["phase1"]
        dense, static, deployed = record["dense_nll"], record["static_pruning_nll"], record["deployed_nll"]
        # rel 1e-5, not the CPU's 1e-9: the share is a ratio of sums of per-window means rounded to 7 decimals
        assert share["mean"] == pytest.approx((deployed - dense) / (static - dense), rel=1e-5)
        assert share["ci_low"] < share["mean"] < share["ci_high"]


def test_each_bases_absolute_headlines_are_its_runs_and_their_spread_is_the_report_s():
    """`figures` of the committed report (what `make verify` judges a fresh run's absolute figures by): seed 0
    is the committed run, so its value of every figure is that run's headline — exactly where the base kept
    the headline, to the 7 decimals of the per-window means where it comes from phase 2's and the controls'
    score files (bases.SCORED_FIGURES: the map from headline to score array is right); the mean and sd are
    those of the bases' values; a claim is not among them (it is judged across bases in `claims`)."""
    from lookahead.core.floats import mismatches
    from tests import consistency

    with consistency.committed() as root:
        report = json.loads((root / bases.REPORT).read_text())
        records = [json.loads(p.read_text()) for p in sorted((root / bases.BASE_DIR).glob("seed*.json"))]
        committed = {stage: read_headline(root / "metrics" / f"{stage}.json")
                     for stage in ("phase1", "evaluate", "diffusion", "modulator", "phase2", "control", "static_control")}
    figures = report["figures"]
    consistency.assert_recomputed(bases.figures(records), figures, "figures")  # means and sds: refitted on this CPU
    assert set(bases.SCORED_FIGURES) <= set(figures) and {"evaluate.static_control_nll", "phase1.deployed_nll"} <= set(figures)
    for name, figure in figures.items():
        stage, key = name.split(".", 1)
        assert f"{key}_sd" in committed[stage] and f"{key}_ci_low" not in committed[stage], name
        tolerance = 1e-6 if name in bases.SCORED_FIGURES else 0.0
        assert abs(figure["per_base"]["0"] - committed[stage][key]) <= tolerance, (name, figure, committed[stage][key])
        values = np.array(list(figure["per_base"].values()))
        assert len(values) == report["bases"] and not mismatches(values.std(ddof=1), figure["sd"])
