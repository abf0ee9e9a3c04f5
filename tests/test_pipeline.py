"""End to end: `dvc repro` of the tiny profile in a temporary copy of the repository.

Checks what a researcher relies on: outputs and metrics appear, a second run from scratch in another
repository writes the same bytes for every output of every stage (docs/reproducibility.md), a changed `phase2`
param reruns only `phase2` and the stage downstream of it, reverting it restores the old outputs
from DVC's run-cache without training, plots render, MLflow groups the stages, and queued
experiments (`dvc exp run --queue` + `dvc queue start`) land in the same MLflow store.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from lookahead.core.config import flatten
from lookahead.core.report import MAX_HEADLINE, read_headline
from tests.conftest import QUEUED_EXPERIMENTS, lock_outs, sh
from tests.consistency import metrics_width

pytestmark = pytest.mark.slow
STAGES = ("corpus", "tokenizer", "base", "wordnet", "probe", "init", "contexts", "modulator", "oracle", "static_baselines",
          "phase1", "score_phase1",
          "pairs", "diffusion", "phase2", "control", "static_control", "score_phase2", "score_control",
          "evaluate")
TRAINING = ("phase1", "phase2", "control", "static_control")
"""Stages that train and write no headline: a scoring stage writes ``metrics/<stage>.json`` for each."""
HEADLINES = tuple(stage for stage in STAGES if not stage.startswith("score_"))
"""The stages whose headline and report ``metrics/<stage>.json`` and ``_report.json`` hold (the training
stages' written by their scoring stages)."""


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stage_runs(repo: Path) -> list:
    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("lookahead")
    return client.search_runs([exp.experiment_id], max_results=1000)


@pytest.fixture
def repo(pipeline_repo):
    return pipeline_repo


def test_repro_then_only_changed_stage_reruns_then_run_cache_restores(repo, pipeline_repro_output):
    path, env = repo
    out = pipeline_repro_output  # the session's tiny run (tests/conftest.py), started with the session
    for stage in STAGES:
        assert f"Running stage '{stage}'" in out
    headline = {stage: read_headline(path / "metrics" / f"{stage}.json") for stage in HEADLINES}
    report = {stage: json.loads((path / "metrics" / f"{stage}_report.json").read_text()) for stage in HEADLINES}
    docs = "\n".join(page.read_text() for page in [path / "README.md", *sorted((path / "docs").rglob("*.md"))])
    for stage in HEADLINES:  # headline figures: flat, a few, documented; the report holds the rest
        assert 1 <= len(headline[stage]) <= MAX_HEADLINE and len(flatten(report[stage])) >= len(headline[stage]), stage
        # scalars, or a dict of scalars (`dvc metrics show` flattens it: alpha_per_layer.l0, ...)
        assert all(not isinstance(v, list) and (not isinstance(v, dict) or all(isinstance(x, (int, float)) for x in v.values()))
                   for v in headline[stage].values()), stage
        assert all(f"`{key}`" in docs for key in headline[stage]), (stage, set(headline[stage]))
    # every headline file fits a terminal: `dvc metrics show metrics/<stage>.json` at most 400 characters
    # wide (spreads and intervals in the sibling files, lookahead.core.report), each sibling declared
    shown = json.loads(sh(["dvc", "metrics", "show", "--json"], path, env))
    declared = {name for rev in shown.values() for name in rev["data"]}
    written = {f"metrics/{name}.json" for stage in HEADLINES for name in (stage, f"{stage}_sd", f"{stage}_ci")
               if (path / "metrics" / f"{name}.json").is_file()}
    assert written == declared, written ^ declared
    assert {f"metrics/{stage}_{part}.json" for stage, part in (("phase1", "ci"), ("evaluate", "ci"), ("phase2", "sd"))} <= declared
    widths = {name: metrics_width(shown, name) for name in declared}
    assert max(widths.values()) <= 400, widths
    base = headline["base"]
    assert set(base) == {"val_nll", "val_ppl", "val_unigram_nll", "parameters", "train_steps"}
    assert base["val_nll"] == report["base"]["val_nll"]
    timing = {stage: json.loads((path / "metrics" / f"{stage}_timing.json").read_text()) for stage in ("base", "contexts", "pairs")}
    assert timing["base"]["train_tokens_per_s"] > 0 and "train_tokens_per_s" not in report["base"]
    assert (path / "models" / "base" / "model.safetensors").is_file()
    assert (path / "metrics" / "base_curves.png").stat().st_size > 1000
    assert headline["corpus"]["train_lines"] == report["corpus"]["train"]["lines"] > 0
    wordnet = headline["wordnet"]
    assert wordnet["anchors"] == 32 and wordnet["matched_tokens"] >= 32
    assert np.load(path / "data" / "wordnet" / "wup.npy").shape == (32, 32)
    assert set(report["probe"]) == {"base", "minilm"} and "heads" in report["probe"]["base"]
    assert headline["probe"]["minilm_contextual_spearman"] == report["probe"]["minilm"]["relational"]["contextual"]["spearman"]["mean"]
    assert (path / "data" / "probe" / "heads.safetensors").is_file()
    assert report["init"]["n_geo"] == 8 and report["init"]["nodes"] == 1 + 2 * 2
    modulator = headline["modulator"]
    # alignment before = the probe stage's figure for the base model, measured the same way
    assert modulator["pearson_before"] == headline["probe"]["base_contextual_pearson"]
    assert modulator["spearman_before"] == headline["probe"]["base_contextual_spearman"]
    assert set(modulator["alpha_per_layer"]) == {"l0", "l1"} and modulator["alpha_mean"] > 0
    assert (path / "models" / "modulator" / "modulator.safetensors").is_file()
    assert (path / "metrics" / "modulator.png").stat().st_size > 1000
    contexts = headline["contexts"]
    assert contexts["encoder"] == "minilm" and contexts["positions"] == (8 + 4) * 32
    assert timing["contexts"]["positions_per_s"] > 0
    assert np.load(path / "data" / "contexts" / "train_contexts.npy", mmap_mode="r").shape == (8, 32, 384)
    phase1 = headline["phase1"]
    assert {"dense_nll", "hard_nll", "active_head_fraction", "static_pruning_nll", "random_heads_nll", "deployed_nll",
            "router_minus_static_pruning", "router_minus_static_pruning_ci_low", "router_minus_static_pruning_ci_high"} <= set(phase1)
    assert {"soft_nll", "active_edge_fraction"} <= set(report["phase1"]["cache_val"])  # the cache's windows, named
    # the headline NLLs are the scoring set's; what later stages compare with is the cache's val windows
    assert report["phase1"]["scored_positions"] == 256 and phase1["router_minus_static_pruning_ci_low"] <= phase1["router_minus_static_pruning"]
    cache_val = report["phase1"]["cache_val"]
    # the predictor starts near the dense graph: soft gates sigmoid(z-scored importance + init_bias 3) >= ~0.8
    # with 4 heads (which heads are low depends on the probe's importance windows)
    assert abs(report["phase1"]["init_soft_nll_minus_dense"]) <= 0.05
    assert 0.0 <= phase1["active_head_fraction"] <= 1.0
    assert (path / "models" / "phase1" / "predictor.safetensors").is_file()
    # every headline figure on the test windows, the claims with their intervals; seed 1's router kept for phase 2
    assert phase1["window_set"].startswith("test:8x32:") and cache_val["window_set"].startswith("cache-val:4x32:")
    for claim in ("deployed_minus_static_pruning", "deployed_minus_static_at_equal_macs"):
        assert phase1[f"{claim}_ci_low"] <= phase1[claim] <= phase1[f"{claim}_ci_high"], claim
    assert phase1["greedy_capture"] is None or phase1["greedy_capture_ci_low"] <= phase1["greedy_capture"]
    assert 0 <= report["phase1"]["static_recall_at_k"] <= 1 and report["phase1"]["equal_macs_static_heads"] > 2
    seed1 = path / "models" / "phase1" / "seeds" / "predictor_seed1.safetensors"
    assert seed1.is_file() and digest(seed1) != digest(path / "models" / "phase1" / "predictor.safetensors")
    assert report["phase2"]["router"].endswith("phase1/predictor.safetensors")  # seed 0's; seed 1 read seed1
    assert (path / "metrics" / "phase1_pareto.png").stat().st_size > 1000
    pairs = headline["pairs"]
    # the eps-good ground truth (pairs.target eps_good): deterministic, one run, no spread
    assert {"pairs", "eps_good_per_position", "eps_good_multi_share", "greedy_kl", "best_kl"} <= set(pairs)
    assert "seeds" not in pairs and pairs["eps_good_per_position"] >= 1 and pairs["best_kl"] <= pairs["greedy_kl"]
    assert report["pairs"]["positions"] == (4 + 2) * 32 and timing["pairs"]["positions_per_s"] > 0
    # research headlines: the mean over the stage's seeds and its sd (docs/reproducibility.md); the outputs are the
    # first seed's, and what later stages read
    for stage in ("phase1", "diffusion", "phase2", "control", "static_control", "evaluate", "modulator"):
        assert headline[stage]["seeds"] == 2 and any(k.endswith("_sd") for k in headline[stage]), stage
    assert len(report["phase1"]["per_seed"]) == 2
    assert phase1["hard_nll"] == pytest.approx(sum(r["hard_nll"] for r in report["phase1"]["per_seed"]) / 2)
    assert (path / "data" / "pairs" / "pairs.safetensors").is_file()
    diffusion, decoders = headline["diffusion"], report["diffusion"]
    assert diffusion["eps_good_per_position"] == pytest.approx(pairs["val_eps_good_per_position"])  # the val ground truth
    assert diffusion["deterministic_nll"] == decoders["router_sample_nll"]
    for name in ("baseline", "autoregressive", "diffusion"):  # the label-free choice never beats the target's
        assert decoders[f"{name}_best_of_k_target_nll"] <= decoders[f"{name}_best_of_k_label_free_nll"] + 1e-6
        assert 0.0 <= decoders[f"{name}_recall_at_1"] <= decoders[f"{name}_recall_at_8"] <= 1.0
    assert (path / "models" / "diffusion" / "model.safetensors").is_file()
    assert (path / "metrics" / "diffusion_samplers.png").stat().st_size > 1000
    phase2, control, evaluate = headline["phase2"], headline["control"], headline["evaluate"]
    assert phase2["base_val_nll"] == pytest.approx(cache_val["dense_nll"], rel=1e-5)  # the base LM on the same windows
    # phase 2 starts from phase 1's router with the most important head pinned on (tiny: shared_heads 1): the
    # same NLL where the router already kept that head everywhere, near it otherwise
    assert report["phase2"]["start_hard_nll"] == pytest.approx(cache_val["hard_nll"], abs=0.02)
    assert (path / "models" / "phase2" / "lm" / "model.safetensors").is_file()
    assert (path / "models" / "control" / "model.safetensors").is_file()
    assert control["base_val_nll"] == phase2["base_val_nll"] and control["train_tokens"] == phase2["train_tokens"]
    static = headline["static_control"]
    assert static["train_tokens"] == phase2["train_tokens"] and static["active_head_fraction"] == 0.5  # tiny: top-K, half
    # the trained LMs: means over seeds on the scoring set, as their stages wrote them
    assert evaluate["static_control_nll"] == pytest.approx(static["val_nll"], rel=1e-5)
    assert evaluate["phase2_hard_nll"] == pytest.approx(phase2["hard_nll"], rel=1e-5)
    assert evaluate["dense_control_nll"] == pytest.approx(control["val_nll"], rel=1e-5)
    # the claims pair phase 2 as deployed (the tiny router reads the LM: its own routed states)
    assert phase2["deployed_nll"] is not None and report["evaluate"]["claims"]["phase2_scored_as"] == "deployed"
    assert evaluate["phase2_minus_control"] == pytest.approx(phase2["deployed_nll"] - control["val_nll"], abs=1e-5)
    assert evaluate["phase2_minus_control_ci_low"] <= evaluate["phase2_minus_control"] <= evaluate["phase2_minus_control_ci_high"]
    # the base LM beside them on the same windows (phase 1's per-position NLLs); the table's rows, the cache's
    assert evaluate["dense_base_nll"] == pytest.approx(phase1["dense_nll"], rel=1e-5)
    assert evaluate["phase1_hard_nll"] == pytest.approx(phase1["hard_nll"], rel=1e-5)
    assert evaluate["window_set"] == phase1["window_set"] == report["phase2"]["window_set"] == report["control"]["window_set"]
    assert evaluate["cache_window_set"].startswith("cache-val:4x32:")
    assert report["evaluate"]["causality"]["passed"] and evaluate["causality_max_change"] <= 1e-5
    table = (path / "metrics" / "evaluate_table.md").read_text()
    assert table.count("\n| `") == 15 and "passed" in table
    assert (path / "metrics" / "evaluate_explainer.png").stat().st_size > 20_000
    assert "<svg" in (path / "metrics" / "evaluate_explainer.html").read_text()
    assert_every_seeds_models_are_kept(path)
    phase2_runs = lambda: sum(r.data.tags.get("lookahead.stage") == "phase2" for r in stage_runs(path))  # noqa: E731
    assert phase2_runs() == 1

    # nothing changed: nothing runs
    out = sh(["dvc", "repro"], path, env)
    assert "Running stage" not in out

    # one phase-2 param changed: phase2 and the stages that read its model rerun (scoring, evaluate); nothing
    # upstream, no sibling (control), and not the static control (the fraction it matches, top-K's half, is
    # unchanged). Every stage's deps are checked statically by test_stage_deps; a change
    # further up reruns its dependants by the same mechanism (not repeated here, for the suite's time)
    predictor = digest(path / "models" / "phase2" / "predictor.safetensors")
    params = yaml.safe_load((path / "params.yaml").read_text())
    original = (path / "params.yaml").read_text()
    params["phase2"]["lambda_head"] = 0.7
    (path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = sh(["dvc", "repro"], path, env)
    for stage in ("phase2", "score_phase2", "evaluate"):
        assert f"Running stage '{stage}'" in out
    assert out.count("Running stage") == 3, out
    assert digest(path / "models" / "phase2" / "predictor.safetensors") != predictor
    assert phase2_runs() == 2

    # reverted: DVC's run-cache restores the first outputs; nothing trains, nothing is logged
    (path / "params.yaml").write_text(original)
    out = sh(["dvc", "repro"], path, env)
    assert "Stage 'phase2' is cached - skipping run, checking out outputs" in out
    assert "Running stage" not in out
    assert digest(path / "models" / "phase2" / "predictor.safetensors") == predictor
    assert phase2_runs() == 2

    # MLflow: one parent per pipeline run (params differ -> pipeline ids differ), children under it
    runs = stage_runs(path)
    parents = {r.info.run_id: r for r in runs if r.data.tags["lookahead.role"] == "pipeline"}
    children = [r for r in runs if r.data.tags["lookahead.role"] == "stage"]
    assert len(parents) == 2 and len(children) == len(STAGES) + 3
    assert all(c.data.tags["mlflow.parentRunId"] in parents for c in children)
    assert all(p.info.status == "FINISHED" for p in parents.values())
    # the report reaches MLflow whole: as an artifact, and its lists as step series
    probe = next(c for c in children if c.data.tags["lookahead.stage"] == "probe")
    client = MlflowClient(f"sqlite:///{path / 'mlflow.db'}")
    assert "probe_report.json" in [a.path for a in client.list_artifacts(probe.info.run_id)]
    series = client.get_metric_history(probe.info.run_id, "base.weights.self_attn.q_proj.stable_rank")
    assert sorted(m.step for m in series) == [0, 1]  # one point per layer of the tiny base


def assert_every_seeds_models_are_kept(path: Path) -> None:
    """What a scoring stage reads is a DVC output: every seed's router, LM and control, and each of
    phase 1's seeds' static twin (tiny: 2 seeds, static_twin on). Read back and scored on the scoring
    windows, seed 1's models give the per-position NLLs their stages wrote for seed 1 (the twin: the
    mean its report holds): the files are enough to score them again."""
    from transformers import AutoModelForCausalLM

    from lookahead.artifacts.contexts import ContextCache
    from lookahead.artifacts.probe_heads import head_importance
    from lookahead.artifacts.static_baselines import StaticBaselines
    from lookahead.artifacts.val_scores import load_scores, load_scoring, scoring_windows
    from lookahead.core.config import load_section
    from lookahead.core.seeds import reseeded
    from lookahead.graph.predictor import PredictorConfig, load_init, load_predictor
    from lookahead.graph.runtime import recorded_skip
    from lookahead.graph.scoring import GeoLookup
    from lookahead.pipeline.phase1.config import Phase1Config
    from lookahead.pipeline.phase1.final import routed, scoring_set
    from lookahead.pipeline.phase1.module import Phase1Module
    from lookahead.pipeline.phase2.common import base_lm
    from lookahead.pipeline.phase2.score import final_batches
    from lookahead.pipeline.phase2.config import Phase2Config
    from lookahead.pipeline.phase2.control import ControlModule, StaticPruned
    from lookahead.pipeline.phase2.static_mask import static_mask
    from lookahead.pipeline.phase2.model import Phase2Model
    from lookahead.pipeline.phase2.module import Phase2Module

    models, data, params = path / "models", path / "data", path / "params.yaml"
    twins = sorted(p.name for p in (models / "phase1" / "twins").iterdir())
    assert twins == ["twin_seed0.safetensors", "twin_seed1.safetensors"]
    assert digest(models / "phase1" / "twins" / twins[0]) != digest(models / "phase1" / "predictor.safetensors")
    for stage, weights in (("phase2", "lm/model.safetensors"), ("control", "model.safetensors"),
                           ("static_control", "model.safetensors")):
        kept = sorted(p.name for p in (models / f"{stage}_seeds").iterdir())
        assert kept == ["seed1"], (stage, kept)
        assert digest(models / f"{stage}_seeds" / "seed1" / weights) != digest(models / stage / weights), stage

    def same(scored: dict, stage: str, keys: tuple[str, ...]) -> None:
        written = load_scores(data / "val_nll" / f"{stage}.safetensors")  # (seeds, P) each
        for key in keys:
            assert written[key].shape[0] == 2 and np.abs(scored[key] - written[key][1]).max() <= 1e-5, (stage, key)

    cfg, scoring = load_section(params, "phase2", Phase2Config), load_scoring(params)
    cache = ContextCache(data / "contexts")
    batches = final_batches(cfg, scoring, data / "tokens", cache, "cpu")
    lm = base_lm(models / "control_seeds" / "seed1")
    same(ControlModule(lm, cache, cfg).score(lm, batches), "control", ("dense",))
    mask = static_mask(data / "static_baselines", path / "metrics" / "phase2_pruning.json")
    lm = base_lm(models / "static_control_seeds" / "seed1")
    same(ControlModule(lm, cache, cfg, mask=mask).score(StaticPruned(lm, mask), batches), "static_control", ("dense", "hard"))
    tensors, _ = load_init(models / "init" / "init.safetensors")
    geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float())
    router, meta = load_predictor(models / "phase2_seeds" / "seed1" / "predictor.safetensors")
    model = Phase2Model(base_lm(models / "phase2_seeds" / "seed1" / "lm"), router, recorded_skip(meta))
    same(Phase2Module(model, cache, geo, reseeded(cfg, 1)).score(model, batches), "phase2", ("dense", "hard", "deployed"))

    cfg1 = reseeded(load_section(params, "phase1", Phase1Config), 1)
    base = AutoModelForCausalLM.from_pretrained(models / "base", dtype=torch.float32)
    importance = head_importance(data / "probe" / "heads.safetensors")
    windows = scoring_set(scoring, scoring_windows(data / "tokens", scoring, cache.context_length, cache=cache), cache,
                          load_section(params, "predictor", PredictorConfig).input, "cpu",
                          StaticBaselines(data / "static_baselines"))
    seed1 = json.loads((path / "metrics" / "phase1_report.json").read_text())["per_seed"][1]
    for file, twin in (("seeds/predictor_seed1.safetensors", False), ("twins/twin_seed1.safetensors", True)):
        router, meta = load_predictor(models / "phase1" / file)
        module = Phase1Module(router, base, cache, geo, importance, cfg1, meta["runtime"]["skip"], zero_inputs=twin)
        module.tau_now = cfg1.tau(cfg1.train.steps - 1)  # the last training step's, as the stage scored
        hard, _ = routed(module, router, windows)
        if twin:
            assert meta["static_twin"] and abs(hard.mean() - seed1["hard_nll"] - seed1["static_twin_gap"]) <= 1e-6
        else:
            same({"hard": hard}, "phase1", ("hard",))


def test_a_second_run_from_scratch_writes_the_same_bytes(repo, second_tiny_run, tiny_runs):
    """Bitwise on one machine (docs/reproducibility.md): the tiny pipeline run a second time from scratch, in
    another repository and at the same time as the first (so under load), writes the same bytes —
    every output of every stage: models, caches, reports, metrics and figures alike (timings go to
    metrics/<stage>_timing.json, which DVC does not track)."""
    first, second = (lock_outs(run.path, run.lock) for run in (tiny_runs["pipeline_repo"], tiny_runs["second_tiny_run"]))
    assert set(yaml.safe_load(tiny_runs["second_tiny_run"].lock)["stages"]) == set(STAGES)
    assert len(second) >= 2 * len(STAGES) and {p for p in second if first.get(p) != second[p]} == set()


RESOURCE = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//|@import[^;]*https?:|url\(\s*["']?\s*(?:https?:)?//""", re.I)


def browser() -> str:
    """The headless browser `make setup` installs (scripts/setup_browser.sh)."""
    for name in (os.environ.get("LOOKAHEAD_BROWSER"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise AssertionError("no chromium found: run `make setup` (scripts/setup_browser.sh installs Debian's chromium)")


def screenshot(page: Path, png: Path) -> np.ndarray:
    """Render ``page`` in headless Chromium with every non-loopback request refused (no network);
    return the RGB pixels."""
    import matplotlib.image

    subprocess.run(
        [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
         "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>", "--window-size=1000,1400",
         "--virtual-time-budget=15000", f"--user-data-dir={png.parent / 'chromium-profile'}",
         f"--screenshot={png}", page.as_uri()],
        capture_output=True, timeout=120, check=True,
    )
    return matplotlib.image.imread(png)[..., :3]


def drawn_pixels(rgb: np.ndarray) -> int:
    """Pixels of a coloured mark (chart lines and points; text and axes are grey)."""
    return int(((rgb.max(axis=-1) - rgb.min(axis=-1)) > 0.25).sum())


def test_plots_render_offline(repo):
    path, env = repo
    if not (path / "metrics" / "base_train.csv").is_file():
        sh(["dvc", "repro"], path, env)
    out = sh(["dvc", "plots", "show", "--json"], path, env)
    shown = json.loads(out)
    for plot in ("base_train.csv", "base_val.csv", "phase1_eval.csv", "phase1_pareto.csv", "phase1_layers.csv",
                 "diffusion_train.csv", "diffusion_samplers.csv", "phase2_eval.csv", "control_eval.csv", "modulator_alpha.csv",
                 "evaluate_pareto.csv", "evaluate_layers.csv"):
        assert f"metrics/{plot}" in json.dumps(shown), plot
    # the template `make setup` writes and .dvc/config names
    sh([sys.executable, "-m", "lookahead.tools.offline_html", ".dvc/offline_plots.html"], path, env)
    sh(["dvc", "plots", "show", "-o", "plots_html"], path, env)
    sh(["dvc", "plots", "diff", "HEAD", "-o", "diff_html"], path, env)
    # control: DVC's own page, whose scripts come from a CDN, is blank without a network
    stock = path / "stock_template.html"
    stock.write_text("<html><head>{scripts}</head><body>{plot_divs}</body></html>")
    sh(["dvc", "plots", "show", "--html-template", str(stock), "-o", "stock_html"], path, env)
    assert RESOURCE.search((path / "stock_html" / "index.html").read_text())  # the check sees CDN scripts
    assert drawn_pixels(screenshot(path / "stock_html" / "index.html", path / "stock.png")) < 50
    for page in ("plots_html", "diff_html"):
        html = (path / page / "index.html").read_text()
        assert not RESOURCE.search(html), RESOURCE.search(html)
        assert "vegaEmbed(" in html and "<script>" in html
    assert drawn_pixels(screenshot(path / "plots_html" / "index.html", path / "plots.png")) > 2000
    assert drawn_pixels(screenshot(path / "diff_html" / "index.html", path / "diff.png")) > 2000


def test_queued_experiments_land_in_the_same_mlflow_store(queued_experiments):
    path, env, _ = queued_experiments
    runs = stage_runs(path)
    for name, (assignment, rerun) in QUEUED_EXPERIMENTS.items():
        queued = [r for r in runs if r.data.tags.get("lookahead.pipeline_id") == name]
        # the parent run, and the stages the change reran (nothing upstream of them)
        assert {r.data.tags.get("lookahead.stage") for r in queued} == {None, *rerun}, name
        key, value = assignment.split("=")  # every rerun stage that reads the key logged its new value
        logged = {r.data.tags["lookahead.stage"]: r for r in queued
                  if f"{r.data.tags.get('lookahead.stage')}/{key}" in r.data.params}
        assert logged and all(r.data.params[f"{stage}/{key}"] == value and r.data.metrics
                              for stage, r in logged.items()), name
    (phase2,) = [r for r in runs if r.data.tags.get("lookahead.pipeline_id") == "connectivity-both"
                 and r.data.tags.get("lookahead.stage") == "phase2"]
    (scored,) = [r for r in runs if r.data.tags.get("lookahead.pipeline_id") == "connectivity-both"
                 and r.data.tags.get("lookahead.stage") == "score_phase2"]
    assert "hard_nll" in phase2.data.metrics  # the training's curve; its scoring run holds each stage's report
    # the connectivity's weights trained (the default adds none)
    assert scored.data.metrics["phase2.parameters_added"] > 0 and "phase2.hard_nll" in scored.data.metrics
    # nothing was written inside DVC's temporary workspace
    assert not list((path / ".dvc" / "tmp").rglob("mlflow.db"))
    shown = sh(["dvc", "exp", "show", "--json"], path, env)
    assert all(name in shown for name in QUEUED_EXPERIMENTS) and "hard_nll" in shown
