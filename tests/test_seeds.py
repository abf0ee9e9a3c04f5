"""Research headlines over seeds (DESIGN §12, lookahead.seeds), checked against separate runs."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from lookahead.pairs import SEEDED, PairsConfig, build_pairs, build_pairs_seeds
from lookahead.phase1 import Phase1Config
from lookahead.seeds import mean_sd, reseeded, seed_summary, with_spread


def test_reseeded_shifts_every_seed_of_a_section_nested_ones_included():
    cfg = Phase1Config()
    shifted = reseeded(cfg, 2)
    assert shifted.train.seed == cfg.train.seed + 2
    assert dataclasses.replace(shifted, train=cfg.train) == cfg  # nothing else changed
    pairs = reseeded(PairsConfig(seed=5), 1)
    assert pairs.seed == 6 and pairs.samples == PairsConfig().samples


def test_mean_and_sd_are_the_sample_statistics():
    values = [0.25, 1.5, -0.75, 2.0]
    assert mean_sd(values) == pytest.approx((statistics.mean(values), statistics.stdev(values)))
    assert mean_sd([3.0]) == (3.0, 0.0)
    assert mean_sd([None, float("nan"), 2.0, 4.0]) == pytest.approx((3.0, statistics.stdev([2.0, 4.0])))
    assert mean_sd([None, None]) == (None, None)  # e.g. a ratio undefined on every seed: JSON null
    summary = seed_summary([{"a": 1.0}, {"a": 2.0}, {"a": 6.0}], ["a"])
    assert summary == {"a": 3.0, "a_sd": pytest.approx(statistics.stdev([1, 2, 6])), "seeds": 3}


def test_with_spread_keeps_the_primary_run_beside_the_mean():
    out = with_spread({"a": 1.0, "b": "x", "c": 7}, [{"a": 3.0, "b": "y", "c": 9}], ["a"])
    assert out["a"] == 2.0 and out["a_sd"] == pytest.approx(2 ** 0.5) and out["seeds"] == 2
    assert out["b"] == "x" and out["c"] == 7  # unseeded figures: the primary run's
    assert out["primary"] == {"a": 1.0} and out["per_seed"] == [{"a": 1.0}, {"a": 3.0}]


def test_pairs_over_seeds_equal_separate_runs_on_each_seed(phase_inputs, downstream_inputs, tmp_path):
    """The stage's seeded figures are the mean and sd of independent runs with seed, seed + 1, …;
    the outputs are the first run's."""
    i = downstream_inputs
    cfg = PairsConfig(sequences=4, samples=3, keep=2, batch_size=2, approx_positions=6, device="cpu", seed=3, seeds=3)
    args = (i["base"], i["contexts"], i["init"], i["predictor"])
    seeded = build_pairs_seeds(cfg, *args, tmp_path / "seeded")
    runs = [build_pairs(dataclasses.replace(cfg, seed=s), *args, tmp_path / f"run{s}") for s in (3, 4, 5)]
    assert seeded["seeds"] == 3
    for key in SEEDED:
        values = [r[key] for r in runs]
        assert seeded[key] == pytest.approx(statistics.mean(values)), key
        assert seeded[f"{key}_sd"] == pytest.approx(statistics.stdev(values), abs=1e-12), key
    assert statistics.stdev(r["pairs"] for r in runs) > 0  # the seeds did change the draws
    assert (tmp_path / "seeded" / "pairs.safetensors").read_bytes() == (tmp_path / "run3" / "pairs.safetensors").read_bytes()
