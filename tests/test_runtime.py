"""The head-graph runtime against the stock Hugging Face OLMo2 forward (docs/design.md)."""

from __future__ import annotations

import pytest
import torch
from transformers import Olmo2Config, Olmo2ForCausalLM

from lookahead.graph import attention
from lookahead.graph.nodes import allowed_mask, n_nodes, node_index
from lookahead.graph.runtime import TopologyError, default_gates, forward_with_topology
from lookahead.lm.families.registry import FamilyError
from tests.reference_head_graph import reference_forward

TOL = 1e-5


def tiny_olmo2(n_layers=2, n_heads=2, hidden=32, ffn=48, vocab=61, seed=0, **kw) -> Olmo2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Olmo2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=n_layers,
                      num_attention_heads=n_heads, num_key_value_heads=kw.pop("kv_heads", n_heads),
                      max_position_embeddings=64, pad_token_id=None, bos_token_id=None, eos_token_id=None, **kw)
    model = Olmo2ForCausalLM(cfg).eval()
    with torch.no_grad():  # random norm weights, so that QK-norm and post-norms are not identities
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def dense(model) -> torch.Tensor:
    return allowed_mask(model.config.num_hidden_layers, model.config.num_attention_heads).float()


def random_topology(model, b, t, p_off=0.5, seed=0):
    """Per-position hard adjacency and gates: heads off with probability p_off, every allowed edge
    between two heads that run kept with probability 0.7."""
    g_ = torch.Generator().manual_seed(seed)
    cfg = model.config
    n = n_nodes(cfg.num_hidden_layers, cfg.num_attention_heads)
    gates = (torch.rand(b, t, n, generator=g_) > p_off).float()
    gates[..., 0] = 1
    edges = (torch.rand(b, t, n, n, generator=g_) < 0.7).float() * dense(model)
    adjacency = edges * gates[..., :, None] * gates[..., None, :]
    return adjacency, gates


CONFIGS = [
    dict(n_layers=1, n_heads=1, hidden=16, ffn=24),
    dict(n_layers=2, n_heads=2, hidden=32, ffn=48),
    dict(n_layers=3, n_heads=4, hidden=64, ffn=80, rms_norm_eps=1e-5),
    dict(n_layers=2, n_heads=8, hidden=64, ffn=64, tie_word_embeddings=True),
    dict(n_layers=16, n_heads=16, hidden=128, ffn=64),  # the OLMo-2-1B head graph (257 nodes), narrow
]


@pytest.mark.parametrize("kw", CONFIGS, ids=lambda kw: f"{kw['n_layers']}x{kw['n_heads']}")
def test_dense_topology_equals_stock_forward(kw):
    model = tiny_olmo2(**kw)
    ids = torch.randint(0, 61, (2, 11), generator=torch.Generator().manual_seed(1))
    a = dense(model)
    n = a.shape[0]
    with torch.no_grad():
        ref = model(ids).logits
        outs = {
            "shared": forward_with_topology(model, ids, a),
            "shared gates=1": forward_with_topology(model, ids, a, torch.ones(n)),
            "per position": forward_with_topology(model, ids, a.expand(2, 11, n, n)),
            "per position hard": forward_with_topology(model, ids, a.expand(2, 11, n, n), torch.ones(2, 11, n), hard=True),
            "shared hard": forward_with_topology(model, ids, a, torch.ones(n), hard=True),
        }
    for name, out in outs.items():
        assert out.shape == ref.shape
        assert (out - ref).abs().max().item() <= TOL, name


def test_dense_gradients_equal_stock_gradients():
    """Trainable model (phase 2): the rewired loss has the stock loss's weight gradients."""
    model = tiny_olmo2(n_layers=2, n_heads=4, hidden=32, ffn=32).train()
    ids = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(2))

    def grads(loss):
        model.zero_grad()
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    ref = grads(model(ids, labels=ids).loss)
    logits = forward_with_topology(model, ids, dense(model))
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    got = grads(loss)
    for name in ref:
        assert torch.allclose(got[name], ref[name], atol=1e-6, rtol=1e-4), name


def test_gradients_reach_adjacency_gates_and_frozen_model_stays_frozen():
    model = tiny_olmo2(n_layers=2, n_heads=2)
    model.requires_grad_(False)  # phase 1: the LM is frozen
    ids = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(3))
    n = n_nodes(2, 2)
    a = (dense(model) * 0.8).expand(2, 7, n, n).clone().requires_grad_(True)
    g = torch.full((2, 7, n), 0.9).requires_grad_(True)
    forward_with_topology(model, ids, a, g).logsumexp(-1).mean().backward()
    mask = allowed_mask(2, 2)
    assert a.grad[..., mask].abs().gt(0).float().mean() > 0.9  # almost every allowed edge gets gradient
    assert a.grad[..., ~mask].abs().max() == 0
    assert g.grad[..., 1:].abs().gt(0).all()
    assert all(p.grad is None for p in model.parameters())
    # gates of exactly 1 (the dense start) still get their gradient, shared or per position
    for shape in ((n,), (2, 7, n)):
        ones = torch.ones(shape, requires_grad=True)
        adj = dense(model) if len(shape) == 1 else dense(model).expand(2, 7, n, n)
        forward_with_topology(model, ids, adj, ones).logsumexp(-1).mean().backward()
        assert ones.grad[..., 1:].abs().gt(0).all()


def test_vanishing_soft_gates_keep_gradients_finite():
    """Soft training drives gates to 0 and below float32's normal range. A layer whose heads at a
    position are [0, 0, 0, 1e-37] (seen in phase 1) made the QK-norm's gated mean divide by a total
    whose square underflows, and the whole backward pass turned NaN: the gated mean's gradients stay
    finite, and the forward still matches the plain reference."""
    per_head = torch.tensor([300.0, 500.0, 700.0, 1100.0])[:, None, None, None].expand(4, 1, 1, 2)
    w = torch.tensor([0.0, 0.0, 0.0, 1e-37])[:, None, None].requires_grad_(True)
    attention.gated_mean(per_head, w).sum().backward()
    assert torch.isfinite(w.grad).all()

    model = tiny_olmo2(n_layers=2, n_heads=2)
    ids = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(5))
    n = n_nodes(2, 2)
    gates = torch.full((2, 7, n), 0.8)
    gates[:, 3, 1:3] = torch.tensor([0.0, 1e-37])  # layer 0 at position 3
    gates[:, 5, 3:] = torch.tensor([1e-37, 0.0])  # layer 1 at position 5
    gates = gates.requires_grad_(True)
    adjacency = (dense(model) * 0.9).expand(2, 7, n, n).clone().requires_grad_(True)
    logits = forward_with_topology(model, ids, adjacency, gates)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.roll(-1, 1).flatten()).backward()
    assert torch.isfinite(gates.grad).all() and torch.isfinite(adjacency.grad).all()
    with torch.no_grad():
        assert (logits - reference_forward(model, ids, adjacency, gates)).abs().max() <= TOL


def sparse_topology(model, shape, binary: bool, seed: int):
    """Random sparse graph: heads off with probability 0.4, allowed edges kept with probability 0.6
    (weights in (0, 1], some edges out of off heads included), gates binary or in (0.2, 1]."""
    gen = torch.Generator().manual_seed(seed)
    n = n_nodes(model.config.num_hidden_layers, model.config.num_attention_heads)
    on = (torch.rand(*shape, n, generator=gen) > 0.4).float()
    on[..., 0] = 1
    gates = on if binary else on * (0.2 + 0.8 * torch.rand(*shape, n, generator=gen))
    weights = torch.rand(*shape, n, n, generator=gen) * (torch.rand(*shape, n, n, generator=gen) < 0.6)
    return weights * dense(model), gates


@pytest.mark.parametrize("skip", ["full", "query"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per-position"])
@pytest.mark.parametrize("binary", [True, False], ids=["hard-gates", "soft-gates"])
def test_sparse_topologies_match_the_plain_reference(shared, binary, skip):
    """docs/design.md written out head by head and position by position (tests/reference_head_graph.py,
    no code shared with the runtime) against both executions of the runtime, in both skip modes."""
    model = tiny_olmo2(n_layers=3, n_heads=2, hidden=32, ffn=32)
    ids = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(21))
    adjacency, gates = sparse_topology(model, () if shared else (2, 7), binary, seed=22 + shared)
    ref = reference_forward(model, ids, adjacency, gates, skip)
    with torch.no_grad():
        soft = forward_with_topology(model, ids, adjacency, gates, skip=skip)
        hard = forward_with_topology(model, ids, adjacency, gates, hard=True, skip=skip)
    assert (soft - ref).abs().max() <= TOL
    assert (hard - ref).abs().max() <= TOL
    assert (ref - model(ids).logits).abs().max() > 1e-2  # the graph does change the function
    # and the reference is the stock forward on the dense graph
    n = adjacency.shape[-1]
    assert (reference_forward(model, ids, dense(model), torch.ones(n), skip) - model(ids).logits).abs().max() <= TOL
    if not shared:  # the two semantics are different functions of the same per-position graph
        other = reference_forward(model, ids, adjacency, gates, "query" if skip == "full" else "full")
        assert (other - ref).abs().max() > 1e-3


def off_head_at_position_4():
    """A 2 x 2 model on 9 tokens, every head on except head 1 of layer 0 at position 4 (its outgoing
    edges there cut: A[i, j] = g_i A_raw[i, j]), and the same graph with a different input stream
    for that head at position 4. Returns (model, ids, A, g, A', the head's node)."""
    model = tiny_olmo2(n_layers=2, n_heads=2, hidden=32, ffn=32)
    ids = torch.randint(0, 61, (1, 9), generator=torch.Generator().manual_seed(8))
    n = n_nodes(2, 2)
    head = node_index(0, 1, 2)
    a = dense(model).expand(1, 9, n, n).clone()
    g = torch.ones(1, 9, n)
    g[0, 4, head] = 0
    a[0, 4, head, :] = 0
    a2 = a.clone()
    a2[0, 4, 0, head] = 3.0
    return model, ids, a, g, a2, head


def test_query_skip_keeps_the_off_heads_keys_and_values():
    """runtime.skip = query: head j off at t has no output at t, yet its input stream at t still
    reaches position t and later through its key there (the k-norm spans every head's key, as
    in the stock model) and its value (under ``full`` it reaches nothing: the test above)."""
    model, ids, a, g, a2, head = off_head_at_position_4()
    n = g.shape[-1]
    with torch.no_grad():
        for hard in (False, True):
            base = forward_with_topology(model, ids, a, g, hard=hard, skip="query")
            moved = forward_with_topology(model, ids, a2, g, hard=hard, skip="query")
            assert torch.equal(base[0, :4], moved[0, :4])  # causal
            assert (base - moved)[0, 4:].abs().max() > 1e-4  # its key and value at t are read
            dense_g = torch.ones(n)
            assert (forward_with_topology(model, ids, dense(model), dense_g, hard=hard, skip="query")
                    - model(ids).logits).abs().max() <= TOL


def test_hard_execution_equals_soft_execution():
    """Skipping the work of gate-0 pairs computes the same function as masking them softly."""
    model = tiny_olmo2(n_layers=3, n_heads=4, hidden=64, ffn=64)
    ids = torch.randint(0, 61, (3, 13), generator=torch.Generator().manual_seed(4))
    adjacency, gates = random_topology(model, 3, 13)
    with torch.no_grad():
        soft = forward_with_topology(model, ids, adjacency, gates)
        hard = forward_with_topology(model, ids, adjacency, gates, hard=True)
        # non-binary gates on the heads that run: keys carry log g in both executions
        scaled = gates * torch.where(gates > 0, 0.3 + 0.7 * torch.rand(gates.shape, generator=torch.Generator().manual_seed(5)), 1.0)
        soft_s = forward_with_topology(model, ids, adjacency, scaled)
        hard_s = forward_with_topology(model, ids, adjacency, scaled, hard=True)
        # weight on the edges out of heads that are off: o_i = 0 there, so the edges carry nothing
        loose = (torch.rand(adjacency.shape, generator=torch.Generator().manual_seed(9)) * dense(model))
        loose = loose * gates[..., None, :]
        soft_l = forward_with_topology(model, ids, loose, gates)
        hard_l = forward_with_topology(model, ids, loose, gates, hard=True)
        cut = forward_with_topology(model, ids, loose * gates[..., :, None], gates, hard=True)
        # a shared topology with whole heads off
        g1 = torch.ones(adjacency.shape[-1])
        g1[[1, 6, 7, 12]] = 0
        a1 = dense(model) * g1[:, None] * g1[None, :]
        shared_soft = forward_with_topology(model, ids, a1, g1)
        shared_hard = forward_with_topology(model, ids, a1, g1, hard=True)
    assert (soft - hard).abs().max() <= TOL
    assert (soft_s - hard_s).abs().max() <= TOL
    assert (shared_soft - shared_hard).abs().max() <= TOL
    assert (soft_l - hard_l).abs().max() <= TOL and (hard_l - cut).abs().max() <= TOL
    assert (soft - model(ids).logits).abs().max() > 1e-2  # the topology does change the function


def test_hard_execution_has_the_soft_gradients():
    """Straight-through training runs the hard path: its gradients (model, adjacency, the gates
    of the pairs that run) are those of the soft execution of the same graph. A skipped pair's gate
    gets none: the hard path never computes the output that gradient would weigh."""
    model = tiny_olmo2(n_layers=3, n_heads=2, hidden=32, ffn=32).train()
    ids = torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(15))
    adjacency, gates = random_topology(model, 2, 10, p_off=0.4, seed=16)

    def grads(hard):
        model.zero_grad()
        a, g = adjacency.clone().requires_grad_(True), gates.clone().requires_grad_(True)
        forward_with_topology(model, ids, a, g, hard=hard).logsumexp(-1).mean().backward()
        return [a.grad, g.grad * (gates > 0)] + [p.grad for p in model.parameters()]

    soft, hard = grads(False), grads(True)
    assert soft[1][..., 1:].abs().gt(0).float().mean() > 0.5  # gates of running heads do get gradient
    for s, h in zip(soft, hard):
        assert torch.allclose(s, h, atol=1e-6), (s - h).abs().max()


def test_hard_execution_skips_the_work_of_off_pairs(monkeypatch):
    """Projections run on the active (head, position) pairs (plus per-row padding), not all of them."""
    model = tiny_olmo2(n_layers=2, n_heads=4, hidden=32, ffn=32)
    ids = torch.randint(0, 61, (4, 32), generator=torch.Generator().manual_seed(6))
    rows = []
    real = attention.project
    monkeypatch.setattr(attention, "project", lambda x, w: rows.append(x.shape[:-1].numel()) or real(x, w))
    adjacency, gates = random_topology(model, 4, 32, p_off=0.75, seed=7)
    with torch.no_grad():
        forward_with_topology(model, ids, adjacency, gates, hard=True)
    hard_rows = sum(rows)
    rows.clear()
    with torch.no_grad():
        forward_with_topology(model, ids, adjacency, gates)
    soft_rows = sum(rows)
    assert soft_rows == 2 * 2 * 4 * 4 * 32  # q/k/v and o projections for every pair, both layers
    assert hard_rows < 0.5 * soft_rows
    rows.clear()
    g1 = torch.ones(n_nodes(2, 4))
    g1[[1, 2, 3, 5]] = 0  # 3 of layer 0's heads and 1 of layer 1's
    with torch.no_grad():
        forward_with_topology(model, ids, dense(model) * g1[:, None] * g1[None, :], g1, hard=True)
    assert sum(rows) == 2 * (1 + 3) * 4 * 32


def test_off_head_has_no_query_key_or_value():
    """g_j(t) = 0: head j's input at t influences nothing; the soft limit g → 0 approaches it."""
    model, ids, a, g, a2, head = off_head_at_position_4()
    with torch.no_grad():
        base = forward_with_topology(model, ids, a, g)
        moved = forward_with_topology(model, ids, a2, g)
        g_on = g.clone()
        g_on[0, 4, head] = 1
        on = forward_with_topology(model, ids, a, g_on)
        on_moved = forward_with_topology(model, ids, a2, g_on)
        g_eps = g.clone()
        g_eps[0, 4, head] = 1e-7
        near = forward_with_topology(model, ids, a, g_eps)
    assert torch.equal(base, moved)
    assert (on - on_moved)[0, 5:].abs().max() > 1e-3  # the same change matters when the head runs
    assert (near - base).abs().max() < 1e-4


def test_runtime_is_causal():
    """Logits at positions <= t do not depend on tokens or topologies after t (soft and hard)."""
    model = tiny_olmo2(n_layers=3, n_heads=2, hidden=32, ffn=32)
    ids = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(9))
    adjacency, gates = random_topology(model, 2, 12, p_off=0.4, seed=10)
    t = 6
    ids2 = ids.clone()
    ids2[:, t + 1:] = torch.randint(0, 61, (2, 12 - t - 1), generator=torch.Generator().manual_seed(11))
    adj2, gates2 = random_topology(model, 2, 12, p_off=0.4, seed=12)
    adj2[:, : t + 1], gates2[:, : t + 1] = adjacency[:, : t + 1], gates[:, : t + 1]
    with torch.no_grad():
        for hard in (False, True):
            for skip in ("full", "query"):
                a = forward_with_topology(model, ids, adjacency, gates, hard=hard, skip=skip)
                b = forward_with_topology(model, ids2, adj2, gates2, hard=hard, skip=skip)
                assert (a[:, : t + 1] - b[:, : t + 1]).abs().max() <= 1e-6
                assert (a[:, t + 1:] - b[:, t + 1:]).abs().max() > 1e-3


def test_default_gates_follow_incoming_weight():
    a = dense(tiny_olmo2(n_layers=2, n_heads=2))
    a[:, 3] = 0  # head 0 of layer 1 receives nothing
    g = default_gates(a)
    assert g.tolist() == [1, 1, 1, 0, 1]


def test_bfloat16_forward_tracks_stock():
    model = tiny_olmo2(n_layers=2, n_heads=4, hidden=64, ffn=64).to(torch.bfloat16)
    ids = torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(13))
    with torch.no_grad():
        ref = model(ids).logits.float()
        out = forward_with_topology(model, ids, dense(model))
        adjacency, gates = random_topology(model, 2, 10, seed=14)
        hard = forward_with_topology(model, ids, adjacency, gates, hard=True)
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max() <= 0.05 * ref.abs().max()
    assert torch.isfinite(hard).all()


def test_bad_inputs_are_refused_with_clear_errors():
    model = tiny_olmo2(n_layers=2, n_heads=2)
    ids = torch.zeros(1, 4, dtype=torch.long)
    a = dense(model)
    with pytest.raises(TopologyError, match=r"\(5, 5\) shared or \(1, 4, 5, 5\)"):
        forward_with_topology(model, ids, a[:4, :4])
    bad = a.clone()
    bad[3, 1] = 1.0  # a layer-1 head feeding a layer-0 head
    with pytest.raises(TopologyError, match="not allowed"):
        forward_with_topology(model, ids, bad)
    with pytest.raises(TopologyError, match="gates must have shape"):
        forward_with_topology(model, ids, a, torch.ones(4))
    nan = a.clone()
    nan[0, 3] = float("nan")
    with pytest.raises(TopologyError, match=r"non-finite value \(nan\).*edge \(0, 3\)"):
        forward_with_topology(model, ids, nan)
    with pytest.raises(TopologyError, match="non-finite"):
        inf = a.clone().expand(1, 4, 5, 5).clone()
        inf[0, 2, 1, 4] = float("inf")
        forward_with_topology(model, ids, inf)
    for bad in (1.5, -0.1, float("nan")):
        g = torch.ones(5)
        g[2] = bad
        with pytest.raises(TopologyError, match=r"gates must lie in \[0, 1\]"):
            forward_with_topology(model, ids, a, g)
    with pytest.raises(FamilyError, match="^num_key_value_heads: the OLMo2 family runs one key/value head"):
        forward_with_topology(tiny_olmo2(n_layers=1, n_heads=4, kv_heads=2), ids, dense(tiny_olmo2(n_layers=1, n_heads=4)))
    with pytest.raises(FamilyError, match="^model_type: .*Linear"):
        forward_with_topology(torch.nn.Linear(2, 2), ids, a)
