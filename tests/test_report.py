"""Headline metrics and full reports (DESIGN §1)."""

from __future__ import annotations

import json

import pytest

from lookahead import probe
from lookahead.report import MAX_HEADLINE, pick, write_metrics

REPORT = {"train": {"lines": 10, "words": 55}, "val_nll": 3.25, "per_layer": [0.5, 1.0], "encoder": "minilm"}


def test_pick_takes_named_paths_and_keeps_only_those():
    assert pick(REPORT, {"train_lines": "train.lines", "val_nll": "val_nll"}) == {"train_lines": 10, "val_nll": 3.25}
    assert pick(REPORT, ("val_nll", "encoder")) == {"val_nll": 3.25, "encoder": "minilm"}


@pytest.mark.parametrize("keys, error, fragment", [
    (("train.chars",), KeyError, "'train.chars' is not in the report (at 'chars')"),
    (("train",), ValueError, "must be a scalar, not dict"),
    (("per_layer",), ValueError, "must be a scalar, not list"),
    (tuple(f"k{i}" for i in range(MAX_HEADLINE + 1)), ValueError, "keep it to 24"),
])
def test_pick_refuses_missing_nested_or_too_many(keys, error, fragment):
    with pytest.raises(error, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        pick(REPORT, keys)


class Recorder:
    def __init__(self):
        self.metrics, self.artifacts = [], []

    def log_metrics(self, figures):
        self.metrics.append(figures)

    def log_artifact(self, path):
        self.artifacts.append(str(path))


def test_write_metrics_writes_headline_and_whole_report_and_logs_the_report(tmp_path):
    run = Recorder()
    headline = write_metrics(REPORT, {"train_lines": "train.lines"}, tmp_path / "m.json", tmp_path / "r.json", run)
    assert json.loads((tmp_path / "m.json").read_text()) == headline == {"train_lines": 10}
    assert json.loads((tmp_path / "r.json").read_text()) == REPORT
    assert run.metrics == [REPORT] and run.artifacts == [str(tmp_path / "r.json")]


def test_probe_headline_names_each_model_and_the_base_head_figures():
    def block(heads: bool):
        b = {"embedding": {"cv_ratio": {"mean": 2.0}, "participation_ratio": 9.0},
             "relational": {"contextual": {"pearson": {"mean": 0.1}, "spearman": {"mean": 0.2}}}}
        if heads:
            b["heads"] = {"dense_nll": {"mean": 4.0}, "ablation_dnll_max": {"mean": 1.5}}
        return b

    report = {"base": block(True), "Qwen/Qwen3-Embedding-0.6B": block(False)}
    headline = pick(report, probe.headline_keys(report))
    assert headline == {
        "base_cv_ratio": 2.0, "base_contextual_pearson": 0.1, "base_contextual_spearman": 0.2, "base_dense_nll": 4.0,
        "base_ablation_dnll_max": 1.5, "base_participation_ratio": 9.0, "Qwen_Qwen3_Embedding_0_6B_cv_ratio": 2.0,
        "Qwen_Qwen3_Embedding_0_6B_contextual_pearson": 0.1, "Qwen_Qwen3_Embedding_0_6B_contextual_spearman": 0.2,
    }
    # the most models probe.models accepts still fit the headline
    many = {"base": block(True), **{f"m{i}": block(False) for i in range(probe.MAX_MODELS - 1)}}
    assert len(pick(many, probe.headline_keys(many))) <= MAX_HEADLINE
