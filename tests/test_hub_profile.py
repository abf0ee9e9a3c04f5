"""The real target's code path on a CPU (issue: the real target on paper and in a dry run):
`dvc repro` of profiles/olmo2-1b.yaml with the tiny profile's counts, every device ``cpu``, and
the hub replaced by a local hub cache of tiny stand-ins (tests/hub_profile.py)."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from lookahead.core.report import read_headline
from tests.hub_profile import BASE_ID, ENCODER_ID

pytestmark = pytest.mark.slow


def test_the_real_targets_profile_runs_end_to_end_on_tiny_stand_ins_of_its_hub_models(hub_profile_run, repo_root):
    path, env = hub_profile_run
    stages = list(yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"])
    assert list(yaml.safe_load((path / "dvc.lock").read_text())["stages"]) == stages  # every stage ran
    params = yaml.safe_load((path / "params.yaml").read_text())
    real = yaml.safe_load((repo_root / "profiles/olmo2-1b.yaml").read_text())
    for section, key in (("base", "source"), ("base", "model"), ("contexts", "encoder"), ("predictor", "gate"),
                         ("predictor", "input"), ("runtime", "skip"), ("pairs", "target"), ("phase2", "decoder"),
                         ("phase2", "windows")):
        assert params[section][key] == real[section][key], (section, key)  # the 1B profile's choices
    assert params["phase1"]["train"]["precision"] == real["phase1"]["train"]["precision"] == "bf16"
    assert (params["base"]["source"], params["base"]["model"], params["contexts"]["encoder"]) == ("hub", BASE_ID, ENCODER_ID)
    assert env["HF_HUB_OFFLINE"] == "1"
    base = json.loads((path / "models/base/config.json").read_text())  # the hub's model, as the base stage saved it
    assert (base["num_hidden_layers"], base["num_attention_heads"], base["hidden_size"]) == (16, 16, 64)
    headline = json.loads((path / "metrics/evaluate.json").read_text())
    figures = [v for v in headline.values() if isinstance(v, float)]
    assert figures and all(math.isfinite(v) for v in figures)
    phase2 = read_headline(path / "metrics/phase2.json")
    assert math.isfinite(phase2["hard_nll"]) and phase2["seeds"] == 1


def test_smollm2s_profile_runs_end_to_end_on_a_tiny_grouped_llama_gguf(gguf_profile_run, repo_root):
    """The SmolLM2 profile's code path (issue: every stage on SmolLM2-135M): `dvc repro` of
    profiles/smollm2-135m.yaml at the tiny profile's sizes, its GGUF file a tiny grouped Llama
    (tests/hub_profile.py): every stage ran on the loaded model, with the profile's choices."""
    path, _ = gguf_profile_run
    stages = list(yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"])
    assert list(yaml.safe_load((path / "dvc.lock").read_text())["stages"]) == stages  # every stage ran
    params = yaml.safe_load((path / "params.yaml").read_text())
    real = yaml.safe_load((repo_root / "profiles/smollm2-135m.yaml").read_text())
    for section, key in (("base", "source"), ("base", "document_separator"), ("predictor", "gate"),
                         ("predictor", "budget"), ("predictor", "keep"), ("predictor", "input"), ("runtime", "skip"),
                         ("runtime", "unit"), ("pairs", "target"), ("phase1", "score_loo_from_greedy"),
                         ("phase1", "distill_target"), ("static_baselines", "selection_shares"), ("oracle", "candidates")):
        assert params[section][key] == real[section][key], (section, key)  # the SmolLM2 profile's choices
    assert params["base"]["source"] == "gguf" and params["base"]["model"].endswith(".gguf")
    base = json.loads((path / "models/base/config.json").read_text())  # the GGUF's model, as the base stage saved it
    assert (base["model_type"], base["num_attention_heads"], base["num_key_value_heads"]) == ("llama", 4, 2)
    loaded = read_headline(path / "metrics/base.json")
    assert loaded["train_steps"] == 0 and math.isfinite(loaded["val_nll"])  # loaded and measured, not trained
    phase1 = read_headline(path / "metrics/phase1.json")
    assert phase1["active_head_fraction"] == 0.5  # exactly 4 of the 8 query heads at every token
    for key in ("hard_nll", "deployed_nll", "greedy_oracle_nll", "loo_oracle_nll", "static_pruning_nll"):
        assert math.isfinite(phase1[key]), key
    for stage in ("evaluate", "phase2", "control", "diffusion", "modulator", "probe", "static_baselines"):
        figures = [v for v in read_headline(path / f"metrics/{stage}.json").values() if isinstance(v, float)]
        assert figures and all(math.isfinite(v) for v in figures), stage


def test_the_smollm2_runs_claims_are_collected_from_its_per_window_test_nlls(gguf_profile_run, tmp_path):
    """`make smollm2-run`'s collection (lookahead.tools.profile_run.collect) on the tiny GGUF run: each
    claim of the headline is the run's own (phase 1's, evaluate's), from the per-window means of its
    score files, and the report carries its interval and verdict."""
    from lookahead.tools.profile_run import collect

    path, _ = gguf_profile_run
    written = collect(path, tmp_path / "smollm2", {"oracle": 1.0})
    assert {p.name for p in written} >= {"headline.json", "report.json", "windows.json"}
    headline = read_headline(tmp_path / "smollm2" / "headline.json")
    report = json.loads((tmp_path / "smollm2" / "report.json").read_text())
    phase1, evaluate = read_headline(path / "metrics/phase1.json"), read_headline(path / "metrics/evaluate.json")
    for name, own in (("deployed_minus_static_pruning", phase1), ("deployed_minus_static_at_equal_macs", phase1),
                      ("router_minus_static_pruning", phase1), ("phase2_minus_static_control", evaluate)):
        assert headline[name] == pytest.approx(own[name], abs=1e-6), name
        row = report["claims"][name]["per_base"]["0"]
        assert (headline[f"{name}_ci_low"], headline[f"{name}_ci_high"]) == (row["ci_low"], row["ci_high"])
        assert row["verdict"] in ("holds", "fails", "unresolved")
    assert headline["window_set"] == phase1["window_set"]
    main = json.loads((tmp_path / "smollm2" / "headline.json").read_text())  # `dvc metrics show`: a column a key
    assert sum(max(len(k), 9) + 2 for k in main) + len("metrics/smollm2/headline.json") <= 400
    assert not (tmp_path / "smollm2" / "headline_timing.json").exists()
