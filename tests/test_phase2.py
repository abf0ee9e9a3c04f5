"""Phase 2: the dense control is plain AdamW on the phase's own windows; the predictor's learning-rate
scale is what it claims; the stage's figures are those of the models it saves; stream windows are
fresh slices of the train stream shared by all three runs; distillation is the mixed KL; the static
control trains under the most important heads at phase 2's fraction (checked by the plain reference)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.phase2 import LM_DIR, PREDICTOR_FILE, Phase2OutputError, load_phase2
from lookahead.artifacts.val_scores import ScoringConfig, WindowsConfig, scoring_windows
from lookahead.core.config import from_dict
from lookahead.core.errors import ConfigError
from lookahead.core.seeds import one_run
from lookahead.graph.predictor import PredictorConfig, StructurePredictor, load_init, load_predictor, save_predictor
from lookahead.graph.runtime import forward_with_topology
from lookahead.graph.scoring import GeoLookup
from lookahead.lm.nll import token_nll
from lookahead.pipeline.phase2.run import build_phase2
from lookahead.pipeline.phase2.score import CONTROL_HEADLINE, HEADLINE, STATIC_HEADLINE
from lookahead.pipeline.phase2.common import Phase2Error
from lookahead.pipeline.phase2.config import Phase2Config
from lookahead.pipeline.phase2.control import ControlModule, StaticMask
from lookahead.pipeline.phase2.static_mask import static_mask
from lookahead.pipeline.phase2.model import Phase2Model, plain_parameters, scale_learning_rate
from lookahead.pipeline.phase2.module import Phase2Module
from lookahead.train.data import load_stream
from tests.reference_head_graph import reference_forward


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
        from_dict(Phase2Config, {"predictor_lr_scale": -1})
    with pytest.raises(ConfigError, match="hard_from_step"):
        from_dict(Phase2Config, {"hard_from_step": 5, "train": {"steps": 5}})
    with pytest.raises(Phase2OutputError, match="dvc repro phase2"):
        load_phase2(tmp_path)


# ------------------------------------------------------------------ stream windows and the controls

def lm_router(phase_inputs, path, skip: str = "query"):
    """A head-gate router reading the LM's own states (``predictor.input: lm``, top-K at half the heads),
    its weights random enough that the heads it keeps change from token to token; saved under ``skip``."""
    from lookahead.graph.router_inputs import input_dim

    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"], dtype=torch.float32)
    cache = ContextCache(phase_inputs["contexts"])
    torch.manual_seed(5)
    cfg = PredictorConfig(rank=2, hidden=8, gate="head", budget="topk", keep=0.5, input="lm", geo_features=False)
    predictor = StructurePredictor(cfg, lm.config.num_hidden_layers, lm.config.num_attention_heads,
                                   input_dim("lm", cache.dim, lm.config.hidden_size))
    torch.nn.init.normal_(predictor.to_gate.weight, std=3.0)
    save_predictor(predictor, path, extra={"runtime": {"skip": skip}})
    return path


@pytest.fixture(scope="module")
def stream_run(downstream_inputs, tmp_path_factory):
    """Phase 2 on fresh windows of the train stream with a frozen ``lm`` router, distilling from the base,
    the most important head shared (on at every token)."""
    d = tmp_path_factory.mktemp("stream")
    i = downstream_inputs
    router = lm_router(i, d / "router.safetensors")
    cfg = from_dict(Phase2Config, {
        "windows": "stream", "predictor_lr_scale": 0, "distill": 0.5, "shared_heads": 1, "eval_batch_size": 2,
        "train": {"steps": 2, "batch_size": 2, "lr": 1e-3, "warmup_steps": 1, "eval_every": 2, "log_every": 1,
                  "checkpoint_every": 0, "device": "cpu"}})
    report, result = build_phase2(cfg, i["base"], i["tokens"], i["contexts"], i["init"], router, i["diffusion"], d / "out",
                                  heads_file=i["heads"], scoring=ScoringConfig(roles=WindowsConfig(per_role=8), batch_size=4))
    return {"cfg": cfg, "report": report, "result": result, "out": d / "out", "router": router}


def test_phase2_in_full_skip_trains_and_scores_as_the_router_ran_and_counts_the_keys_that_exist(downstream_inputs,
                                                                                                 tmp_path):
    """A router trained under ``runtime.skip: full`` (no query, key or value for an off head at that
    token): phase 2 takes the mode from its file, its hard NLL is the plain reference's in full skip on
    the LM it trained, and its deployed forward's MACs are counted from the gates the deployed router
    chose: a head's keys are the positions it ran at, so the count is below query skip's."""
    from lookahead.graph.cost import gate_macs
    from lookahead.graph.deployed import Router, self_consistent
    from lookahead.graph.router_inputs import router_context

    i = downstream_inputs
    router = lm_router(i, tmp_path / "router.safetensors", skip="full")
    cfg = from_dict(Phase2Config, {
        "windows": "stream", "predictor_lr_scale": 0, "eval_batch_size": 2,
        "train": {"steps": 2, "batch_size": 2, "lr": 1e-3, "warmup_steps": 1, "eval_every": 2, "log_every": 1,
                  "checkpoint_every": 0, "device": "cpu"}})
    report, _ = build_phase2(cfg, i["base"], i["tokens"], i["contexts"], i["init"], router, i["diffusion"], tmp_path / "out",
                             heads_file=i["heads"], scoring=ScoringConfig(roles=WindowsConfig(per_role=4), batch_size=4))
    assert load_phase2(tmp_path / "out")["skip"] == "full"
    lm = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / LM_DIR, dtype=torch.float32).eval()
    predictor, _ = load_predictor(tmp_path / "out" / PREDICTOR_FILE)
    cache = ContextCache(i["contexts"])
    windows = scoring_windows(i["tokens"], ScoringConfig(roles=WindowsConfig(per_role=4)), cache.context_length, cache=cache)
    ids = windows[:, :-1]
    with torch.no_grad():
        adjacency, gates = predictor.eval()(router_context("lm", lm, ids, None), None, hard=True)
        reference = token_nll(reference_forward(lm, ids, adjacency, gates, skip="full"), windows[:, 1:])
        _, deployed = self_consistent(lm, Router(predictor, lm, None), ids, "full")
    np.testing.assert_allclose(report["token_nll"]["hard"], reference.flatten().numpy(), rtol=1e-4, atol=1e-5)
    on = deployed[..., 1:].reshape(*ids.shape, 2, 2) > 0
    np.testing.assert_allclose(report["token_nll"]["deployed_macs"], gate_macs(lm.config, on, "full").flatten().numpy())
    assert (report["token_nll"]["deployed_macs"] < gate_macs(lm.config, on, "query").flatten().numpy()).mean() > 0.5


def test_stream_windows_are_fresh_slices_of_the_train_stream_in_all_three_runs(stream_run, downstream_inputs):
    cfg = stream_run["cfg"]
    cache = ContextCache(downstream_inputs["contexts"])
    geo = GeoLookup(torch.zeros(1, 1), torch.zeros(1))
    stream = load_stream(downstream_inputs["tokens"], "train")
    mask = StaticMask(torch.tensor([[0.3, 0.1], [0.05, 0.2]]), 0.5, "query")
    runs = [Phase2Module(Phase2Model(None, None), cache, geo, cfg, stream=stream), ControlModule(None, cache, cfg, stream),
            ControlModule(None, cache, cfg, stream, mask)]
    text = np.asarray(stream)
    seen = set()
    for step in range(6):
        batches = [run.batch(step) for run in runs]
        assert "contexts" not in batches[0] and "replay" not in batches[0]
        windows = batches[0]["windows"]
        for other in batches[1:]:
            assert torch.equal(other["windows"], windows)  # equal tokens, same order
        assert windows.shape == (cfg.train.batch_size, cache.context_length + 1)
        for row in windows.numpy():  # a contiguous slice of the stream (found by a plain scan)
            starts = np.flatnonzero(text[: len(text) - len(row) + 1] == row[0])
            assert any(np.array_equal(text[s : s + len(row)], row) for s in starts)
            seen.add(row.tobytes())
    assert len(seen) == 6 * cfg.train.batch_size  # fresh windows every step


def test_a_frozen_router_on_the_stream_keeps_its_weights_and_the_figures_are_the_saved_models(stream_run,
                                                                                             downstream_inputs):
    from lookahead.graph.router_inputs import router_context

    report, out = stream_run["report"], stream_run["out"]
    before, _ = load_predictor(stream_run["router"])
    after, meta = load_predictor(out / PREDICTOR_FILE)
    for key, value in before.state_dict().items():
        assert torch.equal(after.state_dict()[key], value), key  # predictor_lr_scale 0: frozen
    assert meta["runtime"]["skip"] == "query"
    assert meta["predictor"]["always_on"] == [0] and before.cfg.always_on == []  # importance [[0.3, 0.1], [0.05, 0.2]]
    stream = load_stream(downstream_inputs["tokens"], "train")
    cache = ContextCache(downstream_inputs["contexts"])
    assert report["train_tokens"] == 2 * 2 * cache.context_length and report["passes_over_cache"] is None
    assert report["passes_over_stream"] == pytest.approx(report["train_tokens"] / len(stream))
    assert {"nll", "kl"} <= set(stream_run["result"].train_curve[0])  # distill 0.5: the KL is trained on
    lm = AutoModelForCausalLM.from_pretrained(out / LM_DIR, dtype=torch.float32).eval()
    windows = scoring_windows(downstream_inputs["tokens"], ScoringConfig(roles=WindowsConfig(per_role=8)), cache.context_length,
                              cache=cache)
    assert report["scored_positions"] == 8 * cache.context_length  # the scoring set, not the cache's val windows
    ids = windows[:, :-1]
    with torch.no_grad():
        adjacency, gates = after.eval()(router_context("lm", lm, ids, None), None, hard=True)
        logits = reference_forward(lm, ids, adjacency, gates, skip="query")  # the plain reference
    reference = token_nll(logits, windows[:, 1:])
    assert report["hard_nll"] == pytest.approx(reference.mean().item(), rel=1e-5)
    np.testing.assert_allclose(report["token_nll"]["hard"], reference.flatten().numpy(), rtol=1e-4, atol=1e-5)
    assert (gates[..., 1] == 1).all() and (gates[..., 1:].sum(-1) == 2).all()  # the shared head, and one routed
    # as deployed: the router reads the routed model's own states; at t = 0 both read zeros (the same NLL)
    deployed = report["token_nll"]["deployed"].reshape(8, -1)
    np.testing.assert_allclose(deployed[:, 0], reference.numpy()[:, 0], rtol=1e-4, atol=1e-5)
    assert report["deployed_nll"] == pytest.approx(deployed.mean()) and np.isfinite(deployed).all()
    # its MACs as its gates ran: 2 of the 4 heads at every position, every key kept (query skip): position t
    # costs the closed form at t + 1 keys, and the router's own MACs come on top of the mean
    from lookahead.graph.cost import macs_per_token, router_macs

    length = ids.shape[1]
    per_position = np.array([macs_per_token(lm.config, t + 1, 0.5, "query") for t in range(length)])
    np.testing.assert_allclose(report["token_nll"]["deployed_macs"].reshape(8, -1), np.tile(per_position, (8, 1)), rtol=1e-6)
    dense = macs_per_token(lm.config, (length + 1) / 2, 1.0, "query")
    assert report["deployed_macs_over_dense"] == pytest.approx((per_position.mean() + router_macs(after)) / dense)
    assert report["active_head_fraction"] == pytest.approx(0.5)
    assert load_phase2(out)["active_head_fraction"] == pytest.approx(0.5) and load_phase2(out)["skip"] == "query"


def test_distillation_mixes_the_nll_with_the_kl_from_the_frozen_base(seed):
    from lookahead.pipeline.phase2.common import routed_loss

    class Teacher(torch.nn.Module):
        def __init__(self, logits):
            super().__init__()
            self.out = logits

        def forward(self, input_ids):
            return type("Out", (), {"logits": self.out})()

    logits, ref = torch.randn(2, 5, 7), torch.randn(2, 5, 7)
    targets = torch.randint(0, 7, (2, 5))
    nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    kl = torch.nn.functional.kl_div(logits.log_softmax(-1), ref.log_softmax(-1), log_target=True,
                                    reduction="none").sum(-1).mean()
    parts: dict = {}
    got = routed_loss(logits, targets, Teacher(ref), targets, 0.25, parts)
    torch.testing.assert_close(got, 0.75 * nll + 0.25 * kl)
    assert parts["kl"] == pytest.approx(kl.item(), rel=1e-5)
    assert routed_loss(logits, targets, None, targets, 0.25, {}) == pytest.approx(nll.item())  # no teacher: NLL
    assert routed_loss(logits, targets, Teacher(logits), targets, 1.0, {}).abs() < 1e-6  # KL to itself
    # top-k: the KL of the two distributions coarsened to the teacher's k words + one tail bucket,
    # written out from probabilities; the full vocabulary's k equals the whole KL; never above it
    k = 3
    p, q = ref.softmax(-1), logits.softmax(-1)
    index = p.topk(k, -1).indices
    pk, qk = p.gather(-1, index), q.gather(-1, index)
    pc = torch.cat([pk, 1 - pk.sum(-1, keepdim=True)], -1)
    qc = torch.cat([qk, 1 - qk.sum(-1, keepdim=True)], -1)
    coarse = (pc * (pc / qc).log()).sum(-1).mean()
    parts = {}
    got = routed_loss(logits, targets, Teacher(ref), targets, 0.25, parts, top_k=k)
    torch.testing.assert_close(got, 0.75 * nll + 0.25 * coarse)
    assert parts["kl"] <= kl.item() + 1e-6
    full = routed_loss(logits, targets, Teacher(ref), targets, 1.0, {}, top_k=7)
    torch.testing.assert_close(full, kl, rtol=1e-4, atol=1e-5)
    with pytest.raises(ConfigError, match="distill_top_k"):
        from_dict(Phase2Config, {"distill_top_k": -1})


def test_static_control_trains_under_the_most_important_heads_at_phase2s_fraction(phase2_run, downstream_inputs):
    static, control = phase2_run["static_control"], phase2_run["control"]
    assert one_run(STATIC_HEADLINE) <= set(static)
    fraction = phase2_run["report"]["active_head_fraction"]
    importance = np.array([0.3, 0.1, 0.05, 0.2])  # the tiny inputs' probe importance, node order
    k = round(fraction * 4)
    assert static["heads"] == sorted(np.argsort(-importance, kind="stable")[:k].tolist())
    assert static["active_head_fraction"] == k / 4 and static["train_tokens"] == control["train_tokens"]
    gates = torch.zeros(5)
    gates[0] = 1
    gates[1 + torch.tensor(static["heads"], dtype=torch.long)] = 1
    layer = torch.tensor([-1, 0, 0, 1, 1])
    adjacency = ((layer[:, None] < layer[None, :]) & (gates[:, None] > 0) & (gates[None, :] > 0)).float()
    cache = ContextCache(downstream_inputs["contexts"])
    windows = torch.from_numpy(cache.windows("val").astype(np.int64))
    for key, path in (("val_nll", phase2_run["static_control_dir"]), ("start_val_nll", downstream_inputs["base"])):
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        logits = reference_forward(lm, windows[:, :-1], adjacency, gates, skip="full")
        assert static[key] == pytest.approx(token_nll(logits, windows[:, 1:]).mean().item(), rel=1e-5), key
    saved = AutoModelForCausalLM.from_pretrained(phase2_run["static_control_dir"], dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(downstream_inputs["base"], dtype=torch.float32)
    assert not torch.equal(saved.model.layers[0].mlp.up_proj.weight, base.model.layers[0].mlp.up_proj.weight)


def test_stream_and_static_control_inputs_are_refused_with_the_fix(downstream_inputs, tmp_path):
    i = downstream_inputs
    with pytest.raises(ConfigError, match="windows"):
        from_dict(Phase2Config, {"decoder": "diffusion", "windows": "stream"})
    with pytest.raises(ConfigError, match="distill"):
        from_dict(Phase2Config, {"distill": 1.5})
    cfg = from_dict(Phase2Config, {"windows": "stream", "shared_heads": 0, "train": {"steps": 1, "device": "cpu"}})
    with pytest.raises(Phase2Error, match="predictor.input: cache"):  # the cascade fixture reads the cache
        build_phase2(cfg, i["base"], i["tokens"], i["contexts"], i["init"], i["predictor"], i["diffusion"], tmp_path / "o")
    assert not (tmp_path / "o").exists()
    cfg = from_dict(Phase2Config, {"windows": "cache", "shared_heads": 1, "train": {"steps": 1, "device": "cpu"}})
    with pytest.raises(Phase2Error, match="shared_heads"):
        build_phase2(cfg, i["base"], i["tokens"], i["contexts"], i["init"], i["predictor"], i["diffusion"], tmp_path / "o",
                     heads_file=i["heads"])
    with pytest.raises(Phase2OutputError, match="run `dvc repro phase2`"):
        static_mask(i["static_baselines"], tmp_path / "pruning.json")


def test_budget_warmup_anneals_the_kept_fraction_from_every_head_to_the_target(downstream_inputs, tmp_path):
    cfg = from_dict(Phase2Config, {"windows": "cache", "budget_warmup": 4, "train": {"steps": 10}})
    assert [cfg.keep_at(s, 0.25) for s in (0, 2, 4, 9)] == [1.0, 0.625, 0.25, 0.25]
    router, _ = load_predictor(lm_router(downstream_inputs, tmp_path / "router.safetensors"))
    lm = AutoModelForCausalLM.from_pretrained(downstream_inputs["base"], dtype=torch.float32)
    model = Phase2Model(lm, router.eval(), "query")
    ids = torch.randint(0, lm.config.vocab_size, (2, 7))
    for keep, on in ((1.0, 4), (0.75, 3), (None, 2)):  # None: the router's own budget (keep 0.5)
        _, gates = model.route(ids, None, None, hard=True, keep=keep)
        assert (gates[..., 1:].sum(-1) == on).all(), keep
    mask = StaticMask(torch.tensor([[0.3, 0.1], [0.05, 0.2]]), 0.5, "query")
    static = ControlModule(None, ContextCache(downstream_inputs["contexts"]), cfg, None, mask)
    assert [static.batch(s)["fraction"] for s in (0, 2, 4)] == [1.0, 0.75, 0.5]  # the static control alike
    i = downstream_inputs
    with pytest.raises(ConfigError, match="budget_warmup"):
        from_dict(Phase2Config, {"budget_warmup": 10, "train": {"steps": 10}})
    cfg = from_dict(Phase2Config, {"windows": "cache", "budget_warmup": 1, "shared_heads": 0,
                                   "train": {"steps": 2, "device": "cpu"}})
    with pytest.raises(Phase2Error, match="budget_warmup"):  # the cascade fixture has no top-K budget
        build_phase2(cfg, i["base"], i["tokens"], i["contexts"], i["init"], i["predictor"], i["diffusion"], tmp_path / "o")


# ------------------------------------------------------------------ the router keeps up with the LM (refresh)

def plain_greedy_keep(lm, ids, n_layers, n_heads, k, skip, fixed):
    """The greedy oracle written plainly (a reference, not the batched path): at each of its steps,
    one forward per candidate head with that head off at every position on top of each position's
    earlier removals; each position drops its cheapest candidate (the first on a tie)."""
    from lookahead.graph.nodes import head_graph
    from lookahead.graph.oracle import kl_to_dense

    total = n_layers * n_heads
    with torch.no_grad():
        dense = torch.log_softmax(lm(input_ids=ids).logits.float(), -1)
        gates = torch.ones(ids.shape[0], ids.shape[1], 1 + total)
        for _ in range(total - k):
            cost = torch.full((ids.shape[0], ids.shape[1], total), math.inf)
            for h in range(total):
                if h in fixed:
                    continue
                trial = gates.clone()
                trial[..., 1 + h] = 0
                logits = forward_with_topology(lm, ids, head_graph(trial, n_layers, n_heads), trial, hard=True, skip=skip)
                cost[..., h] = torch.where(gates[..., 1 + h] == 1, kl_to_dense(dense, logits), math.inf)
            for b in range(ids.shape[0]):
                for t in range(ids.shape[1]):
                    drop = min(range(total), key=lambda h: (cost[b, t, h].item(), h))
                    gates[b, t, 1 + drop] = 0
    return gates[..., 1:].bool()


def test_the_greedy_oracle_with_shared_heads_never_drops_them_and_matches_the_plain_greedy():
    from lookahead.graph.oracle import greedy_keep, greedy_order
    from tests.test_runtime import tiny_olmo2

    lm = tiny_olmo2(n_layers=2, n_heads=2, hidden=32, ffn=32)
    ids = torch.randint(0, 61, (2, 5), generator=torch.Generator().manual_seed(3))
    for fixed in ([], [1], [0, 3]):
        keep = greedy_keep(greedy_order(lm, ids, 2, 2, 2, "query", fixed=fixed), 2)[..., 1:].bool()
        assert torch.equal(keep, plain_greedy_keep(lm, ids, 2, 2, 2, "query", fixed))
        assert keep[..., fixed].all() and keep.sum(-1).eq(2).all()
    with pytest.raises(ValueError, match="fixed heads"):
        greedy_order(lm, ids, 2, 2, 1, "query", fixed=[0, 1, 2])


def test_a_refresh_distils_the_current_lms_greedy_oracle_into_the_routed_heads_only(phase_inputs, tmp_path):
    from lookahead.graph.oracle import greedy_keep, greedy_order
    from lookahead.graph.router_inputs import router_context
    from lookahead.pipeline.phase2.refresh import Refresher

    router, _ = load_predictor(lm_router(phase_inputs, tmp_path / "router.safetensors"))
    router.set_always_on([0])
    router.requires_grad_(False)
    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"], dtype=torch.float32)
    ids = scoring_windows(phase_inputs["tokens"], ScoringConfig(roles=WindowsConfig(per_role=2)), 16, "selection")[:, :-1]
    refresher = Refresher(router, lr=3e-2, steps=1, windows=2)
    shared_row = router.to_gate.weight[0].clone()
    first = [refresher.step(lm, router, "query", ids, None) for _ in range(8)]
    assert first[-1]["loss"] < first[0]["loss"] and first[-1]["recall"] > first[0]["recall"]
    assert torch.equal(router.to_gate.weight[0], shared_row)  # the shared head is outside the loss
    assert not any(p.requires_grad for p in router.parameters())  # the LM's optimiser never sees the router
    # the recall is the router's top-K (shared head included) against the oracle's keep set, routed heads
    k = refresher.k
    keep = greedy_keep(greedy_order(lm, ids, 2, 2, k, "query", fixed=[0]), k)[..., 1:].bool()
    with torch.no_grad():
        _, gates = router.eval()(router_context("lm", lm, ids, None), None, hard=True)
    mine = gates[..., 1:].bool()
    assert mine[..., 0].all()
    recall = ((mine & keep)[..., 1:].sum() / keep[..., 1:].sum()).item()
    router.train()
    assert refresher.step(lm, router, "query", ids, None)["recall"] == pytest.approx(recall)
    assert refresher.report()["refreshes"] == 9
    # the leave-one-out oracle: the K heads of largest KL, the shared head among them
    from lookahead.graph.oracle import leave_one_out_kl

    loo = Refresher(router, lr=3e-2, steps=1, windows=2, oracle="loo")
    kl = leave_one_out_kl(lm, ids, 2, 2, "query")
    kl[..., 0] = math.inf
    want = kl.topk(k, -1).indices
    keep_loo = torch.zeros_like(kl, dtype=torch.bool).scatter_(-1, want, True)
    with torch.no_grad():
        z = router.head_logits(router_context("lm", lm, ids, None), None)
    mine = torch.zeros_like(keep_loo).scatter_(-1, torch.cat([torch.zeros_like(want[..., :1]),
                                                               z[..., 1:].topk(k - 1, -1).indices + 1], -1), True)
    recall_loo = ((mine & keep_loo)[..., 1:].sum() / keep_loo[..., 1:].sum()).item()
    assert loo.step(lm, router, "query", ids, None)["recall"] == pytest.approx(recall_loo)


def test_phase2_with_refresh_trains_the_router_from_the_oracle_only(downstream_inputs, tmp_path):
    i = downstream_inputs
    router = lm_router(i, tmp_path / "router.safetensors")
    cfg = from_dict(Phase2Config, {
        "windows": "stream", "shared_heads": 1, "refresh_every": 1, "refresh_windows": 1, "refresh_lr": 1e-2,
        "eval_batch_size": 2, "train": {"steps": 2, "batch_size": 2, "lr": 1e-3, "warmup_steps": 1, "eval_every": 2,
                                         "log_every": 1, "checkpoint_every": 0, "device": "cpu"}})
    report, _ = build_phase2(cfg, i["base"], i["tokens"], i["contexts"], i["init"], router, i["diffusion"],
                             tmp_path / "out", heads_file=i["heads"], scoring=ScoringConfig(roles=WindowsConfig(per_role=2), batch_size=2))
    before, _ = load_predictor(router)
    after, _ = load_predictor(tmp_path / "out" / PREDICTOR_FILE)
    assert report["refreshes"] == 2 and 0 <= report["refresh_recall_mean"] <= 1 and report["refresh_seconds"] > 0
    assert not torch.equal(after.to_gate.weight, before.to_gate.weight)  # the router learned
    for bad, key in (({"refresh_every": -1}, "refresh_every"), ({"refresh_every": 5, "predictor_lr_scale": 1.0}, "refresh_every"),
                     ({"refresh_every": 5, "refresh_windows": 99}, "refresh_windows"),
                     ({"refresh_every": 5, "refresh_lr": 0.0}, "refresh_lr")):
        with pytest.raises(ConfigError, match=key):
            from_dict(Phase2Config, bad)


def test_softmax_gate_weights_scale_the_kept_routed_heads_by_their_softmax_weight(phase_inputs, tmp_path):
    from lookahead.graph.gating import softmax_weights

    gates = torch.tensor([[1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
    z = torch.tensor([[5.0, 0.0, 9.0, 1.0], [2.0, 3.0, 3.0, -1.0]])
    shared = torch.tensor([0.0, 1.0, 0.0, 0.0])
    e = math.exp
    want = torch.tensor([[1.0, 1.0, 0.0, e(1) / e(5)],  # softmax weights over the largest's
                         [0.0, 1.0, 1.0, e(-1) / e(3)]])
    torch.testing.assert_close(softmax_weights(gates, z, shared), want)
    # a phase-2 model under softmax weights runs the plain reference's forward with those gates
    router, _ = load_predictor(lm_router(phase_inputs, tmp_path / "router.safetensors"))
    router.set_always_on([0])
    router.cfg = dataclasses.replace(router.cfg, weights="softmax", keep=0.75)
    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"], dtype=torch.float32).eval()
    ids = scoring_windows(phase_inputs["tokens"], ScoringConfig(roles=WindowsConfig(per_role=2)), 16, "selection")[:, :-1]
    with torch.no_grad():
        logits, (adjacency, g) = Phase2Model(lm, router.eval(), "query")(ids, hard=True)
        routed = g[..., 2:]
        assert (g[..., 1] == 1).all() and ((routed > 0).sum(-1) == 2).all()  # keep 3 of 4: the shared head + two
        assert (routed.amax(-1) == 1).all()  # the first routed head at 1
        assert (routed[routed > 0] - 1).abs().max() > 0.01  # the other's weight differs from 0/1 gates
        torch.testing.assert_close(logits, reference_forward(lm, ids, adjacency, g, skip="query"), rtol=1e-4, atol=1e-4)
    with pytest.raises(ConfigError, match="weights"):
        PredictorConfig(gate="cascade", budget="none", weights="softmax")


# ------------------------------------------------------------------ what phase 2 may add (issue: learned connectivity)

def _added_run(downstream_inputs, tmp_path, **changes):
    i = downstream_inputs
    router = lm_router(i, tmp_path / "router.safetensors")
    cfg = from_dict(Phase2Config, {
        "windows": "stream", "keep": 1.0, "eval_batch_size": 2, "connectivity_lr_scale": 30, **changes,
        "train": {"steps": 2, "batch_size": 2, "lr": 1e-3, "warmup_steps": 1, "eval_every": 2, "log_every": 1,
                  "checkpoint_every": 0, "device": "cpu"}})
    report, _ = build_phase2(cfg, i["base"], i["tokens"], i["contexts"], i["init"], router, i["diffusion"],
                             tmp_path / "out", scoring=ScoringConfig(roles=WindowsConfig(per_role=8), batch_size=4))
    return report, tmp_path / "out"


def test_dynamic_connectivity_trains_with_the_lm_frozen(downstream_inputs, tmp_path):
    from safetensors.torch import load_file

    from lookahead.graph.connectivity import CONNECTIVITY_FILE, load_connectivity

    report, out = _added_run(downstream_inputs, tmp_path, connectivity="dynamic", train_lm=False)
    conn = load_connectivity(out / CONNECTIVITY_FILE)
    assert report["active_head_fraction"] == 1.0  # phase2.keep: every head, whatever the router's budget
    assert report["parameters_added"] == conn.n_parameters() > 0
    assert conn.to_v.weight.abs().sum() > 0  # the weights trained (V starts at 0)
    base = load_file(str(Path(downstream_inputs["base"]) / "model.safetensors"))
    lm = load_file(str(out / "lm" / "model.safetensors"))
    assert all(torch.equal(lm[k], base[k]) for k in base)  # the LM stayed frozen
    dense, hard = report["token_nll"]["dense"], report["token_nll"]["hard"]
    assert report["hard_minus_dense"] == pytest.approx(float((hard - dense).mean()))
    assert np.abs(hard - dense).max() > 0  # the weights change the function; dense is the frozen LM
    assert (out / "connectivity.png").is_file()


def test_value_residual_and_the_adapter_train_and_the_lm_carries_the_adapter(downstream_inputs, tmp_path):
    from safetensors.torch import load_file

    from lookahead.lm.adapters import VALUE_RESIDUAL_FILE, load_value_residual

    report, out = _added_run(downstream_inputs, tmp_path, value_residual=True, adapter="lora", train_lm=False)
    added = report["added_parameters"]
    assert added["value_residual"] == 2 * (load_phase2(out)["n_layers"] - 1)  # (λ₁, λ₂) of every layer after the first
    assert added["adapter"] > 0 and report["parameters_added"] == added["value_residual"] + added["adapter"]
    mix = load_value_residual(out / VALUE_RESIDUAL_FILE).mix
    assert not torch.equal(mix, torch.tensor([[1.0, 0.0]]).repeat(len(mix), 1))  # λ moved
    base = load_file(str(Path(downstream_inputs["base"]) / "model.safetensors"))
    lm = load_file(str(out / "lm" / "model.safetensors"))
    moved = [k for k in base if not torch.equal(lm[k], base[k])]
    assert moved and all("o_proj" in k for k in moved)  # only the adapted projections, the adapter merged in
    # dense is the frozen LM without the additions; the phase-2 model runs them
    assert np.abs(report["token_nll"]["hard"] - report["token_nll"]["dense"]).max() > 0


def test_phase2_seed_i_routes_with_phase1_seed_i_and_a_missing_router_stops_before_any_work(tmp_path):
    from lookahead.graph.predictor import seed_router_name
    from lookahead.pipeline.phase2.build import seed_routers
    from lookahead.pipeline.phase2.config import Phase2Config

    primary, seeds = tmp_path / "predictor.safetensors", tmp_path / "seeds"
    seeds.mkdir()
    for path in (primary, seeds / seed_router_name(1), seeds / seed_router_name(2)):
        path.write_bytes(b"x")
    assert seed_routers(Phase2Config(seeds=3), primary, seeds) == [primary, seeds / "predictor_seed1.safetensors",
                                                                   seeds / "predictor_seed2.safetensors"]
    assert seed_routers(Phase2Config(seeds=3), primary, None) == [primary] * 3  # no seeds directory: the primary
    with pytest.raises(Phase2Error, match="router of seed 3 .* is missing: set phase1.seeds >= phase2.seeds"):
        seed_routers(Phase2Config(seeds=4), primary, seeds)
