"""The frontier study's script (scripts/frontier.py): its grid, what each point runs, and the MACs it
records, against closed forms."""

from __future__ import annotations

import pytest

from tests import consistency


@pytest.fixture(scope="module")
def study():
    return consistency.script("frontier")


def test_the_grid_runs_routed_points_in_both_skips_and_dense_models_over_base_seeds(study):
    points = study.grid()
    routed = [p for p in points if p.kind == "routed"]
    dense = [p for p in points if p.kind == "dense"]
    assert len(routed) == 2 * 7 and len(dense) == 2 * (4 * 3 - 1)  # the full width at seed 0: the routed points' base
    assert {(p.skip, p.keep) for p in routed} == {("full", 0.75), ("full", 0.5), ("full", 0.25), ("full", 0.125),
                                                 ("query", 0.5), ("query", 0.25), ("query", 0.125)}
    assert len({p.name for p in points}) == len(points)
    r = study.Point("4x8", "routed", "full", 0.125)
    assert r.name == "4x8-full-keep125" and r.targets == ("score_phase1", "score_phase2", "score_control")
    assert r.overrides("selection") == {
        "base.arch.n_layers": 4, "base.arch.n_heads": 8, "oracle.candidates": 4, "scoring.set": "selection",
        "phase1.static_twin": False, "phase1.score_static_curve": True, "predictor.keep": 0.125, "runtime.skip": "full"}
    d = study.Point("4x8", "dense", width=32, seed=2)
    assert d.name == "4x8-dense32-s2" and d.targets == ("score_control",)
    assert d.overrides("test")["base.arch.head_dim"] == 4 and d.overrides("test")["base.train.seed"] == 2
    assert study.experiment_name(d, "test") == "fr-4x8-dense32-s2" and study.experiment_name(d, "selection").endswith("-sel")
    with pytest.raises(study.StudyError, match="even head dim"):
        study.Point("4x8", "dense", width=36).overrides("test")


def test_the_plan_names_each_points_command(study, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = study.plan([study.Point("4x4", "dense", width=64, seed=1)], "selection")
    assert text.split()[:2] == ["4x4-dense64-s1", "to"]
    assert "-S base.arch.head_dim=16 -S base.train.seed=1" in text and text.endswith("score_control")


def test_non_embedding_macs_leave_the_lm_head_out_of_both_sides():
    """(m · dense − d·V) / (dense − d·V): dense stays 1, the head-less share of a cheaper model falls further."""
    from transformers import Olmo2Config

    from lookahead.graph.cost import macs_per_token

    study = consistency.script("frontier")
    cfg = Olmo2Config(hidden_size=8, intermediate_size=12, num_hidden_layers=4, num_attention_heads=4, vocab_size=61)
    out = study.macs_figures(cfg, 9, {"dense": 1.0, "half": 0.8, "none": None})
    dense = macs_per_token(cfg, 5.0, 1.0, "query")
    assert out["dense_macs_per_token"] == dense and out["lm_head_macs_per_token"] == 8 * 61
    assert out["dense_non_embedding"] == pytest.approx(1.0) and out["none_non_embedding"] is None
    assert out["half_non_embedding"] == pytest.approx((0.8 * dense - 488) / (dense - 488)) and out["half_non_embedding"] < 0.8
