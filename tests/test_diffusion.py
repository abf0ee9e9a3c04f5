"""The diffusion head (docs/pipeline.md): the noise chain against closed forms, the sampler against a known
distribution, the denoiser at 16 × 16 heads, causality, evaluation helpers and the stage on tiny inputs."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.pairs import PairsDataError, load_pairs
from lookahead.core.config import from_dict
from lookahead.core.errors import ConfigError
from lookahead.core.seeds import one_run
from lookahead.graph.denoiser import (
    Denoiser,
    DenoiserConfig,
    DiffusionError,
    alpha_bar,
    load_denoiser,
    posterior_probs,
    q_probs,
)
from lookahead.graph.nodes import allowed_mask, n_edges
from lookahead.graph.predictor import PredictorConfig, StructurePredictor, cascade, save_predictor
from lookahead.lm.nll import token_nll
from lookahead.pipeline.diffusion.build import HEADLINE, DiffusionConfig, PairFeatures, build_diffusion
from lookahead.pipeline.diffusion.evaluation import Sampler, hamming, mode_recall
from lookahead.pipeline.pairs import PairsConfig, build_pairs


def step_matrix(alpha: float, m: float) -> np.ndarray:
    """One forward transition of one edge, rows = from state (0, 1), columns = to state."""
    return alpha * np.eye(2) + (1 - alpha) * np.array([[1 - m, m], [1 - m, m]])


def test_closed_form_q_equals_the_chain_of_one_step_transitions():
    times = np.linspace(0, 1, 41)
    abar = alpha_bar(torch.tensor(times)).numpy()
    for m in (0.03, 0.2, 0.7):
        chain = np.eye(2)
        for k in range(1, len(times)):
            chain = chain @ step_matrix(abar[k] / abar[k - 1] if abar[k - 1] > 0 else 0.0, m)
            for a0 in (0, 1):
                closed = q_probs(torch.tensor(float(a0)), torch.tensor(abar[k]), torch.tensor(m)).item()
                assert closed == pytest.approx(chain[a0, 1], abs=1e-6)
    assert abar[0] == 1.0 and abar[-1] < 1e-6 and (np.diff(abar) <= 0).all()  # cosine: 1 → 0, decreasing


def test_posterior_with_a_known_x0_is_bayes_rule():
    rng = np.random.default_rng(0)
    for _ in range(20):
        m, (ab_s, ab_t) = rng.uniform(0.02, 0.98), np.sort(rng.uniform(0.05, 1.0, 2))[::-1]
        to_s = step_matrix(ab_s, m)  # q(a_s | a_0): a chain from 1 to ᾱ_s
        s_to_t = step_matrix(ab_t / ab_s, m)
        for a0 in (0, 1):
            for a_t in (0, 1):
                joint = to_s[a0, :] * s_to_t[:, a_t]  # P(a_s = k, a_t | a_0)
                expected = joint[1] / joint.sum()
                got = posterior_probs(torch.tensor(float(a_t)), torch.tensor(float(a0)), torch.tensor(ab_t),
                                      torch.tensor(ab_s), torch.tensor(m)).item()
                assert got == pytest.approx(expected, abs=1e-6)


class OracleDenoiser(Denoiser):
    """p̂(a_0 | a_t) computed exactly for a known mixture of topologies (no learning)."""

    def __init__(self, modes: torch.Tensor, weights: torch.Tensor, marginal: torch.Tensor):
        super().__init__(DenoiserConfig(hidden=4, layers=1, rank=1, cond_hidden=4), 2, 2, 1, 0, marginal)
        self.modes, self.weights = modes, weights

    def forward(self, a_t, t, context, geo=None):
        abar = alpha_bar(t.float(), self.cfg.schedule_offset)[:, None, None]  # (B, 1, 1)
        q1 = q_probs(self.modes[None].float(), abar, self.marginal)  # (B, K, E): q(a_t = 1 | mode)
        like = torch.where(a_t[:, None] > 0.5, q1, 1 - q1).log().sum(-1) + self.weights.log()  # (B, K)
        post = like.softmax(-1)
        p0 = (post @ self.modes.float()).clamp(1e-6, 1 - 1e-6)
        return torch.logit(p0)


def test_ancestral_sampling_draws_a_known_mixture_of_graphs():
    """With the exact p̂, the x0-parameterised sampler reproduces the data distribution."""
    e = n_edges(2, 2)  # 8 edges
    modes = torch.tensor([[1, 1, 0, 0, 1, 0, 0, 1], [0, 1, 1, 0, 0, 1, 1, 0]])
    weights = torch.tensor([0.7, 0.3])
    marginal = (weights @ modes.float())
    oracle = OracleDenoiser(modes, weights, marginal)
    gen = torch.Generator().manual_seed(0)
    samples = oracle.sample(torch.zeros(4000, 1), None, steps=50, generator=gen)
    assert samples.shape == (4000, e)
    is_mode = (samples[:, None, :] == modes[None].float()).all(-1)  # (S, K)
    assert is_mode.any(-1).float().mean() > 0.97  # almost every sample is one of the two graphs
    share = is_mode.float().mean(0)
    assert share[0] == pytest.approx(0.7, abs=0.03) and share[1] == pytest.approx(0.3, abs=0.03)


def test_denoiser_at_16_by_16_heads_runs_forward_and_backward():
    torch.manual_seed(0)
    e = n_edges(16, 16)
    model = Denoiser(DenoiserConfig(hidden=16, layers=2, rank=8, cond_hidden=32), 16, 16, 24, 5, torch.full((e,), 0.2))
    a0 = (torch.rand(3, e) < 0.2).float()
    t = torch.tensor([0.1, 0.5, 0.9])
    logits = model(model.noisy(a0, t), t, torch.randn(3, 24), torch.randn(3, 5))
    assert logits.shape == (3, e) and torch.isfinite(logits).all()
    torch.nn.functional.binary_cross_entropy_with_logits(logits, a0).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert model.blocks[0].mix[0].weight.grad.abs().sum() > 0  # gradient reaches the message passing


def test_samples_are_allowed_graphs_and_execute_through_the_cascade():
    torch.manual_seed(0)
    model = Denoiser(DenoiserConfig(hidden=8, layers=1, rank=2, cond_hidden=8), 3, 2, 5, 0, torch.full((n_edges(3, 2),), 0.3))
    context = torch.randn(6, 5)
    one = model.sample(context, None, 5, torch.Generator().manual_seed(1))
    two = model.sample(context, None, 5, torch.Generator().manual_seed(1))
    assert torch.equal(one, two) and set(one.unique().tolist()) <= {0.0, 1.0}  # seeded, hard
    adjacency, gates = model.executed(one)
    mask = allowed_mask(3, 2)
    expected = cascade(to_dense_bits(one, mask), 3, 2, hard=True)
    assert torch.equal(adjacency, expected[0]) and torch.equal(gates, expected[1])
    assert (adjacency[:, ~mask] == 0).all()  # acyclic: only allowed edges


def to_dense_bits(bits, mask):
    dense = torch.zeros(bits.shape[0], *mask.shape)
    dense[:, mask] = bits
    return dense


def test_samples_at_t_do_not_depend_on_later_tokens(phase_inputs, tiny_tokenizer):
    """The lookahead contract for the diffusion head: contexts from the real `base` encoder of a prefix-changed
    window; under a fixed seed the samples at positions <= t are unchanged."""
    from lookahead.lm.encoders import load_context_encoder

    encoder = load_context_encoder("base", phase_inputs["base"], tiny_tokenizer, 16, False, device="cpu")
    torch.manual_seed(0)
    model = Denoiser(DenoiserConfig(hidden=8, layers=2, rank=2, cond_hidden=8), 2, 2, encoder.dim, 0,
                     torch.full((n_edges(2, 2),), 0.4))
    ids = torch.randint(2, len(tiny_tokenizer), (1, 12))
    changed = ids.clone()
    t = 5
    changed[0, t + 1:] = torch.randint(2, len(tiny_tokenizer), (12 - t - 1,))
    assert not torch.equal(ids, changed)
    ctx, ctx2 = encoder.encode(ids)[0], encoder.encode(changed)[0]  # (T, C)
    assert not torch.allclose(ctx[t + 1:], ctx2[t + 1:])
    one = model.sample(ctx, None, 6, torch.Generator().manual_seed(3))
    two = model.sample(ctx2, None, 6, torch.Generator().manual_seed(3))
    assert torch.equal(one[: t + 1], two[: t + 1])


def test_hamming_matches_a_plain_count():
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 2, (4, 3, 10)), rng.integers(0, 2, (4, 5, 10))
    expected = (x[:, :, None, :] != y[:, None, :, :]).sum(-1)
    assert np.array_equal(hamming(torch.from_numpy(x), torch.from_numpy(y)).numpy(), expected)


class _Pairs:
    """The fields of a PairSet that mode_recall reads."""

    def __init__(self, rows, edges, heldout):
        self.rows, self.edges, self.heldout = np.asarray(rows), torch.as_tensor(edges), np.asarray(heldout)


def test_mode_recall_counts_kept_topologies_a_sample_comes_near():
    mask = allowed_mask(2, 2)
    e = int(mask.sum())
    a = torch.zeros(e)
    a[[0, 1, 4]] = 1  # source → heads 1, 2 of layer 0; one edge into layer 1
    b = torch.zeros(e)
    b[[0, 2, 5, 6]] = 1  # 5 bits from a
    near_a = a.clone()
    near_a[7] = 1  # 1 bit from a
    pairs = _Pairs(rows=[10, 10, 11, 12, 12], edges=torch.stack([a, b, a, a, b]).to(torch.uint8), heldout=[0, 1, 2, 3, 4])

    def always(topology):
        def draw(contexts, geo, router):
            bits = topology.expand(contexts.shape[0], -1)
            return to_dense_bits(bits, mask), torch.ones(contexts.shape[0], 5)
        return Sampler("fixed", draw)

    features = lambda rows: (torch.zeros(len(rows), 3), None)  # noqa: E731
    predictor = type("P", (), {"n_layers": 2, "n_heads": 2, "geo_dim": 0})()
    out = mode_recall({"a": always(near_a), "b": always(b)}, predictor, pairs, features, k=2, radius=1, device="cpu")
    assert out["positions"] == 2 and out["topologies"] == 4  # rows 10 and 12 hold two topologies; 11 only one
    assert out["a"]["mode_recall"] == 0.5  # a is within 1 bit of near_a, b is 6 bits away
    assert out["b"]["mode_recall"] == 0.5
    out = mode_recall({"a": always(near_a)}, predictor, pairs, features, k=2, radius=0, device="cpu")
    assert out["a"]["mode_recall"] == 0.0


def test_config_is_validated_with_the_key_named():
    with pytest.raises(ConfigError, match="heldout_fraction"):
        from_dict(DiffusionConfig, {"heldout_fraction": 1.0})
    with pytest.raises(ConfigError, match="denoiser.rank"):
        from_dict(DiffusionConfig, {"denoiser": {"rank": 0}})
    with pytest.raises(ConfigError, match="sample_steps"):
        from_dict(DiffusionConfig, {"sample_steps": 0})


@pytest.fixture(scope="module")
def stage_run(phase_inputs, tmp_path_factory):
    """Pairs of a coin-flip predictor on the tiny inputs, and the diffusion stage trained on them."""
    d = tmp_path_factory.mktemp("diffusion")
    cache = ContextCache(phase_inputs["contexts"])
    torch.manual_seed(0)
    predictor = StructurePredictor.from_init(PredictorConfig.cascade(rank=2, hidden=8, init_bias=1.0), phase_inputs["init"],
                                             cache.dim)
    save_predictor(predictor, d / "predictor.safetensors")
    build_pairs(PairsConfig(target="beats_dense", sequences=8, samples=6, keep=3, batch_size=4, approx_positions=0, device="cpu"),
                phase_inputs["base"], phase_inputs["contexts"], phase_inputs["init"], d / "predictor.safetensors",
                d / "pairs")
    cfg = from_dict(DiffusionConfig, {
        "denoiser": {"hidden": 8, "layers": 1, "rank": 2, "cond_hidden": 8}, "sample_steps": 3, "eval_samples": 3,
        "recall_radius": 1, "heldout_fraction": 0.25, "eval_batch_size": 2, "val_pairs": 32,
        "train": {"steps": 4, "batch_size": 8, "warmup_steps": 1, "eval_every": 2, "log_every": 1,
                  "checkpoint_every": 2, "device": "cpu"}})
    report, result, module = build_diffusion(cfg, phase_inputs["base"], phase_inputs["contexts"], phase_inputs["init"],
                                             d / "predictor.safetensors", d / "pairs", d / "out", d / "ckpt")
    return cfg, report, result, module, d, cache


def test_stage_reports_every_headline_figure_consistently(stage_run, phase_inputs):
    cfg, report, result, module, d, cache = stage_run
    assert one_run(HEADLINE) <= set(report)
    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"], dtype=torch.float32).eval()
    windows = torch.from_numpy(cache.windows("val").astype(np.int64))
    with torch.no_grad():
        dense = token_nll(lm(input_ids=windows[:, :-1]).logits, windows[:, 1:]).mean().item()
    assert report["dense_nll"] == pytest.approx(dense, rel=1e-5)
    for name in ("diffusion", "baseline", "explore"):
        s = report["samplers"][name]
        assert s["best_of_k_nll"] <= s["sample_nll"] + 1e-6  # the best of K is never worse than their mean
        assert 0.0 <= s["density"] <= 1.0 and 0.0 <= s["active_head_fraction"] <= 1.0
        assert s["mode_recall"] is None or 0.0 <= s["mode_recall"] <= 1.0
    pairs = load_pairs(d / "pairs", cache.context_length, cfg.heldout_fraction, cfg.seed)
    _, counts = np.unique(pairs.rows[pairs.heldout], return_counts=True)
    assert report["recall_positions"] == int((counts >= 2).sum())
    assert report["pairs_train"] + report["pairs_heldout"] == len(pairs.rows)
    assert not set(pairs.rows[pairs.train] // cache.context_length) & set(pairs.rows[pairs.heldout] // cache.context_length)
    assert report["pairs_density"] == pytest.approx(float(pairs.edge_fraction.mean()))
    assert [r["step"] for r in result.eval_curve] == [2, 4]
    assert not (d / "ckpt").exists() or not any((d / "ckpt").iterdir())  # removed after success


def test_saved_head_reloads_with_its_config_and_the_same_logits(stage_run):
    cfg, _, _, module, d, cache = stage_run
    loaded, config = load_denoiser(d / "out")
    assert config["denoiser"]["hidden"] == 8 and config["diffusion"]["sample_steps"] == 3
    assert json.loads((d / "out" / "config.json").read_text()) == config
    features = PairFeatures(cache, module.features.geo)
    contexts, geo = features(module.pairs.rows[:5])
    a_t = module.pairs.edges[:5].float()
    t = torch.full((5,), 0.5)
    module.model.cpu().eval()
    assert torch.equal(loaded(a_t, t, contexts, geo), module.model(a_t, t, contexts, geo))


def test_a_head_without_geometric_features_is_judged_beside_a_predictor_with_them(stage_run, phase_inputs, tmp_path):
    cfg, _, _, _, d, _ = stage_run
    cfg = dataclasses.replace(cfg, geo_features=False, train=dataclasses.replace(cfg.train, steps=2, eval_every=2))
    report, _, module = build_diffusion(cfg, phase_inputs["base"], phase_inputs["contexts"], phase_inputs["init"],
                                        d / "predictor.safetensors", d / "pairs", tmp_path / "out")
    assert module.model.geo_dim == 0 and load_denoiser(tmp_path / "out")[1]["geo_dim"] == 0
    assert one_run(HEADLINE) <= set(report)


def test_unusable_inputs_are_refused_with_the_fix(stage_run, tmp_path):
    cfg, _, _, module, d, cache = stage_run
    with pytest.raises(PairsDataError, match="dvc repro pairs"):
        load_pairs(tmp_path / "missing", cache.context_length, 0.2, 0)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "pairs.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(PairsDataError, match="dvc checkout pairs"):
        load_pairs(tmp_path / "bad", cache.context_length, 0.2, 0)
    with pytest.raises(DiffusionError, match="dvc repro diffusion"):
        load_denoiser(tmp_path)
