"""Headline metrics and full reports (docs/development.md#layout)."""

from __future__ import annotations

import json

import pytest

from lookahead.core.report import MAX_HEADLINE, pick, read_headline, write_metrics
from lookahead.pipeline.probe import build as probe

REPORT = {"train": {"lines": 10, "words": 55}, "val_nll": 3.25, "per_layer": [0.5, 1.0], "encoder": "minilm",
          "alpha": {"l0": 0.1, "l2": 0.3}, "nested": {"a": {"b": 1}}, "named": {"x": "text"}}


def test_pick_takes_named_paths_and_keeps_only_those():
    assert pick(REPORT, {"train_lines": "train.lines", "val_nll": "val_nll"}) == {"train_lines": 10, "val_nll": 3.25}
    assert pick(REPORT, ("val_nll", "encoder")) == {"val_nll": 3.25, "encoder": "minilm"}


def test_pick_admits_a_flat_dict_of_numbers_as_one_figure():
    # e.g. the modulator's α per layer: `dvc metrics show` flattens it to alpha.l0, alpha.l2
    headline = pick(REPORT, ("val_nll", "alpha"))
    assert headline == {"val_nll": 3.25, "alpha": {"l0": 0.1, "l2": 0.3}}
    assert headline["alpha"] is not REPORT["alpha"]  # a copy: the headline does not alias the report


@pytest.mark.parametrize("keys, error, fragment", [
    (("train.chars",), KeyError, "'train.chars' is not in the report (at 'chars')"),
    (("nested",), ValueError, "must be a scalar or a flat dict of numbers, not dict"),
    (("named",), ValueError, "must be a scalar or a flat dict of numbers, not dict"),
    (("per_layer",), ValueError, "must be a scalar or a flat dict of numbers, not list"),
    (tuple(f"k{i}" for i in range(MAX_HEADLINE + 1)), ValueError, f"keep it to {MAX_HEADLINE}"),
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
    assert run.metrics == [REPORT] and run.artifacts == [str(tmp_path / "r.json"), str(tmp_path / "m_timing.json")]


def test_spreads_and_intervals_go_to_sibling_files_and_read_back_as_one_headline(tmp_path):
    """So that `dvc metrics show metrics/<stage>.json` fits a terminal: the figures in it, their
    spreads in <stage>_sd.json, the claims' intervals in <stage>_ci.json (each only where it has one)."""
    report = {"nll": 4.0, "nll_sd": 0.1, "gap": -0.5, "gap_sd": 0.2, "gap_se": 0.1, "gap_ci_low": -0.7,
              "gap_ci_high": -0.3, "seeds": 3, "kind": "lerp", "layers": {"l0": 0.5}}
    keys = tuple(report)
    headline = write_metrics(report, keys, tmp_path / "m.json", tmp_path / "r.json")
    assert headline == report and read_headline(tmp_path / "m.json") == report
    assert json.loads((tmp_path / "m.json").read_text()) == {"nll": 4.0, "gap": -0.5, "kind": "lerp", "layers": {"l0": 0.5}}
    assert json.loads((tmp_path / "m_sd.json").read_text()) == {"nll_sd": 0.1, "gap_sd": 0.2, "gap_se": 0.1, "seeds": 3}
    assert json.loads((tmp_path / "m_ci.json").read_text()) == {"gap_ci_low": -0.7, "gap_ci_high": -0.3}
    # a later headline without intervals leaves no stale sibling to be read back with it
    write_metrics(report, ("nll", "nll_sd", "seeds"), tmp_path / "m.json", tmp_path / "r.json")
    assert not (tmp_path / "m_ci.json").exists() and read_headline(tmp_path / "m.json") == {"nll": 4.0, "nll_sd": 0.1, "seeds": 3}
    write_metrics(report, ("nll",), tmp_path / "m.json", tmp_path / "r.json")
    assert not (tmp_path / "m_sd.json").exists()
    # a sibling dvc.yaml declares for a stage whose headline has it under some settings only: always written
    write_metrics(report, ("nll",), tmp_path / "m.json", tmp_path / "r.json", declared=("sd",))
    assert json.loads((tmp_path / "m_sd.json").read_text()) == {} and read_headline(tmp_path / "m.json") == {"nll": 4.0}


def test_timings_leave_the_headline_and_the_report_for_their_own_file(tmp_path):
    """What measures the machine (throughputs, seconds) is kept out of the DVC outputs, so that a
    rerun writes the same bytes (docs/reproducibility.md); nested and per-row timings included."""
    report = {"val_nll": 3.25, "train_tokens_per_s": 900.0, "train_seconds": 12.0, "train_wall_s": 13.0,
              "table": {"dense": {"nll": 3.0, "tokens_per_s_over_dense": 1.0}, "hard": {"nll": 3.5}},
              "rows": [{"name": "a", "samples_per_s": 5.0}, {"name": "b", "samples_per_s": 6.0}],
              "per_layer": [0.5, 1.0], "seconds_of_audio": 4}
    write_metrics(report, ("val_nll",), tmp_path / "m.json", tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text()) == {
        "val_nll": 3.25, "table": {"dense": {"nll": 3.0}, "hard": {"nll": 3.5}}, "rows": [{"name": "a"}, {"name": "b"}],
        "per_layer": [0.5, 1.0], "seconds_of_audio": 4}
    assert json.loads((tmp_path / "m_timing.json").read_text()) == {
        "train_tokens_per_s": 900.0, "train_seconds": 12.0, "train_wall_s": 13.0,
        "table": {"dense": {"tokens_per_s_over_dense": 1.0}}, "rows": [{"samples_per_s": 5.0}, {"samples_per_s": 6.0}]}
    with pytest.raises(KeyError, match="train_seconds"):  # a timing cannot be a headline figure
        write_metrics(report, ("train_seconds",), tmp_path / "m.json", tmp_path / "r.json")


def test_probe_headline_names_each_model_and_the_base_head_figures():
    def block(heads: bool):
        b = {"embedding": {"cv_ratio": {"mean": 2.0, "sd": 0.3}, "participation_ratio": 9.0},
             "relational": {"contextual": {"pearson": {"mean": 0.1, "sd": 0.01}, "spearman": {"mean": 0.2, "sd": 0.02}}}}
        if heads:
            b["heads"] = {"dense_nll": {"mean": 4.0}, "ablation_dnll_max": {"mean": 1.5}}
        return b

    report = {"base": block(True), "Qwen/Qwen3-Embedding-0.6B": block(False)}
    headline = pick(report, probe.headline_keys(report))
    seeded = {"contextual_pearson": (0.1, 0.01), "contextual_spearman": (0.2, 0.02)}
    assert headline == {
        **{f"{tag}_{k}{suffix}": v[i] for tag in ("base", "Qwen_Qwen3_Embedding_0_6B") for k, v in seeded.items()
           for i, suffix in enumerate(("", "_sd"))},
        "base_cv_ratio": 2.0, "Qwen_Qwen3_Embedding_0_6B_cv_ratio": 2.0,
        "base_dense_nll": 4.0, "base_ablation_dnll_max": 1.5, "base_participation_ratio": 9.0,
    }
    # the most models probe.models accepts still fit the headline
    many = {"base": block(True), **{f"m{i}": block(False) for i in range(probe.MAX_MODELS - 1)}}
    assert len(pick(many, probe.headline_keys(many))) <= MAX_HEADLINE
