"""Phase 2: the dense control is plain AdamW on the phase's own windows; the predictor's learning-rate
scale is what it claims; the stage's figures are those of the models it saves."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.phase2 import LM_DIR, PREDICTOR_FILE, Phase2OutputError, load_phase2
from lookahead.core.config import from_dict
from lookahead.core.errors import ConfigError
from lookahead.core.seeds import one_run
from lookahead.graph.predictor import PredictorConfig, StructurePredictor, load_init, load_predictor
from lookahead.graph.runtime import forward_with_topology
from lookahead.graph.scoring import GeoLookup
from lookahead.lm.nll import token_nll
from lookahead.pipeline.phase2.build import (
    HEADLINE,
    Phase2Model,
    Phase2Module,
    build_phase2,
    plain_parameters,
    scale_learning_rate,
)
from lookahead.pipeline.phase2.config import Phase2Config
from lookahead.pipeline.phase2.control import CONTROL_HEADLINE, ControlModule
from lookahead.train.data import load_stream


def val_nll(lm, cache: ContextCache, topology=None) -> float:
    windows, contexts = cache.batch("val", np.arange(len(cache.windows("val"))))
    ids = windows[:, :-1]
    with torch.no_grad():
        if topology is None:
            logits = lm(input_ids=ids).logits
        else:
            adjacency, gates = topology(ids, contexts)
            logits = forward_with_topology(lm, ids, adjacency, gates, hard=True)
    return token_nll(logits, windows[:, 1:]).mean().item()


def test_control_is_plain_adamw_on_the_same_windows_as_the_joint_run(phase2_run, downstream_inputs):
    cfg = phase2_run["cfg"]
    cache = ContextCache(downstream_inputs["contexts"])
    geo = GeoLookup(torch.zeros(1, 1), torch.zeros(1))
    stream = load_stream(downstream_inputs["tokens"], "train")
    joint = Phase2Module(Phase2Model(None, None), cache, geo, cfg, stream=stream)
    control = ControlModule(None, cache, cfg, stream)
    for step in range(cfg.train.steps):  # equal tokens, same order
        assert torch.equal(joint.batch(step)["windows"], control.batch(step)["windows"])
        assert torch.equal(joint.batch(step)["replay"], control.batch(step)["replay"])

    # the reference: torch's AdamW, warmup then cosine written out, on those windows, from the base LM
    t = cfg.train
    lm = AutoModelForCausalLM.from_pretrained(downstream_inputs["base"], dtype=torch.float32).train()
    decay = [p for p in lm.parameters() if p.ndim >= 2]
    rest = [p for p in lm.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=t.lr, betas=(t.beta1, t.beta2))
    for step in range(t.steps):
        if step < t.warmup_steps:
            factor = (step + 1) / t.warmup_steps
        else:
            progress = (step - t.warmup_steps) / (t.steps - t.warmup_steps)
            factor = t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        for group in opt.param_groups:
            group["lr"] = t.lr * factor
        batch = control.batch(step)
        loss = sum(token_nll(lm(input_ids=w[:, :-1]).logits, w[:, 1:]).mean() for w in (batch["windows"], batch["replay"])) / 2
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), t.grad_clip)
        opt.step()
        opt.zero_grad()
    saved = AutoModelForCausalLM.from_pretrained(phase2_run["control_dir"], dtype=torch.float32)
    ref = dict(lm.named_parameters())
    for name, p in saved.named_parameters():
        torch.testing.assert_close(p, ref[name], rtol=1e-5, atol=1e-6)
    control = phase2_run["control"]
    assert one_run(CONTROL_HEADLINE) <= set(control)
    assert control["val_nll"] == pytest.approx(val_nll(saved.eval(), cache), rel=1e-5)
    assert control["train_tokens"] == phase2_run["report"]["train_tokens"]  # equal tokens


def test_predictor_learning_rate_scale_is_c_times_the_lm_step(phase_inputs, seed):
    cache = ContextCache(phase_inputs["contexts"])
    predictor = StructurePredictor.from_init(PredictorConfig.cascade(rank=2, hidden=8), phase_inputs["init"], cache.dim)
    torch.nn.init.normal_(predictor.to_v.weight, std=0.5)  # every parameter gets a gradient
    contexts = torch.randn(3, cache.dim)
    geo = torch.randn(3, predictor.geo_dim)
    before = {k: v.clone() for k, v in predictor.state_dict().items()}
    z = predictor.logits(contexts, geo)
    scale_learning_rate(predictor, 30.0)
    torch.testing.assert_close(predictor.logits(contexts, geo), z)  # the same function
    lr = 1e-4
    opt = torch.optim.AdamW(predictor.parameters(), lr=lr, weight_decay=0.0)
    predictor.logits(contexts, geo).sum().backward()
    grads = {name: p.grad.clone() for name, p in predictor.named_parameters()}
    opt.step()
    plain_parameters(predictor)
    after = predictor.state_dict()
    assert set(after) == set(before)  # plain keys again, ready to save
    for name, theta_grad in grads.items():
        key = name.replace("parametrizations.", "").replace(".original", "")
        moved = theta_grad.abs() > 1e-3  # Adam's first step is lr · sign(g) where |g| >> eps
        assert moved.any(), key
        # p = 30 θ: a first Adam step of lr on θ moves p by 30 · lr
        torch.testing.assert_close((after[key] - before[key])[moved], -30 * lr * theta_grad.sign()[moved],
                                   rtol=1e-3, atol=1e-7)


def test_stage_figures_are_those_of_the_saved_models(phase2_run, downstream_inputs):
    cfg, report, result, out, d = (phase2_run[k] for k in ("cfg", "report", "result", "out", "root"))
    assert one_run(HEADLINE) <= set(report)
    cache = ContextCache(downstream_inputs["contexts"])
    tensors, _ = load_init(downstream_inputs["init"])
    geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float())
    base = AutoModelForCausalLM.from_pretrained(downstream_inputs["base"], dtype=torch.float32).eval()
    lm = AutoModelForCausalLM.from_pretrained(out / LM_DIR, dtype=torch.float32).eval()
    predictor, meta = load_predictor(out / PREDICTOR_FILE)
    phase1, _ = load_predictor(downstream_inputs["predictor"])

    def topology_of(p):
        return lambda ids, contexts: p(contexts, geo(ids), hard=True)

    assert report["base_val_nll"] == pytest.approx(val_nll(base, cache), rel=1e-5)
    assert report["dense_nll"] == pytest.approx(val_nll(lm, cache), rel=1e-5)
    assert report["hard_nll"] == pytest.approx(val_nll(lm, cache, topology_of(predictor)), rel=1e-5)
    assert report["start_hard_nll"] == pytest.approx(val_nll(base, cache, topology_of(phase1)), rel=1e-5)
    assert report["passes_over_cache"] == pytest.approx(3 * 2 / len(cache.windows("train")))
    assert report["train_tokens"] == 3 * 2 * cache.context_length * 2  # half of each step is replay
    assert meta["phase2"]["predictor_lr_scale"] == cfg.predictor_lr_scale
    assert not torch.equal(predictor.static, phase1.static)  # the predictor trained too
    assert load_phase2(out)["decoder"] == "mlp"
    assert [r["step"] for r in result.eval_curve] == [0, 2, 3]
    assert not any((d / "ckpt").rglob("checkpoint.pt"))  # removed after success


def test_diffusion_decoder_trains_the_lm_on_sampled_topologies(downstream_inputs, phase2_run, tmp_path):
    cfg = phase2_run["cfg"]
    cfg = dataclasses.replace(cfg, decoder="diffusion", train=dataclasses.replace(cfg.train, steps=2, eval_every=2))
    i = downstream_inputs
    report, _ = build_phase2(cfg, i["base"], i["tokens"], i["contexts"], i["init"], i["predictor"], i["diffusion"],
                             tmp_path / "out")
    assert report["decoder"] == "diffusion" and report["soft_nll"] is None
    assert not (tmp_path / "out" / PREDICTOR_FILE).exists()
    assert 0.0 < report["active_head_fraction"] <= 1.0
    base = AutoModelForCausalLM.from_pretrained(i["base"], dtype=torch.float32)
    lm = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / LM_DIR, dtype=torch.float32)
    assert not torch.equal(lm.model.layers[0].self_attn.q_proj.weight, base.model.layers[0].self_attn.q_proj.weight)


def test_config_and_inputs_are_checked_with_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="decoder"):
        from_dict(Phase2Config, {"decoder": "transformer"})
    with pytest.raises(ConfigError, match="predictor_lr_scale"):
        from_dict(Phase2Config, {"predictor_lr_scale": 0})
    with pytest.raises(ConfigError, match="hard_from_step"):
        from_dict(Phase2Config, {"hard_from_step": 5, "train": {"steps": 5}})
    with pytest.raises(Phase2OutputError, match="dvc repro phase2"):
        load_phase2(tmp_path)
