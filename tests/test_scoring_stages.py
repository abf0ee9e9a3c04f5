"""The scoring stages read back what the training stages wrote and score it as the trained models in
memory score (lookahead.pipeline.phase1.score, lookahead.pipeline.phase2.score): every figure and
every per-position NLL the same, for phase 1's routers and static twins over seeds, and for phase
2's LM with each of its additions (connectivity, value residual, an adapter merged into the LM)
and both controls; a training report of another seed count is refused, naming the key."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.static_baselines import StaticBaselines
from lookahead.artifacts.val_scores import ScoringConfig, WindowsConfig, load_scores, scoring_windows
from lookahead.core.config import from_dict
from lookahead.core.errors import ConfigError
from lookahead.core.report import write_report
from lookahead.graph.predictor import PredictorConfig, load_init
from lookahead.graph.runtime import RuntimeConfig
from lookahead.graph.scoring import GeoLookup
from lookahead.pipeline.phase1.build import train_phase1_seeds
from lookahead.pipeline.phase1.config import Phase1Config, ScoringKeys
from lookahead.pipeline.phase1.final import scoring_set
from lookahead.pipeline.phase1.run import build_phase1
from lookahead.pipeline.phase1.score import SEEDED, score_phase1_seeds, scoring_config
from lookahead.pipeline.phase2.build import train_phase2
from lookahead.pipeline.phase2.score import final_batches, final_label
from lookahead.pipeline.phase2.config import Phase2Config
from lookahead.pipeline.phase2.control import ControlModule, train_control
from lookahead.pipeline.phase2.module import Phase2Module
from lookahead.pipeline.phase2.score import control_model, load_phase2_model, score_control, score_phase2
from lookahead.pipeline.phase2.static_mask import mask_at
from lookahead.train.loop import TrainConfig
from tests.test_phase2 import lm_router


def test_score_phase1_scores_the_files_phase1_wrote_as_the_routers_in_memory(phase_inputs, tmp_path):
    """Two seeds with their static twins, trained by the ``phase1`` stage's function and scored by
    ``score_phase1``'s from the files: seed 0's figures equal those of the same router trained and
    scored in one process (bit for bit), the seeds' per-position NLLs are saved, and the config the
    scoring stage reads is the router's, with its own keys from params."""
    i = phase_inputs
    cfg = Phase1Config(seeds=2, eval_batch_size=2, oracle="greedy", static_twin=True, random_draws=2,
                       score_candidates=None,  # the oracle stage's search, which training's own scoring runs
                       train=TrainConfig(steps=3, batch_size=2, lr=1e-2, warmup_steps=1, eval_every=3, device="cpu"))
    pcfg = PredictorConfig(rank=2, hidden=8, gate="head", budget="topk", keep=0.5, input="lm")
    runtime, scoring_cfg = RuntimeConfig(skip="query"), ScoringConfig(roles=WindowsConfig(per_role=4), batch_size=2, resamples=200)
    router = tmp_path / "predictor.safetensors"
    training, _, _ = train_phase1_seeds(cfg, pcfg, i["base"], i["contexts"], i["init"], i["heads"], router,
                                        tmp_path / "seeds", tmp_path / "twins", runtime_cfg=runtime)
    assert sorted(p.name for p in (tmp_path / "twins").iterdir()) == ["twin_seed0.safetensors", "twin_seed1.safetensors"]
    written = write_report(training, tmp_path / "training.json")
    assert "train_tokens_per_s" not in written["per_seed"][0]  # a timing: beside the report, not in it
    assert json.loads((tmp_path / "training_timing.json").read_text())["per_seed"][0]["train_tokens_per_s"] > 0

    read, training_read = scoring_config(router, ScoringKeys(random_draws=5, oracle="greedy", score_candidates=None), tmp_path / "training.json")
    assert read == dataclasses.replace(cfg, random_draws=5)  # the router's config, the scoring keys from params
    read = dataclasses.replace(read, random_draws=2, score_static_curve=True)  # and the frontier's static curve
    report = score_phase1_seeds(read, i["base"], i["contexts"], i["init"], i["heads"], router, tmp_path / "seeds",
                                tmp_path / "twins", training_read, scoring_cfg, i["tokens"],
                                scores_file=tmp_path / "scores.safetensors", static_dir=i["static_baselines"])

    cache = ContextCache(i["contexts"])
    scoring = scoring_set(scoring_cfg, scoring_windows(i["tokens"], scoring_cfg, cache.context_length, cache=cache), cache,
                          "lm", "cpu", StaticBaselines(i["static_baselines"]))
    memory, _, _ = build_phase1(cfg, pcfg, i["base"], i["contexts"], i["init"], i["heads"], tmp_path / "again.safetensors",
                                runtime_cfg=runtime, scoring=scoring)
    assert (tmp_path / "again.safetensors").read_bytes() == router.read_bytes()  # the same training
    tokens = memory.pop("token_nll")
    memory.pop("train_tokens_per_s")
    assert report["primary"] == {k: memory[k] for k in SEEDED}
    assert {k: report[k] for k in memory if k not in SEEDED} == {k: v for k, v in memory.items() if k not in SEEDED}
    scores = load_scores(tmp_path / "scores.safetensors")
    for key, values in tokens.items():  # dense once, the rest per seed (as the file stores them: float32)
        saved = scores[key] if key == "dense" else scores[key][0]
        np.testing.assert_array_equal(saved, values.astype(np.float32).astype(saved.dtype))
    # the static curve: the stronger mask at every whole count of the 2 x 2 heads, its own forward at each;
    # at the router's count (2) the static pruning its claims compare with, at every head the dense LM
    assert sorted(k for k in scores if k.startswith("static_heads_")) == [f"static_heads_{k}" for k in range(1, 5)]
    np.testing.assert_array_equal(scores["static_heads_2"], scores["static"][0])
    np.testing.assert_allclose(scores["static_heads_4"], scores["dense"], atol=1e-5)
    assert not np.allclose(scores["static_heads_1"], scores["static_heads_2"])
    assert scores["hard"].shape[0] == 2 and (tmp_path / "seeds" / "predictor_seed1.safetensors").read_bytes() != router.read_bytes()
    assert report["per_seed"][1]["hard_nll"] == pytest.approx(float(scores["hard"][1].mean()), rel=1e-6)  # seed 1's own file

    with pytest.raises(ConfigError, match="seeds"):  # a training report of another run: refused before any work
        score_phase1_seeds(read, i["base"], i["contexts"], i["init"], i["heads"], router, tmp_path / "seeds",
                           tmp_path / "twins", {"per_seed": training_read["per_seed"][:1]}, scoring_cfg, i["tokens"])


def _phase2_cfg(**changes) -> Phase2Config:
    return from_dict(Phase2Config, {
        "windows": "stream", "eval_batch_size": 2, "connectivity_lr_scale": 30, **changes,
        "train": {"steps": 2, "batch_size": 2, "lr": 1e-3, "warmup_steps": 1, "eval_every": 2, "log_every": 1,
                  "checkpoint_every": 0, "device": "cpu"}})


def _same(a: dict, b: dict) -> None:
    """Two seed reports equal, per-position NLLs bit for bit."""
    ta, tb = a.pop("token_nll"), b.pop("token_nll")
    assert ta.keys() == tb.keys() and all(np.array_equal(ta[k], tb[k]) for k in ta)
    assert a == b


@pytest.mark.parametrize("changes", [{"shared_heads": 1}, {"keep": 1.0, "connectivity": "both", "train_lm": False},
                                     {"keep": 1.0, "value_residual": True, "adapter": "lora", "train_lm": False}],
                         ids=["router", "connectivity", "value-residual-and-adapter"])
def test_score_phase2_scores_the_saved_phase2_model_as_the_trained_one(downstream_inputs, tmp_path, changes):
    """Phase 2's saved directory read back (its LM with the adapter merged, its router, connectivity and
    value residual, and the frozen LM its dense figures read where its own is changed by them)
    scores as the model that training left in memory."""
    i = downstream_inputs
    router = lm_router(i, tmp_path / "router.safetensors")
    cfg = _phase2_cfg(**changes)
    training, _, module = train_phase2(cfg, i["base"], i["tokens"], i["contexts"], i["init"], router, i["diffusion"],
                                       tmp_path / "out", heads_file=i["heads"])
    scoring = ScoringConfig(roles=WindowsConfig(per_role=4), batch_size=2)
    batches = final_batches(cfg, scoring, i["tokens"], module.cache, "cpu")
    label = final_label(cfg, scoring, i["tokens"], module.cache)
    memory = score_phase2(training, module, batches, label)

    model, read_cfg, sampler = load_phase2_model(tmp_path / "out", i["base"], router, i["diffusion"])
    assert read_cfg == cfg and sampler is None
    tensors, _ = load_init(i["init"])
    geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float())
    read = Phase2Module(model, module.cache, geo, read_cfg, sampler)
    read.place("cpu")
    from_files = score_phase2(training, read, batches, label)
    assert (from_files["connectivity_weights"] is not None) == (cfg.connectivity != "none")
    _same(from_files, memory)


@pytest.mark.parametrize("static", [False, True], ids=["control", "static-control"])
def test_score_phase2_scores_a_saved_control_as_the_trained_one(downstream_inputs, tmp_path, static):
    i = downstream_inputs
    cfg = _phase2_cfg()
    mask = mask_at(i["static_baselines"], 0.5, "query") if static else None
    stage = "static_control" if static else "control"
    training, _, module = train_control(cfg, i["base"], i["tokens"], i["contexts"], tmp_path / "out", mask=mask)
    scoring = ScoringConfig(roles=WindowsConfig(per_role=4), batch_size=2)
    batches = final_batches(cfg, scoring, i["tokens"], module.cache, "cpu")
    label = final_label(cfg, scoring, i["tokens"], module.cache)
    memory = score_control(training, module, batches, label)

    lm, read_cfg, read_mask = control_model(tmp_path / "out", stage, i["static_baselines"])
    assert (read_mask is not None) == static and read_cfg.train == cfg.train and read_cfg.windows == cfg.windows
    if static:
        assert read_mask.heads() == mask.heads() and read_mask.skip == "query" and read_mask.source == mask.source
    _same(score_control(training, ControlModule(lm, module.cache, read_cfg, mask=read_mask), batches, label), memory)


def test_the_scoring_keys_of_phase1_leave_what_training_saves_alone_and_set_the_scoring_oracle():
    """``phase1.random_draws`` and the scoring oracle's search are ``score_phase1``'s: the training stage
    trains and saves with them at their defaults (its files never depend on a key DVC does not rerun it
    for), and the scoring oracle searches as the oracle stage did where they are null, as they say otherwise
    (by default the lazy search, 8 candidates a round)."""
    from lookahead.core.config import to_dict
    from lookahead.pipeline.phase1.config import without_scoring
    from lookahead.pipeline.phase1.score import scoring_search

    cfg = Phase1Config(random_draws=7, score_per_round=2, score_candidates=4, lambda_edge=0.5)
    trained = without_scoring(cfg)
    assert to_dict(trained) == to_dict(Phase1Config(lambda_edge=0.5))  # the defaults omitted: the same bytes
    oracle_stage = {"per_round": 1, "candidates": 3}  # the oracle stage's search
    null = dataclasses.replace(cfg, score_per_round=None, score_candidates=None)
    assert scoring_search(oracle_stage, null) == oracle_stage and scoring_search({}, null) == {}
    assert scoring_search(oracle_stage, cfg) == {"per_round": 2, "candidates": 4}
    assert scoring_search({}, Phase1Config()) == {"candidates": 8}
    assert scoring_search({}, Phase1Config(score_candidates=0)) == {"candidates": 0}
    for key, value in (("score_per_round", 0), ("score_candidates", -1)):
        with pytest.raises(ConfigError, match=key):
            Phase1Config(**{key: value})
        with pytest.raises(ConfigError, match=key):
            ScoringKeys(**{key: value})
