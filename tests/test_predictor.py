"""The structure predictor and its cascading gate (docs/design.md)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from lookahead.core.config import from_dict
from lookahead.core.errors import ConfigError
from lookahead.graph.nodes import allowed_mask, n_nodes
from lookahead.graph.predictor import (
    PredictorConfig,
    PredictorError,
    StructurePredictor,
    cascade,
    logistic_noise,
)
from lookahead.graph.runtime import forward_with_topology
from lookahead.graph.scoring import geo_features
from tests.test_runtime import tiny_olmo2


def test_cascade_matches_closed_form():
    """One head per layer, 2 layers: nodes 0 (source), 1 (layer 0), 2 (layer 1)."""
    k, a, b, c = 3.0, 0.4, 0.2, 0.7
    a_raw = torch.zeros(3, 3)
    a_raw[0, 1], a_raw[0, 2], a_raw[1, 2] = a, b, c
    adj, g = cascade(a_raw, 2, 1, k=k)
    g1 = 1 - math.exp(-k * a)
    g2 = 1 - math.exp(-k * (b + g1 * c))
    assert torch.allclose(g, torch.tensor([1.0, g1, g2]))
    assert torch.allclose(adj, torch.tensor([[0, a, b], [0, 0, g1 * c], [0, 0, 0]]))


def test_gate_is_exactly_zero_without_incoming_weight_and_closes_downstream():
    a_raw = allowed_mask(3, 2).float() * 0.9
    a_raw[:, 1] = 0  # layer-0 head 0 receives nothing
    a_raw[:, 4] = 0
    a_raw[1, 4] = 0.9  # layer-1 head 1 is fed by that head only
    adj, g = cascade(a_raw, 3, 2)
    assert g[1] == 0 and g[4] == 0  # exactly, not merely small
    assert adj[1].abs().max() == 0 and adj[4].abs().max() == 0  # a closed head feeds nobody
    assert (g[[2, 3, 5, 6]] > 0.9).all()


def test_hard_cascade_is_binary_with_straight_through_gradient():
    a_raw = allowed_mask(2, 2).float() * 0.7
    a_raw[:, 2] = 0  # layer-0 head 1 receives nothing
    a_raw[:, 4] = 0
    a_raw[2, 4] = 0.7  # layer-1 head 1 only from it
    a_raw.requires_grad_(True)
    adj, g = cascade(a_raw, 2, 2, hard=True)
    assert g.tolist() == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert set(adj.unique().tolist()) == {0.0, 1.0}
    g.sum().backward()
    assert a_raw.grad.abs().sum() > 0


def test_hard_cascade_gradient_is_the_soft_cascade_gradient():
    """Straight-through at the soft values: the gates' backward pass is the soft cascade's, so an
    off head (every incoming edge below 1/2, s = 0, g = 0) gets the soft gradient, not the vanishing
    surrogate k·e^(−k·s) at the hard count."""
    a_raw = allowed_mask(3, 2).float() * 0.9
    a_raw[:, 5] = 0.3 * allowed_mask(3, 2).float()[:, 5]  # layer-2 head 0: hard off
    grads = []
    for hard in (False, True):
        x = a_raw.clone().requires_grad_(True)
        adj, g = cascade(x, 3, 2, k=4.0, hard=hard)
        (g * torch.arange(7.0)).sum().backward()  # any loss of the gates
        grads.append(x.grad)
        if hard:
            assert g[5] == 0
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
    assert grads[1][:, 5].abs().max() > 0.01  # the off head's incoming edges learn


def test_cascade_batches_over_positions():
    a_raw = torch.rand(2, 3, 9, 9) * allowed_mask(2, 4)
    adj, g = cascade(a_raw, 2, 4)
    one_adj, one_g = cascade(a_raw[1, 2], 2, 4)
    assert torch.allclose(adj[1, 2], one_adj) and torch.allclose(g[1, 2], one_g)
    with pytest.raises(PredictorError, match=r"\(9, 9\)"):
        cascade(a_raw[..., :8, :8], 2, 4)


def _predictor(**kw) -> StructurePredictor:
    torch.manual_seed(0)
    cfg = PredictorConfig.cascade(rank=3, hidden=16, **kw)
    return StructurePredictor(cfg, n_layers=2, n_heads=2, context_dim=6, geo_dim=0)


def test_predictor_starts_near_dense_from_u0_v0():
    torch.manual_seed(0)
    n = n_nodes(2, 2)
    u0, v0 = torch.randn(n, 3) * 0.3, torch.randn(n, 3) * 0.3
    p = StructurePredictor(PredictorConfig.cascade(rank=3, hidden=16, init_bias=4.0, gate_k=4.0), 2, 2, 6, u0=u0, v0=v0).eval()
    ctx = torch.randn(4, 5, 6)
    z = p.logits(ctx)
    assert torch.allclose(z, (u0 @ v0.T + 4.0).expand(4, 5, n, n), atol=1e-6)  # Z = B at initialisation
    adj, g = p(ctx)
    mask = allowed_mask(2, 2)
    assert adj[..., ~mask].abs().max() == 0
    assert adj[..., mask].min() > 0.8 and (g > 0.97).all()
    with pytest.raises(PredictorError, match="rerun the init stage"):
        StructurePredictor(PredictorConfig.cascade(rank=2), 2, 2, 6, u0=u0, v0=v0)


def test_noise_only_in_training_and_logistic():
    p = _predictor()
    ctx = torch.randn(3, 6)
    p.eval()
    assert torch.equal(p(ctx)[0], p(ctx)[0])
    p.train()
    gen = torch.Generator().manual_seed(0)
    assert not torch.equal(p(ctx, generator=gen)[0], p(ctx, generator=gen)[0])
    # P(z + L > 0) = σ(z): the Gumbel-max property of logistic noise
    z = torch.tensor([-1.5, 0.0, 2.0])
    noise = logistic_noise((200_000, 3), generator=torch.Generator().manual_seed(1))
    assert torch.allclose(((z + noise) > 0).float().mean(0), torch.sigmoid(z), atol=5e-3)


def test_hard_predictor_is_binary_and_trains_through_straight_through():
    p = _predictor(hard=True).train()
    adj, g = p(torch.randn(4, 6))
    mask = allowed_mask(2, 2)
    assert set(adj[..., mask].unique().tolist()) <= {0.0, 1.0}
    assert set(g.unique().tolist()) <= {0.0, 1.0}
    (adj.sum() + g.sum()).backward()
    assert p.static.grad[mask].abs().sum() > 0


def test_both_factors_learn_from_zero_v():
    """V's output layer starts at zero (Z = B); a step moves it, and then U too."""
    p = _predictor().eval()
    opt = torch.optim.SGD(p.parameters(), lr=0.5)
    ctx = torch.randn(8, 6)
    for _ in range(2):
        opt.zero_grad()
        adj, _ = p(ctx)
        adj.sum().neg().backward()  # any loss of the edges
        opt.step()
    assert p.to_v.weight.abs().sum() > 0
    z = p.logits(ctx)
    assert (z - p.static).abs().max() > 1e-4  # per-position part now non-zero


def test_from_init_reads_the_init_stage_file(tmp_path):
    n = n_nodes(2, 2)
    u0, v0 = torch.randn(n, 3), torch.randn(n, 3)
    path = tmp_path / "init.safetensors"
    save_file({"U0": u0, "V0": v0, "geo_table": torch.randn(50, 4), "geo_mask": torch.ones(50)}, str(path),
              metadata={"config": json.dumps({"n_layers": 2})})
    p = StructurePredictor.from_init(PredictorConfig.cascade(rank=3, init_bias=1.0), path, context_dim=6)
    assert (p.n_layers, p.n_heads, p.geo_dim) == (2, 2, 5)
    assert torch.allclose(p.static, u0 @ v0.T + 1.0)
    with pytest.raises(PredictorError, match="geometric features"):
        p.logits(torch.randn(2, 6))
    with pytest.raises(PredictorError, match="run `dvc repro init`"):
        StructurePredictor.from_init(PredictorConfig.cascade(rank=3), tmp_path / "missing.safetensors", 6)


def test_config_is_validated():
    with pytest.raises(ConfigError, match="tau"):
        from_dict(PredictorConfig, {"tau": 0.0})
    with pytest.raises(ConfigError, match="gate_k"):
        from_dict(PredictorConfig, {"gate_k": -1.0})
    with pytest.raises(ConfigError, match="unknown"):
        from_dict(PredictorConfig, {"rnak": 4})


@pytest.mark.parametrize("hard", [False, True])
def test_topology_and_logits_at_t_ignore_later_tokens(hard):
    """The lookahead contract: change the tokens after t; the predicted graph and the logits at s <= t are unchanged.

    Context features come from a causal encoder (a tiny OLMo2's last hidden state, one causal pass
    like Qwen3-Embedding's last-token pooling) plus the per-token geometric features.
    """
    lm = tiny_olmo2(n_layers=2, n_heads=2, hidden=32, ffn=32)
    encoder = tiny_olmo2(n_layers=1, n_heads=2, hidden=16, ffn=16, seed=1)
    geo_table, geo_mask = torch.randn(61, 4), (torch.rand(61) > 0.5).float()
    torch.manual_seed(0)
    cfg = PredictorConfig.cascade(rank=2, hidden=16, hard=hard, init_bias=0.0)
    predictor = StructurePredictor(cfg, 2, 2, context_dim=16, geo_dim=5).eval()
    with torch.no_grad():  # move V off zero so the graph depends on the context
        predictor.to_v.weight.normal_(0, 1.0)

    def run(ids):
        with torch.no_grad():
            ctx = encoder.model(ids).last_hidden_state
            adj, g = predictor(ctx, geo_features(ids, geo_table, geo_mask))
            return adj, g, forward_with_topology(lm, ids, adj, g, hard=hard)

    ids = torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(2))
    t = 4
    ids2 = ids.clone()
    ids2[:, t + 1:] = (ids[:, t + 1:] + 7) % 61
    (adj, g, logits), (adj2, g2, logits2) = run(ids), run(ids2)
    assert torch.equal(adj[:, : t + 1], adj2[:, : t + 1]) and torch.equal(g[:, : t + 1], g2[:, : t + 1])
    assert (logits[:, : t + 1] - logits2[:, : t + 1]).abs().max() <= 1e-6
    assert not torch.equal(adj[:, t + 1:], adj2[:, t + 1:])  # the later graphs do follow the context
