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
