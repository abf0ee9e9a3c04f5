"""Research headlines over seeds (docs/reproducibility.md, lookahead.core.seeds), checked against separate runs."""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest

from lookahead.core.seeds import final_evaluation_only, mean_ci, mean_sd, one_run, over_seeds, reseeded, seed_summary, with_spread
from lookahead.graph.predictor import PredictorConfig
from lookahead.pipeline.pairs import SEEDED, PairsConfig, build_pairs, build_pairs_seeds
from lookahead.pipeline.phase1.score import HEADLINE as PHASE1_HEADLINE
from lookahead.pipeline.phase1.run import build_phase1
from lookahead.pipeline.phase1.config import Phase1Config
from lookahead.train.loop import TrainConfig


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
    cfg = PairsConfig(target="beats_dense", sequences=4, samples=3, keep=2, batch_size=2, approx_positions=6, device="cpu", seed=3, seeds=3)
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


def test_a_seed_evaluated_only_at_its_end_trains_exactly_as_with_its_curve(phase_inputs, tmp_path):
    """The extra seeds skip the periodic evaluations; that must not change what they train (the
    evaluations draw from generators of their own) nor the final figures."""
    from safetensors.torch import load_file

    cfg = Phase1Config(nll_weight=1.0, distill=0.0, static_twin=False, lambda_head=0.1, eval_batch_size=2,
                       train=TrainConfig(steps=6, batch_size=2, lr=1e-2, warmup_steps=1, eval_every=2, log_every=1,
                                         checkpoint_every=0, device="cpu"))
    final = final_evaluation_only(cfg)
    assert final.train.eval_every == 6 and dataclasses.replace(final, train=cfg.train) == cfg
    args = (PredictorConfig.cascade(rank=2, hidden=8), phase_inputs["base"], phase_inputs["contexts"], phase_inputs["init"],
            phase_inputs["heads"])
    curve, with_curve, _ = build_phase1(cfg, *args, tmp_path / "a.safetensors")
    end, at_end, _ = build_phase1(final, *args, tmp_path / "b.safetensors")
    assert [r["step"] for r in with_curve.eval_curve] == [0, 2, 4, 6] and [r["step"] for r in at_end.eval_curve] == [0, 6]
    assert [r["loss"] for r in with_curve.train_curve] == [r["loss"] for r in at_end.train_curve]
    a, b = load_file(str(tmp_path / "a.safetensors")), load_file(str(tmp_path / "b.safetensors"))
    assert all(a[k].equal(b[k]) for k in a)
    assert {k: curve[k] for k in one_run(PHASE1_HEADLINE)} == {k: end[k] for k in one_run(PHASE1_HEADLINE)}


def test_mean_ci_closed_form():
    from scipy import stats

    out = mean_ci([1.0, 2.0, 3.0])
    half = stats.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)
    assert out == pytest.approx({"mean": 2.0, "sd": 1.0, "ci95_low": 2.0 - half, "ci95_high": 2.0 + half})
    assert mean_ci([5.0]) == {"mean": 5.0, "sd": 0.0, "ci95_low": 5.0, "ci95_high": 5.0}
    assert mean_ci([None, float("nan")]) == {"mean": None, "sd": None, "ci95_low": None, "ci95_high": None}
    assert mean_sd([1.0, 2.0, 3.0]) == (out["mean"], out["sd"])  # one implementation


def test_over_seeds_runs_the_primary_into_the_outputs_and_the_others_into_scratch():
    @dataclasses.dataclass
    class Cfg:
        seeds: int = 3
        seed: int = 7

    calls, gathered = [], []

    def run(cfg, scratch):
        calls.append((cfg.seed, scratch))
        return {"x": float(cfg.seed), "tokens": cfg.seed}, "result"

    out, result = over_seeds(Cfg(), "stage", ("x",), run, lambda runs: gathered.extend(r.pop("tokens") for r in runs))
    assert [seed for seed, _ in calls] == [7, 8, 9] and calls[0][1] is None and all(s is not None for _, s in calls[1:])
    assert result == "result" and gathered == [7, 8, 9] and "tokens" not in out
    assert out["x"] == 8.0 and out["x_sd"] == 1.0 and out["primary"] == {"x": 7.0} and out["seeds"] == 3
    assert over_seeds(Cfg(seeds=1), "stage", ("x",), lambda c, s: {"x": 1.0}) == {
        "x": 1.0, "x_sd": 0.0, "seeds": 1, "primary": {"x": 1.0}, "per_seed": [{"x": 1.0}]}
