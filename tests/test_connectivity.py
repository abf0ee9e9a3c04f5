"""Free head-to-head connectivity (lookahead.graph.connectivity) and the LM-side controls
(lookahead.lm.adapters) against the stock forward and the plain head-graph reference."""

from __future__ import annotations

import pytest
import torch

from lookahead.graph.connectivity import Connectivity, ConnectivityError, load_connectivity, save_connectivity
from lookahead.graph.nodes import head_graph, n_nodes
from lookahead.graph.router_inputs import lm_states
from lookahead.graph.runtime import forward_with_topology
from lookahead.lm.adapters import (OutputLoRA, ValueResidual, load_value_residual, lora_rank_for,
                                   save_value_residual)
from tests.reference_head_graph import reference_forward
from tests.test_runtime import TOL, tiny_olmo2

KINDS = ["static", "dynamic", "both"]


def _setup(n_layers=3, n_heads=2, hidden=32, b=2, t=9, seed=3):
    model = tiny_olmo2(n_layers=n_layers, n_heads=n_heads, hidden=hidden, ffn=48)
    ids = torch.randint(0, 61, (b, t), generator=torch.Generator().manual_seed(seed))
    return model, ids, lm_states(model, ids, "lm")


def _perturb(conn: Connectivity, seed: int = 0, scale: float = 0.7) -> None:
    """Weights far from 1, of both signs: every parameter moved at random."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in conn.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))


@pytest.mark.parametrize("skip", ["full", "query"])
@pytest.mark.parametrize("kind", KINDS)
def test_free_connectivity_starts_at_the_stock_forward(kind, skip):
    model, ids, context = _setup()
    cfg = model.config
    conn = Connectivity(kind, cfg.num_hidden_layers, cfg.num_attention_heads, context.shape[-1])
    gates = torch.ones(*ids.shape, n_nodes(cfg.num_hidden_layers, cfg.num_attention_heads))
    adjacency = conn.connect(head_graph(gates, cfg.num_hidden_layers, cfg.num_attention_heads), context)
    assert adjacency.shape == (*ids.shape, gates.shape[-1], gates.shape[-1])
    with torch.no_grad():
        out = forward_with_topology(model, ids, adjacency, gates, skip=skip)
        ref = model(ids).logits
    assert (out - ref).abs().max().item() <= TOL


@pytest.mark.parametrize("skip", ["full", "query"])
@pytest.mark.parametrize("kind", KINDS)
def test_trained_free_weights_match_the_plain_reference(kind, skip):
    """Weights of both signs and above 1, with heads off at some positions: the runtime against the
    plain head-by-head reference (tests/reference_head_graph.py)."""
    model, ids, context = _setup(seed=5)
    cfg = model.config
    L, H = cfg.num_hidden_layers, cfg.num_attention_heads
    conn = Connectivity(kind, L, H, context.shape[-1])
    _perturb(conn, seed=11)
    gates = (torch.rand(*ids.shape, n_nodes(L, H), generator=torch.Generator().manual_seed(2)) > 0.3).float()
    gates[..., 0] = 1
    with torch.no_grad():
        weights = conn(context)
        adjacency = conn.connect(head_graph(gates, L, H), context)
        assert (weights < 0).any() and (weights > 1.2).any()
        ref = reference_forward(model, ids, adjacency, gates, skip)
        out = forward_with_topology(model, ids, adjacency, gates, skip=skip)
        hard = forward_with_topology(model, ids, adjacency, gates, hard=True, skip=skip)
        plain = forward_with_topology(model, ids, head_graph(gates, L, H), gates, skip=skip)
    assert (out - ref).abs().max().item() <= TOL
    assert (hard - ref).abs().max().item() <= TOL
    assert (out - plain).abs().max().item() > 1e-2  # the weights do change the function


def test_static_weights_are_one_shared_graph_and_dynamic_ones_vary_by_position():
    model, ids, context = _setup()
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    static = Connectivity("static", L, H)
    _perturb(static)
    w = static()
    assert w.shape == (n_nodes(L, H),) * 2
    assert torch.equal(w == 0, ~static.mask)  # nothing off the allowed edges
    dynamic = Connectivity("dynamic", L, H, context.shape[-1])
    _perturb(dynamic)
    wd = dynamic(context)
    assert wd.shape == (*ids.shape, n_nodes(L, H), n_nodes(L, H))
    assert (wd[0, 1] - wd[0, 2]).abs().max() > 1e-3
    assert (wd[..., ~dynamic.mask] == 0).all()
    with pytest.raises(ConnectivityError, match="needs the router's input"):
        dynamic()
    with pytest.raises(ConnectivityError, match="reads 64-dim"):
        dynamic(context[..., :10])
    with pytest.raises(ConnectivityError, match="static, dynamic, both"):
        Connectivity("none", L, H)


def test_gradients_reach_every_kind_at_initialisation():
    model, ids, context = _setup()
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    conn = Connectivity("both", L, H, context.shape[-1])
    gates = torch.ones(*ids.shape, n_nodes(L, H))
    logits = forward_with_topology(model, ids, conn.connect(head_graph(gates, L, H), context), gates, skip="query")
    torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
    assert conn.delta.grad.abs().sum() > 0
    assert conn.to_v.weight.grad.abs().sum() > 0  # V starts at 0 and learns first (then U through it)


def test_dynamic_weights_are_causal():
    """The weights at t read the router's input at t (the embedding at t, the state at t − 1): tokens
    after t change nothing at or before t."""
    model, ids, _ = _setup(t=12)
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    conn = Connectivity("both", L, H, 2 * model.config.hidden_size)
    _perturb(conn)
    changed = ids.clone()
    changed[:, 7:] = (changed[:, 7:] + 5) % 61
    gates = torch.ones(*ids.shape, n_nodes(L, H))
    with torch.no_grad():
        outs = []
        for x in (ids, changed):
            ctx = lm_states(model, x, "lm")
            a = conn.connect(head_graph(gates, L, H), ctx)
            outs.append((a, forward_with_topology(model, x, a, gates, skip="query")))
    assert (outs[0][0][:, :7] - outs[1][0][:, :7]).abs().max() == 0
    assert (outs[0][1][:, :7] - outs[1][1][:, :7]).abs().max() <= TOL
    assert (outs[0][0][:, 8:] - outs[1][0][:, 8:]).abs().max() > 0


def test_connectivity_round_trips_through_its_file(tmp_path):
    conn = Connectivity("both", 2, 3, 16, rank=2, hidden=8)
    _perturb(conn)
    save_connectivity(conn, tmp_path / "c.safetensors")
    back = load_connectivity(tmp_path / "c.safetensors")
    ctx = torch.randn(4, 16)
    assert torch.equal(back(ctx), conn(ctx))
    assert back.config() == conn.config()


def test_value_residual_starts_plain_and_mixes_the_first_layers_values():
    model, ids, _ = _setup()
    with torch.no_grad():
        ref = model(ids).logits
    vr = ValueResidual(model.config.num_hidden_layers).attach(model)
    with torch.no_grad():
        assert (model(ids).logits - ref).abs().max() <= TOL  # λ = (1, 0): the plain model
        vr.mix[1] = torch.tensor([0.0, 1.0])  # layer 2 takes layer 0's values
        seen = {}
        hooks = [model.model.layers[i].self_attn.v_proj.register_forward_hook(
            lambda m, i_, o, i=i: seen.__setitem__(i, o)) for i in (0, 2)]  # after value residual's hooks
        changed = model(ids).logits
        for h in hooks:
            h.remove()
    assert torch.equal(seen[2], seen[0])
    assert (changed - ref).abs().max() > 1e-3
    vr.detach()
    with torch.no_grad():
        assert (model(ids).logits - ref).abs().max() <= TOL  # detached: the plain model again


def test_value_residual_round_trips(tmp_path):
    vr = ValueResidual(4)
    with torch.no_grad():
        vr.mix.add_(torch.randn(3, 2))
    save_value_residual(vr, tmp_path / "v.safetensors")
    assert torch.equal(load_value_residual(tmp_path / "v.safetensors").mix, vr.mix)


def test_output_lora_starts_plain_reaches_every_path_and_merges():
    model, ids, _ = _setup()
    L, H, d = model.config.num_hidden_layers, model.config.num_attention_heads, model.config.hidden_size
    with torch.no_grad():
        ref = model(ids).logits
    model.requires_grad_(False)
    lora = OutputLoRA(L, d, rank=3).attach(model)
    assert sum(p.numel() for p in lora.parameters()) == L * 2 * d * 3
    with torch.no_grad():
        assert (model(ids).logits - ref).abs().max() <= TOL
        for adapter in lora.adapters:
            adapter.b.normal_()
        stock = model(ids).logits
        gates = torch.ones(n_nodes(L, H))
        graph = forward_with_topology(model, ids, head_graph(gates, L, H), gates)  # reads o_proj.weight too
    assert (stock - ref).abs().max() > 1e-3
    assert (graph - stock).abs().max() <= TOL
    OutputLoRA.merge(model)
    with torch.no_grad():
        assert (model(ids).logits - stock).abs().max() <= TOL
    assert lora_rank_for(25_000, 4, 128) == 24


def test_phase2_params_refuse_what_cannot_run():
    from lookahead.core.config import ConfigError, from_dict
    from lookahead.pipeline.phase2.config import Phase2Config

    with pytest.raises(ConfigError, match="value residual runs the stock forward"):
        from_dict(Phase2Config, {"value_residual": True})
    with pytest.raises(ConfigError, match="connectivity"):
        from_dict(Phase2Config, {"connectivity": "dense"})
    with pytest.raises(ConfigError, match="something else must train"):
        from_dict(Phase2Config, {"train_lm": False})
    with pytest.raises(ConfigError, match="keep"):
        from_dict(Phase2Config, {"keep": 0.0})
    assert from_dict(Phase2Config, {"value_residual": True, "keep": 1.0}).value_residual
