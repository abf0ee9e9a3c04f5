"""Phase 1: the estimator, the evaluation and its baselines, checkpoint/resume (docs/design.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from lookahead.artifacts.contexts import ContextCache
from lookahead.core.errors import ConfigError
from lookahead.graph.nodes import allowed_mask, n_nodes
from lookahead.graph.predictor import PredictorConfig, StructurePredictor, load_predictor
from lookahead.graph.runtime import RuntimeConfig, forward_with_topology
from lookahead.graph.scoring import GeoLookup, interpolate_curve, static_pruning_curve
from lookahead.lm.nll import token_nll
from lookahead.pipeline.phase1.run import build_phase1
from lookahead.pipeline.phase1.config import Phase1Config
from lookahead.pipeline.phase1.module import Phase1Module
from lookahead.train.loop import TrainConfig
from tests.test_runtime import tiny_olmo2


class MemoryCache:
    """The read side of a context cache, in memory (the interface Phase1Module uses)."""

    def __init__(self, windows: torch.Tensor, contexts: torch.Tensor):
        self.w = {"train": windows.numpy(), "val": windows.numpy()}
        self.c = {"train": contexts.numpy(), "val": contexts.numpy()}

    def windows(self, split):
        return self.w[split]

    def batch(self, split, rows):
        return torch.from_numpy(self.w[split][rows]), torch.from_numpy(self.c[split][rows])


def test_tau_anneals_geometrically_and_config_is_validated():
    cfg = Phase1Config(tau_start=1.0, tau_end=0.25, train=TrainConfig(steps=11))
    assert cfg.tau(0) == 1.0 and cfg.tau(10) == pytest.approx(0.25) and cfg.tau(5) == pytest.approx(0.5)
    for bad, key in (({"hard_from_step": 11}, "hard_from_step"), ({"tau_end": 2.0}, "tau_end"),
                     ({"lambda_head": -0.1}, "lambda_head"), ({"lambda_edge": math.nan}, "lambda_edge"),
                     ({"random_draws": 0}, "random_draws")):
        with pytest.raises(ConfigError, match=key):
            Phase1Config(**{"train": TrainConfig(steps=11), **bad})


def greedy_windows(lm, n: int, length: int, seed: int) -> torch.Tensor:
    """Sequences the dense LM continues greedily: the dense graph predicts them best."""
    ids = torch.randint(0, lm.config.vocab_size, (n, 1), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for _ in range(length - 1):
            ids = torch.cat([ids, lm(ids).logits[:, -1:].argmax(-1)], dim=1)
    return ids


@pytest.mark.parametrize("hard_from_step", [0, -1], ids=["straight-through-hard", "soft"])
def test_an_off_head_comes_back_when_the_loss_wants_it(hard_from_step):
    """Head 3 (layer 1, head 0) starts off (its incoming logits at −6). With the phase-1 estimator
    (soft execution; straight-through at the soft values in hard mode) the NLL of sequences the
    dense model predicts best turns it back on."""
    lm = tiny_olmo2(n_layers=2, n_heads=2, hidden=32, ffn=32).requires_grad_(False)
    windows = greedy_windows(lm, 16, 10, seed=1)
    contexts = torch.randn(16, 9, 4, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(0)
    predictor = StructurePredictor(PredictorConfig.cascade(rank=2, hidden=8, init_bias=4.0, gate_k=4.0), 2, 2, context_dim=4)
    head = 3
    with torch.no_grad():
        predictor.static[:, head] = -6.0
    # no sparsity terms at all: only the NLL acts on the head
    cfg = Phase1Config(nll_weight=1.0, distill=0.0, lambda_head=0.0, lambda_edge=0.0, tau_end=0.3, hard_from_step=hard_from_step,
                       train=TrainConfig(steps=60, batch_size=8))
    module = Phase1Module(predictor, lm, MemoryCache(windows, contexts),
                          GeoLookup(torch.zeros(61, 0), torch.zeros(61)), torch.ones(2, 2), cfg)

    ids = windows[:, :-1]
    n = n_nodes(2, 2)
    mask = allowed_mask(2, 2).float()
    off = torch.ones(n)
    off[head] = 0
    with torch.no_grad():  # precondition: this head matters for this loss
        nll_dense = token_nll(lm(ids).logits, windows[:, 1:]).mean()
        nll_off = token_nll(forward_with_topology(lm, ids, mask * off[:, None] * off[None], off, hard=True),
                            windows[:, 1:]).mean()
    assert nll_off > nll_dense + 0.01

    def hard_gate() -> float:
        predictor.eval()
        with torch.no_grad():
            _, g = predictor(contexts, hard=True)
        predictor.train()
        return g[..., head].mean().item()

    assert hard_gate() == 0.0
    opt = torch.optim.Adam(predictor.parameters(), lr=0.3)
    for step in range(cfg.train.steps):
        loss, parts = module.loss(predictor, module.batch(step))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if hard_gate() == 1.0:
            break
    assert hard_gate() == 1.0, f"head still off after {step + 1} steps"


def test_static_pruning_keeps_the_most_important_heads():
    lm = tiny_olmo2(n_layers=2, n_heads=2, hidden=32, ffn=32)
    windows = torch.randint(0, 61, (3, 9), generator=torch.Generator().manual_seed(5))
    importance = torch.tensor([[0.1, 0.4], [0.3, 0.2]])  # order: node 2, 3, 4, 1
    curve = static_pruning_curve(lm, [windows], importance)
    assert [r["heads_kept"] for r in curve] == [0, 1, 2, 3, 4]
    with torch.no_grad():
        dense = token_nll(lm(windows[:, :-1]).logits, windows[:, 1:]).mean().item()
        mask = allowed_mask(2, 2).float()
        g = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])  # the two most important heads
        two = token_nll(forward_with_topology(lm, windows[:, :-1], mask * g[:, None] * g[None], g),
                        windows[:, 1:]).mean().item()
    assert curve[4]["nll"] == pytest.approx(dense, abs=1e-5)
    assert curve[2]["nll"] == pytest.approx(two, abs=1e-5)
    # linear between whole-head counts
    assert interpolate_curve(curve, 0.5) == pytest.approx(curve[2]["nll"])
    assert interpolate_curve(curve, 0.625) == pytest.approx(0.5 * (curve[2]["nll"] + curve[3]["nll"]))
    assert interpolate_curve(curve, 1.0) == pytest.approx(curve[4]["nll"])
    assert interpolate_curve(curve, 0.0) == pytest.approx(curve[0]["nll"])


def phase1_module(phase_inputs, init_bias: float, **cfg):
    cache = ContextCache(phase_inputs["contexts"])
    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"])
    from safetensors.torch import load_file

    init = load_file(str(phase_inputs["init"]))
    torch.manual_seed(0)
    predictor = StructurePredictor.from_init(PredictorConfig.cascade(rank=2, hidden=8, init_bias=init_bias),
                                             phase_inputs["init"], cache.dim)
    return Phase1Module(predictor, lm, cache, GeoLookup(init["geo_table"], init["geo_mask"]),
                        load_file(str(phase_inputs["heads"]))["importance"], Phase1Config(**cfg))


def test_evaluation_at_the_extremes_matches_its_baselines(phase_inputs):
    """Every head on: hard NLL = dense = static pruning at fraction 1 = random heads at 1.
    Every head off: the predictor, static pruning at 0 and random heads at 0 run the same graph."""
    on = phase1_module(phase_inputs, init_bias=30.0)
    m = on.evaluate(on.model)
    assert m["active_head_fraction"] == 1.0 and m["active_edge_fraction"] == 1.0
    for key in ("hard_nll", "static_pruning_nll", "random_heads_nll"):
        assert m[key] == pytest.approx(m["dense_nll"], abs=1e-5), key
    # soft gates stay below 1 (1 − e^(−k·s): 0.98 for a layer-0 head fed by the source alone)
    assert m["soft_nll"] == pytest.approx(m["dense_nll"], abs=1e-3)
    assert m["below_dense_fraction"] < 0.5  # equal NLL is not below
    off = phase1_module(phase_inputs, init_bias=-30.0)
    m = off.evaluate(off.model)
    assert m["active_head_fraction"] == 0.0
    assert m["hard_nll"] == pytest.approx(m["static_pruning_nll"], abs=1e-5)
    assert m["hard_nll"] == pytest.approx(m["random_heads_nll"], abs=1e-5)
    assert abs(m["hard_nll"] - m["dense_nll"]) > 1e-3  # no head at all is another function
    assert len(off.last_eval["active_head_fraction_per_layer"]) == 2


@pytest.mark.parametrize("kind", ["cascade", "router"])
def test_resumed_phase1_ends_with_the_same_predictor(phase_inputs, tmp_path, monkeypatch, kind):
    """Killed and resumed, phase 1 ends bit for bit where a straight run does: the seed's cascade
    trained on the NLL, and the default router distilled from the oracle (whose targets the resumed
    run computes again)."""
    train = TrainConfig(steps=7, batch_size=2, lr=1e-2, warmup_steps=1, eval_every=3, log_every=1, checkpoint_every=2,
                        device="cpu")
    if kind == "cascade":
        cfg = Phase1Config(nll_weight=1.0, distill=0.0, static_twin=False, lambda_head=0.1, hard_from_step=4,
                           eval_batch_size=2, train=train)
        pcfg = PredictorConfig.cascade(rank=2, hidden=8)
    else:
        cfg = Phase1Config(static_twin=False, eval_batch_size=2, train=train)
        pcfg = PredictorConfig(rank=2, hidden=8)
    args = (phase_inputs["base"], phase_inputs["contexts"], phase_inputs["init"], phase_inputs["heads"])
    metrics, straight, _ = build_phase1(cfg, pcfg, *args, tmp_path / "a.safetensors", tmp_path / "ckpt_a")

    class Killed(RuntimeError):
        pass

    batch = Phase1Module.batch

    def dying(self, step):
        if step == 5:
            raise Killed
        return batch(self, step)

    monkeypatch.setattr(Phase1Module, "batch", dying)
    with pytest.raises(Killed):
        build_phase1(cfg, pcfg, *args, tmp_path / "b.safetensors", tmp_path / "ckpt_b")
    assert not (tmp_path / "b.safetensors").exists()
    monkeypatch.setattr(Phase1Module, "batch", batch)
    _, resumed, _ = build_phase1(cfg, pcfg, *args, tmp_path / "b.safetensors", tmp_path / "ckpt_b")
    assert resumed.resumed_from == 4
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    assert [r["loss"] for r in resumed.train_curve] == [r["loss"] for r in straight.train_curve]
    predictor, meta = load_predictor(tmp_path / "a.safetensors")
    assert meta["phase1"]["lambda_head"] == cfg.lambda_head and meta["geo_dim"] == 5
    assert meta["context_dim"] == (32 if kind == "cascade" else 2 * 32)  # the cache's, or the LM's: 2 x hidden
    assert {"dense_nll", "soft_nll", "hard_nll", "active_head_fraction", "active_edge_fraction",
            "below_dense_fraction", "static_pruning_nll", "random_heads_nll"} <= set(metrics)
    assert straight.eval_curve[0]["step"] == 0 and straight.eval_curve[-1]["step"] == 7
    assert all(np.isfinite(v) for v in metrics.values() if isinstance(v, float))


def test_every_final_figure_scores_the_scoring_windows_and_the_claims_pair_them(phase_inputs, tmp_path):
    """With a scoring set, the headline's figures all come from its windows: the oracles, random heads,
    recall, the twin and the claims — each checked against a plain recomputation."""
    from lookahead.core.windows import set_label
    from lookahead.graph.cost import macs_per_token
    from lookahead.graph.nodes import baseline_graph, static_gates
    from lookahead.graph.oracle import greedy_gates
    from lookahead.pipeline.phase1.final import claims, scoring_set

    cfg = Phase1Config(eval_batch_size=2, oracle="greedy", static_twin=True, random_draws=2,
                       train=TrainConfig(steps=3, batch_size=2, lr=1e-2, warmup_steps=1, eval_every=3, device="cpu"))
    pcfg = PredictorConfig(rank=2, hidden=8, gate="head", budget="topk", keep=0.5, input="lm")
    cache = ContextCache(phase_inputs["contexts"])
    windows = torch.from_numpy(cache.windows("train")[:4].astype(np.int64))  # any windows the cache does not eval on
    from lookahead.artifacts.val_scores import ScoringConfig, WindowsConfig

    scoring = scoring_set(ScoringConfig(roles=WindowsConfig(per_role=4), batch_size=2, resamples=200), windows, cache, "lm", "cpu")
    assert scoring.label == set_label("test", windows)
    metrics, _, module = build_phase1(cfg, pcfg, phase_inputs["base"], phase_inputs["contexts"], phase_inputs["init"],
                                      phase_inputs["heads"], tmp_path / "p.safetensors",
                                      runtime_cfg=RuntimeConfig(skip="query"), scoring=scoring)
    tokens = metrics["token_nll"]
    assert metrics["window_set"] == scoring.label and metrics["cache_val"]["window_set"].startswith("cache-val:")
    assert metrics["scored_positions"] == 4 * windows.shape[1] - 4 == len(tokens["greedy"]) == len(tokens["random"])
    lm, ids = module.lm, windows[:, :-1]
    with torch.no_grad():
        dense = token_nll(lm(input_ids=ids).logits, windows[:, 1:]).flatten().numpy()
        greedy = greedy_gates(lm, ids, 2, 2, 2, "query")
    np.testing.assert_allclose(tokens["dense"], dense, atol=1e-5)
    assert metrics["dense_nll"] == pytest.approx(dense.mean(), abs=1e-5)
    # static pruning runs as a pruned model (no Q, K, V or O for a pruned head anywhere), whatever the router's
    # skip mode: the plain reference forward in full skip over the probe's top 2 heads (no static_baselines here)
    from tests.reference_head_graph import reference_forward

    gates = static_gates(module.importance, 2)
    logits = reference_forward(lm, ids, baseline_graph(gates, 2, 2, "full"), gates, "full")
    np.testing.assert_allclose(tokens["static"], token_nll(logits, windows[:, 1:]).flatten().numpy(), atol=1e-5)
    assert metrics["static_pruning_mask"] == "probe importance (train windows)"
    gain = tokens["static"].mean() - tokens["greedy"].mean()  # the greedy oracle's gain (None below 0)
    assert metrics["greedy_capture"] == (None if gain <= 0 else pytest.approx(
        (tokens["static"].mean() - tokens["hard"].mean()) / gain))
    on_static = static_gates(module.importance, 2)[1:].bool()
    static_recall = (greedy[..., 1:].reshape(-1, 4).bool() & on_static).sum(-1).double().mean().item() / 2
    assert metrics["static_recall_at_k"] == pytest.approx(static_recall)
    assert metrics["static_twin_gap"] == pytest.approx(metrics["static_twin_hard_nll"] - metrics["hard_nll"])
    # static pruning at the deployed router's MACs per token, counted as pruned heads: its head count pays for them
    k = metrics["equal_macs_static_heads"]
    ctx = (windows.shape[1] - 1 + 1) / 2
    assert macs_per_token(lm.config, ctx, k / 4, "static") / macs_per_token(lm.config, ctx, 1.0, "static") == pytest.approx(
        metrics["deployed_macs_over_dense"], rel=1e-6)
    # the deployed router's MACs as its gates ran: 2 of 4 heads at every position, each with every key
    # (query skip): position t costs the closed form at t + 1 keys; the router's own MACs on top
    length = windows.shape[1] - 1
    per_position = np.array([macs_per_token(lm.config, t + 1, 0.5, "query") for t in range(length)])
    np.testing.assert_allclose(tokens["deployed_macs"].reshape(4, length), np.tile(per_position, (4, 1)), rtol=1e-6)
    dense_macs = macs_per_token(lm.config, ctx, 1.0, "query")
    assert metrics["deployed_macs_over_dense"] > tokens["deployed_macs"].mean() / dense_macs > 0.5
    w = k - math.floor(k)  # the interpolation between whole head counts
    from lookahead.pipeline.phase1.final import static_scores

    want = (1 - w) * static_scores(module, scoring, math.floor(k)) + w * static_scores(module, scoring, math.floor(k) + 1)
    np.testing.assert_allclose(tokens["static_equal_macs"], want)
    out = claims({k: v[None] if k != "dense" else v for k, v in tokens.items()}, scoring)
    assert out["deployed_minus_static_pruning"] == pytest.approx((tokens["deployed"] - tokens["static"]).mean())
    assert out["router_minus_static_pruning"] == pytest.approx((tokens["hard"] - tokens["static"]).mean())
    assert out["deployed_minus_static_at_equal_macs_ci_low"] < out["deployed_minus_static_at_equal_macs"]
    if gain > 0:
        assert out["greedy_capture_ci_low"] < metrics["greedy_capture"] < out["greedy_capture_ci_high"]
    else:  # no gain to capture: no ratio, no interval
        assert out["greedy_capture_ci_low"] is None


def test_a_per_token_router_is_measured_against_its_oracle_and_its_static_twin(phase_inputs, tmp_path):
    """Head gates under an exact budget, read from the LM's states, query skip, distilled from the
    oracle: the fraction is exact, the oracles and the twin are reported, and the twin (zeroed
    inputs) is a static mask whatever it learned."""
    cfg = Phase1Config(lambda_head=0.0, eval_batch_size=2, distill=1.0, z_loss=1e-3, balance=0.1, oracle="greedy",
                       static_twin=True, noise_end=0.5,
                       train=TrainConfig(steps=4, batch_size=2, lr=1e-2, warmup_steps=1, eval_every=4, device="cpu"))
    pcfg = PredictorConfig(rank=2, hidden=8, gate="head", budget="topk", keep=0.5, input="lm")
    metrics, result, module = build_phase1(cfg, pcfg, phase_inputs["base"], phase_inputs["contexts"],
                                           phase_inputs["init"], phase_inputs["heads"], tmp_path / "p.safetensors",
                                           runtime_cfg=RuntimeConfig(skip="query"))
    assert metrics["active_head_fraction"] == 0.5 and metrics["oracle_heads_kept"] == 2  # 2 x 2 heads
    assert metrics["static_twin_dynamic_fraction"] == 0.0
    assert metrics["static_twin_gap"] == pytest.approx(metrics["static_twin_hard_nll"] - metrics["hard_nll"])
    assert metrics["oracle_capture"] == pytest.approx((metrics["static_pruning_nll"] - metrics["hard_nll"])
                                                      / (metrics["static_pruning_nll"] - metrics["oracle_nll"]))
    assert metrics["greedy_oracle_nll"] > 0 and 0 <= metrics["dynamic_fraction"] <= 0.5
    # per-token cost: the routed forward and the router below dense; reading a dense pass first adds one
    assert 0.5 < metrics["deployed_macs_over_dense"] < 1 and metrics["router_macs_over_dense"] > 0
    assert metrics["dense_state_macs_over_dense"] == pytest.approx(metrics["deployed_macs_over_dense"] + 1)
    assert {"distill", "logit_abs"} <= set(result.train_curve[-1])
    predictor, meta = load_predictor(tmp_path / "p.safetensors")
    assert meta["runtime"] == {"skip": "query"} and predictor.cfg.gate == "head"
    assert meta["context_dim"] == 2 * module.lm.config.hidden_size


def test_sweep_script_reads_experiment_rows(repo_root):
    """scripts/phase1_sweep.py: one point per experiment with phase-1 metrics, whether DVC names a
    column by its key or prefixes it with its file; queued and running rows are left out, and the
    baseline commit's row once it repeats the workspace's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("phase1_sweep", repo_root / "scripts" / "phase1_sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    metrics = {"active_head_fraction": 0.5, "hard_nll": 4.6, "dense_nll": 4.4, "static_pruning_nll": 4.8,
               "random_heads_nll": 5.0}
    rows = [
        {"Experiment": None, "rev": "workspace", "phase1.lambda_head": 0.5, **metrics},
        {"Experiment": "big-lambda", "rev": "abc1234", "State": "Success", "phase1.lambda_head": 2.0,
         **{f"metrics/phase1.json:{k}": v - 0.25 if k == "active_head_fraction" else v for k, v in metrics.items()}},
        {"Experiment": None, "rev": "main", "phase1.lambda_head": 0.5, **metrics},  # = the workspace
        {"Experiment": "queued", "rev": "def5678", "State": "Queued", "phase1.lambda_head": 1.0, "hard_nll": None},
        {"Experiment": "running", "rev": "aaa0000", "State": "Running", "phase1.lambda_head": 3.0, **metrics},
    ]
    points = sweep.sweep_points(rows, ["phase1.lambda_head"])
    assert [p["experiment"] for p in points] == ["big-lambda", "workspace"]  # sorted by active-head fraction
    assert points[0]["phase1.lambda_head"] == 2.0 and points[0]["active_head_fraction"] == 0.25
    assert points[1]["increase"] == pytest.approx(0.2) and points[1]["static_increase"] == pytest.approx(0.4)


def test_without_the_nll_term_the_router_learns_from_the_oracle_alone(phase_inputs):
    """nll_weight 0: the loss's gradient is exactly the distillation's (the LM forward carries none),
    the distillation target is the oracle's top-K by leave-one-out KL of the training window, and
    the LM runs under the router's topology only on the steps whose NLL the training curve logs."""
    from lookahead.graph.oracle import leave_one_out_kl
    from lookahead.pipeline.phase1.module import distill_loss

    cache = ContextCache(phase_inputs["contexts"])
    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"]).eval()
    from safetensors.torch import load_file

    init = load_file(str(phase_inputs["init"]))
    torch.manual_seed(0)
    pcfg = PredictorConfig(rank=2, hidden=8, gate="head", budget="topk", keep=0.5, input="lm", noise="none")
    predictor = StructurePredictor.from_init(pcfg, phase_inputs["init"], 2 * lm.config.hidden_size)
    torch.nn.init.normal_(predictor.to_gate.weight, std=0.5)
    module = Phase1Module(predictor, lm, cache, GeoLookup(init["geo_table"], init["geo_mask"]),
                          load_file(str(phase_inputs["heads"]))["importance"],
                          Phase1Config(nll_weight=0.0, distill=1.0, distill_target="loo", loss="bce", input_rounds=0,
                                       train=TrainConfig(steps=3, batch_size=2)),
                          "query")
    batch = module.batch(0)
    loss, figures = module.loss(predictor, batch)
    grads = torch.autograd.grad(loss, [p for p in predictor.parameters() if p.requires_grad], allow_unused=True)
    ids = batch["windows"][:, :-1]
    context, geo = module.inputs(ids, batch["contexts"])
    z = predictor.head_logits(context, geo)
    kl = leave_one_out_kl(lm, ids, 2, 2, "query")
    expected = distill_loss(z, kl, 0.5, 2)
    want = torch.autograd.grad(expected, [p for p in predictor.parameters() if p.requires_grad], allow_unused=True)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6) and figures["distill"] == pytest.approx(expected.item())
    for g, w in zip(grads, want):
        assert (g is None and w is None) or torch.allclose(g, w, atol=1e-7)
    # the LM's soft NLL is measured for the training curve only: on the steps it logs (the last of 3)
    assert "nll" not in figures and not batch["logged"]
    assert module.loss(predictor, module.batch(2))[1]["nll"] > 0


def test_greedy_distillation_targets_are_the_greedy_oracles_heads(phase_inputs):
    from safetensors.torch import load_file

    from lookahead.graph.oracle import greedy_gates

    cache = ContextCache(phase_inputs["contexts"])
    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"]).eval()
    init = load_file(str(phase_inputs["init"]))
    predictor = StructurePredictor.from_init(PredictorConfig(rank=2, hidden=8, keep=0.5), phase_inputs["init"],
                                             2 * lm.config.hidden_size)
    shared: dict = {}
    module = Phase1Module(predictor, lm, cache, GeoLookup(init["geo_table"], init["geo_mask"]),
                          load_file(str(phase_inputs["heads"]))["importance"],
                          Phase1Config(distill_target="greedy", train=TrainConfig(steps=2, batch_size=2)), "query",
                          oracle_targets=shared)
    batch = module.batch(0)
    targets = module._oracle_targets(batch["windows"], batch["rows"])
    want = greedy_gates(lm, batch["windows"][:1, :-1], 2, 2, 2, "query")[0, :, 1:]
    assert torch.equal(targets[0], want) and targets.sum(-1).eq(2).all()
    assert set(shared) == {int(r) for r in batch["rows"]}  # filled for the stage's other seeds to reuse


@pytest.fixture(scope="module")
def oracle_dir(phase_inputs, tmp_path_factory):
    """The oracle stage's targets for the tiny inputs: 3 train windows, 2 of 4 heads kept."""
    from lookahead.pipeline.oracle import OracleConfig, build_oracle

    out = tmp_path_factory.mktemp("oracle") / "oracle"
    metrics = build_oracle(OracleConfig(windows=3, rows=3, device="cpu"), 0.5, "query", 12, phase_inputs["base"],
                           phase_inputs["tokens"], out)
    assert metrics["positions"] == 36 and metrics["heads_kept"] == 2 and 0 <= metrics["loo_greedy_agreement"] <= 1
    return out


def test_the_oracle_stage_holds_the_greedy_and_leave_one_out_targets_of_stream_windows(phase_inputs, oracle_dir, tmp_path):
    from lookahead.artifacts.oracle_targets import TARGETS_FILE, OracleTargets, OracleTargetsError
    from lookahead.graph.oracle import greedy_gates, greedy_keep, leave_one_out_kl
    from lookahead.pipeline.oracle import OracleConfig, build_oracle
    from lookahead.train import data

    targets = OracleTargets(oracle_dir)
    stream = data.load_stream(phase_inputs["tokens"], "train")
    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"]).eval()
    assert len(targets) == 3 and targets.windows.shape == (3, 13)
    for window in targets.windows:  # windows of the train stream, 12 positions + the next token
        starts = [s for s in range(len(stream) - 12) if np.array_equal(stream[s : s + 13], window.numpy())]
        assert starts, "a window that is not in the train stream"
    ids = targets.windows[:, :-1]
    assert torch.equal(greedy_keep(targets.greedy_order, 2), greedy_gates(lm, ids, 2, 2, 2, "query"))
    assert torch.equal(greedy_keep(targets.greedy_order, 3), greedy_gates(lm, ids, 2, 2, 3, "query"))
    assert torch.allclose(targets.loo_kl, leave_one_out_kl(lm, ids, 2, 2, "query"), atol=1e-6)
    kept = targets.scores("greedy", [2, 0]).topk(2, -1).indices.sort(-1).values
    assert torch.equal(kept, greedy_gates(lm, ids[[2, 0]], 2, 2, 2, "query")[..., 1:].nonzero()[:, -1].view(2, 12, 2))
    # deterministic: the same inputs, the same bytes
    build_oracle(OracleConfig(windows=3, rows=3, device="cpu"), 0.5, "query", 12, phase_inputs["base"],
                 phase_inputs["tokens"], tmp_path / "again")
    assert (tmp_path / "again" / TARGETS_FILE).read_bytes() == (oracle_dir / TARGETS_FILE).read_bytes()
    for skip, keep, length in (("full", 2, 12), ("query", 1, 12), ("query", 2, 16)):
        with pytest.raises(OracleTargetsError, match="rerun `dvc repro oracle`"):
            targets.check(skip, keep, 4, length)
    targets.check("query", 3, 4, 12)  # a search that went below 3 heads holds the keep sets at 3
    with pytest.raises(OracleTargetsError, match="dvc repro oracle"):
        OracleTargets(tmp_path / "missing")


def test_a_deeper_oracle_holds_the_keep_sets_of_the_searches_that_stop_above_it(phase_inputs, oracle_dir, tmp_path):
    """``oracle.keep`` below ``predictor.keep``: the search goes on to fewer heads, and its order holds
    the keep set the router's budget would have had from a search stopped there (the same bytes);
    the router's own budget is the floor it may not stop above."""
    from lookahead.artifacts.oracle_targets import OracleTargets
    from lookahead.core.errors import ConfigError
    from lookahead.graph.oracle import greedy_keep
    from lookahead.pipeline.oracle import OracleConfig, build_oracle

    metrics = build_oracle(OracleConfig(windows=3, rows=3, device="cpu", keep=0.25), 0.5, "query", 12, phase_inputs["base"],
                           phase_inputs["tokens"], tmp_path / "deep")
    deep, shallow = OracleTargets(tmp_path / "deep"), OracleTargets(oracle_dir)
    assert metrics["heads_kept"] == deep.keep == 1 and torch.equal(deep.windows, shallow.windows)
    for k in (2, 3):
        assert torch.equal(greedy_keep(deep.greedy_order, k), greedy_keep(shallow.greedy_order, k))
    assert torch.equal(deep.scores("greedy", [0, 1, 2]).topk(2, -1).indices.sort(-1).values,
                       shallow.scores("greedy", [0, 1, 2]).topk(2, -1).indices.sort(-1).values)
    deep.check("query", 2, 4, 12)
    with pytest.raises(ConfigError, match="keep"):
        build_oracle(OracleConfig(windows=1, device="cpu", keep=0.75), 0.5, "query", 12, phase_inputs["base"],
                     phase_inputs["tokens"], tmp_path / "shallow")


def test_a_killed_oracle_stage_resumes_at_its_first_window_not_done(phase_inputs, oracle_dir, tmp_path, monkeypatch):
    """Each window's targets are kept as they finish: killed during its third window, the stage reruns
    only the windows not done and writes the bytes of a straight run; the checkpoints go at the end."""
    import lookahead.pipeline.oracle as stage
    from lookahead.artifacts.oracle_targets import TARGETS_FILE
    from lookahead.pipeline.oracle import OracleConfig, build_oracle

    calls, real = [], stage.greedy_targets

    def counted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3 and kill:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(stage, "greedy_targets", counted)
    run = lambda: build_oracle(OracleConfig(windows=3, rows=3, device="cpu"), 0.5, "query", 12,  # noqa: E731
                               phase_inputs["base"], phase_inputs["tokens"], tmp_path / "out", checkpoint_root=tmp_path / "ckpt")
    kill = True
    with pytest.raises(KeyboardInterrupt):
        run()
    assert not (tmp_path / "out").exists() and len(list((tmp_path / "ckpt").glob("*/window*.safetensors"))) == 2
    kill, calls[:] = False, []
    run()
    assert len(calls) == 1  # the third window only
    assert (tmp_path / "out" / TARGETS_FILE).read_bytes() == (oracle_dir / TARGETS_FILE).read_bytes()
    assert not list((tmp_path / "ckpt").glob("*/window*"))


@pytest.mark.parametrize("loss", ["bce", "listwise"])
def test_phase1_trains_on_the_oracle_stages_windows_and_targets(phase_inputs, oracle_dir, loss):
    from safetensors.torch import load_file

    from lookahead.artifacts.oracle_targets import OracleTargets
    from lookahead.pipeline.phase1.module import distill_loss

    targets = OracleTargets(oracle_dir)
    cache = ContextCache(phase_inputs["contexts"])
    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"]).eval()
    init = load_file(str(phase_inputs["init"]))
    predictor = StructurePredictor.from_init(PredictorConfig(rank=2, hidden=8, keep=0.5), phase_inputs["init"],
                                             2 * lm.config.hidden_size)
    cfg = Phase1Config(distill_target="greedy", loss=loss, train_windows=2, train=TrainConfig(steps=4, batch_size=4))
    module = Phase1Module(predictor, lm, cache, GeoLookup(init["geo_table"], init["geo_mask"]),
                          load_file(str(phase_inputs["heads"]))["importance"], cfg, "query", oracle=targets)
    batch = module.batch(0)
    assert set(batch["rows"].tolist()) <= {0, 1} and batch["contexts"] is None  # the first train_windows of the file
    assert torch.equal(batch["windows"], targets.windows[batch["rows"]])
    scores = module._oracle_targets(batch["windows"], batch["rows"])
    assert torch.equal(scores, targets.greedy_order[batch["rows"]].float()) and not module._train_loo
    z = torch.randn(4, 12, 4, generator=torch.Generator().manual_seed(0))
    keep = greedy_keep_set = (targets.greedy_order[batch["rows"]] == 4).float()
    assert greedy_keep_set.sum(-1).eq(2).all()
    if loss == "listwise":  # −(1/K) Σ_{h kept} log softmax(z)_h, averaged over positions
        want = -(torch.log_softmax(z, -1) * keep).sum(-1).mean() / 2
    else:  # BCE of z centred on its top-2 threshold (midway between the 2nd and 3rd largest)
        top = z.sort(-1, descending=True).values
        want = F.binary_cross_entropy_with_logits(z - (top[..., 1:2] + top[..., 2:3]) / 2, keep)
    assert distill_loss(z, scores, 0.5, 2, loss).item() == pytest.approx(want.item(), rel=1e-6)
    loss_value, figures = module.loss(predictor, batch)
    assert math.isfinite(loss_value.item()) and figures["distill"] > 0
    with pytest.raises(ConfigError, match="loss"):
        Phase1Config(loss="ranknet")


def test_the_fine_tune_steps_train_the_router_on_kl_to_dense_through_the_hard_gates(phase_inputs, oracle_dir):
    from safetensors.torch import load_file

    from lookahead.artifacts.oracle_targets import OracleTargets
    from lookahead.graph.plan import execute

    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"]).eval()
    init = load_file(str(phase_inputs["init"]))
    predictor = StructurePredictor.from_init(PredictorConfig(rank=2, hidden=8, keep=0.5), phase_inputs["init"],
                                             2 * lm.config.hidden_size)
    cfg = Phase1Config(finetune_steps=2, train=TrainConfig(steps=5, batch_size=2))
    module = Phase1Module(predictor, lm, ContextCache(phase_inputs["contexts"]), GeoLookup(init["geo_table"], init["geo_mask"]),
                          load_file(str(phase_inputs["heads"]))["importance"], cfg, "query", oracle=OracleTargets(oracle_dir))
    assert [module.batch(s)["finetune"] for s in range(5)] == [False, False, False, True, True]
    batch = module.batch(3)
    loss, figures = module.loss(predictor, batch)
    assert "distill" not in figures and figures["finetune_kl"] == loss.item()
    ids = batch["windows"][:, :-1]
    with torch.no_grad():  # the value: KL to dense of the hard execution of the router's top-K
        adjacency, gates = predictor(*module.inputs(ids, None), hard=True)
        dense = F.log_softmax(lm(input_ids=ids).logits, -1)
        routed = F.log_softmax(execute(lm, ids, adjacency, gates, "query"), -1)
    assert loss.item() == pytest.approx((dense.exp() * (dense - routed)).sum(-1).mean().item(), abs=1e-5)
    loss.backward()  # the gradient: through the straight-through gates into the router
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in predictor.parameters())
    assert all(p.grad is None for p in lm.parameters())
    with pytest.raises(ConfigError, match="finetune_steps"):
        Phase1Config(finetune_steps=6, train=TrainConfig(steps=5))


def test_the_cascades_static_twin_is_refused_before_any_work(phase_inputs, tmp_path):
    cfg = Phase1Config(nll_weight=1.0, distill=0.0, static_twin=True, train=TrainConfig(steps=2, batch_size=2))
    with pytest.raises(ConfigError, match="phase1.static_twin"):
        build_phase1(cfg, PredictorConfig.cascade(rank=2, hidden=8), phase_inputs["base"], phase_inputs["contexts"],
                     phase_inputs["init"], phase_inputs["heads"], tmp_path / "p.safetensors")
    assert not (tmp_path / "p.safetensors").exists()


def test_input_rounds_feed_the_router_the_states_of_the_lm_it_routes(phase_inputs, oracle_dir):
    from safetensors.torch import load_file

    from lookahead.artifacts.oracle_targets import OracleTargets
    from lookahead.graph.generate import Router, self_consistent
    from lookahead.graph.plan import gated_forward

    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"]).eval()
    init = load_file(str(phase_inputs["init"]))
    torch.manual_seed(3)
    predictor = StructurePredictor.from_init(PredictorConfig(rank=2, hidden=8, keep=0.5), phase_inputs["init"],
                                             2 * lm.config.hidden_size)
    with torch.no_grad():  # a router whose gates move with its inputs
        for p in predictor.parameters():
            p.normal_(0, 1)
    geo = GeoLookup(init["geo_table"], init["geo_mask"])
    module = Phase1Module(predictor, lm, ContextCache(phase_inputs["contexts"]), geo,
                          load_file(str(phase_inputs["heads"]))["importance"], Phase1Config(input_rounds=1), "query",
                          oracle=OracleTargets(oracle_dir))
    ids = module.batch(0)["windows"][:, :-1]
    dense, g = module.inputs(ids, None)
    routed = module.routed_inputs(predictor, ids, dense, g)
    hidden = gated_forward(lm, ids, predictor(dense, g, hard=True)[1], "query").hidden
    assert torch.equal(routed[..., :32], dense[..., :32]) and torch.equal(routed[:, 0, 32:], torch.zeros(len(ids), 32))
    assert torch.allclose(routed[:, 1:, 32:], hidden[:, :-1], atol=1e-6)
    # enough rounds reach the router as deployed (the fixed point: position t is final after t + 1 rounds)
    module.cfg = Phase1Config(input_rounds=ids.shape[1] + 1)
    _, deployed = self_consistent(lm, Router(predictor, lm, geo), ids, "query")
    assert torch.equal(predictor(module.routed_inputs(predictor, ids, dense, g), g, hard=True)[1], deployed)


def test_a_layer_router_trains_on_each_layers_targets_from_its_routed_inputs(phase_inputs, oracle_dir):
    """``predictor.input: layer``: L − 1 input rounds give the router the routed forward's own layer
    inputs (the gates :func:`layer_routed` deploys), the distillation is per layer, the gradient
    reaches every layer's router, and the deployed NLL is the execution of those gates."""
    from safetensors.torch import load_file

    from lookahead.artifacts.oracle_targets import OracleTargets
    from lookahead.artifacts.val_scores import ScoringConfig
    from lookahead.graph.generate import layer_routed
    from lookahead.graph.nodes import head_graph
    from lookahead.graph.router_inputs import input_dim
    from lookahead.graph.cost import gate_macs
    from lookahead.pipeline.phase1.final import ScoringSet, deployed_nll

    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"]).eval()
    init = load_file(str(phase_inputs["init"]))
    torch.manual_seed(3)
    pcfg = PredictorConfig(rank=2, hidden=8, keep=0.5, input="layer", budget="topk_layer")
    predictor = StructurePredictor.from_init(pcfg, phase_inputs["init"], input_dim("layer", 0, 32, 2))
    with torch.no_grad():  # a router whose gates move with its inputs
        predictor.layer_out.normal_(0, 3)
    geo = GeoLookup(init["geo_table"], init["geo_mask"])
    module = Phase1Module(predictor, lm, ContextCache(phase_inputs["contexts"]), geo,
                          load_file(str(phase_inputs["heads"]))["importance"],
                          Phase1Config(input_rounds=1, train=TrainConfig(steps=2, batch_size=3)), "query",
                          oracle=OracleTargets(oracle_dir))
    batch = module.batch(0)
    ids = batch["windows"][:, :-1]
    dense, g = module.inputs(ids, None)
    routed = module.routed_inputs(predictor, ids, dense, g)
    logits, deployed = layer_routed(lm, predictor.eval(), ids, g, "query")
    assert torch.equal(predictor(routed, g, hard=True)[1], deployed)
    assert deployed[..., 1:].view(*ids.shape, 2, 2).sum(-1).eq(1).all()  # 1 of each layer's 2 heads
    loss, figures = module.loss(predictor.train(), batch)
    assert figures["distill"] > 0
    loss.backward()
    assert predictor.layer_out.grad.abs().sum(-1).sum(-1).gt(0).all()  # every layer's router learns
    scoring = ScoringSet(ScoringConfig(), [(batch["windows"], None)], ids.shape[1])
    with torch.no_grad():  # the general runtime under the deployed gates: the reference
        reference = forward_with_topology(lm, ids, head_graph(deployed, 2, 2), deployed, hard=True, skip="query")
    want = token_nll(reference, batch["windows"][:, 1:]).flatten()
    nll, macs = deployed_nll(module, predictor, scoring)
    assert np.allclose(nll, want.numpy(), atol=1e-5)
    # its MACs: the forward under the gates it ran (query skip: every key and value), position by position
    assert np.allclose(macs, gate_macs(lm.config, deployed[..., 1:].view(*ids.shape, 2, 2), "query").flatten().numpy())


def test_the_stage_trains_a_layer_router(phase_inputs, oracle_dir, tmp_path):
    """The stage's own path (train_phase1: the init file's nodes checked against the base LM, then the
    router built) for ``predictor.input: layer``, whose router splits its context over the layers."""
    from lookahead.artifacts.oracle_targets import OracleTargets
    from lookahead.pipeline.phase1.build import train_phase1

    i = phase_inputs
    cfg = Phase1Config(static_twin=False, eval_batch_size=2, eval_sequences=2,
                       train=TrainConfig(steps=1, batch_size=2, warmup_steps=0, eval_every=1, log_every=1,
                                         checkpoint_every=0, device="cpu"))
    pcfg = PredictorConfig(rank=2, hidden=8, keep=0.5, input="layer", budget="topk_layer")
    training, _, module, _ = train_phase1(cfg, pcfg, i["base"], i["contexts"], i["init"], i["heads"],
                                          tmp_path / "router.safetensors", runtime_cfg=RuntimeConfig("query"),
                                          oracle=OracleTargets(oracle_dir))
    predictor, _ = load_predictor(tmp_path / "router.safetensors")
    assert predictor.cfg.input == "layer" and predictor.context_dim == 2 * 32 and math.isfinite(training["hard_nll"])


def test_the_scoring_oracles_resume_from_kept_batches_and_loo_comes_from_the_greedy_search(phase_inputs, tmp_path,
                                                                                            monkeypatch):
    """``score_phase1``'s oracles: each batch's greedy search is kept as it finishes and read back by a
    rerun (a cut-off run computes only what it had not kept, the same bytes); with
    ``score_loo_from_greedy`` the leave-one-out KL is the greedy search's first step — the separate
    leave-one-out forwards' KL to float rounding, without running them."""
    from types import SimpleNamespace

    from lookahead.artifacts.val_scores import ScoringConfig, WindowsConfig
    from lookahead.graph.oracle import greedy_gates
    from lookahead.pipeline.phase1 import final

    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"]).eval()
    cache = ContextCache(phase_inputs["contexts"])
    windows = torch.from_numpy(cache.windows("train")[:4].astype(np.int64))

    def fresh(store=None):
        scoring = final.scoring_set(ScoringConfig(roles=WindowsConfig(per_role=4), batch_size=2, resamples=200),
                                    windows, cache, "lm", "cpu")
        scoring.store = store
        return scoring

    def module(from_greedy: bool, calls: list | None = None):
        m = SimpleNamespace(lm=lm, n_layers=2, n_heads=2, skip="query", search={"per_round": 1, "candidates": 0},
                            cfg=Phase1Config(oracle="greedy", score_loo_from_greedy=from_greedy))
        m.greedy_targets = lambda ids, keep: (calls.append(1) if calls is not None else None) or \
            Phase1Module.greedy_targets(m, ids, keep)
        return m

    store = tmp_path / "store"
    nll, on = final.greedy_scores(module(False), fresh(store), 2)
    with torch.no_grad():  # the gates are the greedy oracle's own
        reference = torch.cat([greedy_gates(lm, w[:, :-1], 2, 2, 2, "query") for w in windows.split(2)])
    assert torch.equal(on, reference[..., 1:].reshape(-1, 4) > 0)
    assert sorted(p.name for p in store.iterdir()) == ["greedy2-00000.safetensors", "greedy2-00001.safetensors"]
    (store / "greedy2-00001.safetensors").unlink()  # cut off before its second batch was kept
    calls = []
    again_nll, again_on = final.greedy_scores(module(False, calls), fresh(store), 2)
    assert len(calls) == 1 and np.array_equal(again_nll, nll) and torch.equal(again_on, on)

    own = fresh()
    own_loo = final.loo_scores(module(False), own, 2)

    def refused(*args, **kwargs):
        raise AssertionError("the leave-one-out forwards ran")

    monkeypatch.setattr(final, "leave_one_out_kl", refused)
    reused = fresh()
    reused_loo = final.loo_scores(module(True), reused, 2)
    for a, b in zip(own.shared["loo_kl"], reused.shared["loo_kl"]):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(reused_loo, own_loo, atol=1e-6)
    with pytest.raises(ConfigError, match="needs oracle: greedy"):
        from lookahead.pipeline.phase1.config import ScoringKeys

        ScoringKeys(oracle="loo", score_loo_from_greedy=True)


def test_static_pruning_at_equal_macs_on_a_grouped_model_time_shares_the_two_masks_that_bracket_it():
    """Query-head routing on a grouped model: static pruning at the router's MACs is the mixture of
    the two whole static masks whose MACs — counted by hand here, a key/value group's keys and values
    paid where any of its heads is kept — bracket the target, weighted by MACs alone."""
    from types import SimpleNamespace

    from lookahead.artifacts.val_scores import ScoringConfig, WindowsConfig
    from lookahead.pipeline.phase1 import final
    from tests.test_families import tiny_llama

    lm = tiny_llama(n_layers=2, n_heads=6, kv_heads=2)
    cfg = lm.config
    windows = torch.randint(0, cfg.vocab_size, (4, 9), generator=torch.Generator().manual_seed(0))
    scoring = final.ScoringSet(ScoringConfig(roles=WindowsConfig(per_role=4), batch_size=2), [(w, None) for w in windows.split(2)],
                               8, "test:4x8:x")
    importance = torch.tensor([[9.0, 1, 8, 2, 7, 3], [6, 0.5, 5, 0.4, 4, 0.3]])  # group 1 of each layer empties last
    module = SimpleNamespace(lm=lm, n_layers=2, n_heads=6, importance=importance)
    d, hd, t = cfg.hidden_size, cfg.head_dim, 8

    def by_hand(keep: int) -> float:
        kept = torch.zeros(12, dtype=torch.bool)
        kept[importance.flatten().argsort(descending=True, stable=True)[:keep]] = True
        kept = kept.view(2, 2, 3)  # (layer, group, head of group)
        total = 0.0
        for pos in range(t):
            for layer in range(2):
                total += sum(2 * d * hd for g in range(2) if kept[layer, g].any())  # k and v of a group that runs
                total += int(kept[layer].sum()) * (2 * d * hd + 2 * (pos + 1) * hd)  # q, o, QK, AV of each kept head
            total += 2 * 3 * d * cfg.intermediate_size + d * cfg.vocab_size
        dense = sum(2 * (2 * 2 * d * hd + 6 * (2 * d * hd + 2 * (pos + 1) * hd)) + 2 * 3 * d * cfg.intermediate_size
                    + d * cfg.vocab_size for pos in range(t))
        return total / dense

    for keep in (0, 1, 5, 6, 7, 12):
        assert final.static_macs_over_dense(module, scoring, keep) == pytest.approx(by_hand(keep), rel=1e-12)
    target = (by_hand(6) + by_hand(7)) / 2 + 0.1 * (by_hand(7) - by_hand(6))
    heads, nll = final.static_time_shared(module, scoring, target)
    w = (target - by_hand(6)) / (by_hand(7) - by_hand(6))
    assert heads == pytest.approx(6 + w)
    np.testing.assert_allclose(nll, (1 - w) * final.static_scores(module, scoring, 6) + w * final.static_scores(module, scoring, 7))
    assert final.static_time_shared(module, scoring, 1.0)[0] == 12
    assert final.static_time_shared(module, scoring, by_hand(0) / 2)[0] == 0
