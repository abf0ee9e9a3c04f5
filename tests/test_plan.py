"""The execution plan of head-gate topologies (lookahead.graph.plan) and generation with its KV cache
(lookahead.graph.generate), against the plain reference (tests/reference_head_graph.py), the stock Hugging
Face forward and a no-cache loop."""

from __future__ import annotations

import json

import pytest
import torch

from lookahead.graph.generate import GenerateError, Router, generate, generate_dense, main, self_consistent
from lookahead.graph.nodes import baseline_graph, head_graph, n_nodes
from lookahead.graph.plan import KVCache, execute, gated_forward, standard_stream
from lookahead.graph.predictor import PredictorConfig, StructurePredictor, save_predictor
from lookahead.graph.router_inputs import states_before
from lookahead.graph.runtime import TopologyError, forward_with_topology
from tests.conftest import save_tiny_lm
from tests.reference_head_graph import reference_forward
from tests.test_runtime import TOL, tiny_olmo2

L, H = 3, 4
N = n_nodes(L, H)


def gates_of(shape, p_off: float, seed: int) -> torch.Tensor:
    g = (torch.rand(*shape, N, generator=torch.Generator().manual_seed(seed)) > p_off).float()
    g[..., 0] = 1
    return g


@pytest.fixture(scope="module")
def model():
    return tiny_olmo2(n_layers=L, n_heads=H, hidden=32, ffn=32)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("skip", ["full", "query"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per-position"])
@pytest.mark.parametrize("p_off", [0.5, 0.85], ids=["half-off", "mostly-off"])  # mostly off: query mode packs
def test_plan_equals_the_plain_reference(model, ids, skip, shared, p_off):
    g = gates_of(() if shared else ids.shape, p_off, seed=3 + shared)
    a = baseline_graph(g, L, H, skip)
    ref = reference_forward(model, ids, a, g, skip)
    assert standard_stream(a, g, L, H, skip)
    assert (gated_forward(model, ids, g, skip).logits - ref).abs().max() <= TOL
    with torch.no_grad():
        assert (execute(model, ids, a, g, skip) - ref).abs().max() <= TOL
        assert (execute(model, ids, head_graph(g, L, H), g, skip) - ref).abs().max() <= TOL  # edges into off heads
    assert (ref - model(ids).logits).abs().max() > 1e-2


@pytest.mark.parametrize("skip,shared", [("full", True), ("query", True), ("query", False)],
                         ids=["full-shared", "query-shared", "query-per-position"])
def test_training_through_the_plan_has_the_reference_gradients(model, ids, skip, shared):
    """The static control and phase 2's frozen router train the LM through ``execute``: the plan's
    code with gradient enabled. Every weight's gradient equals the general runtime's (whose own
    gradients tests/test_runtime.py checks; the plain reference runs without gradient)."""
    g = gates_of(() if shared else ids.shape, 0.5, seed=7)
    a = head_graph(g, L, H)
    grads = []
    for run in (lambda: execute(model, ids, a, g, skip), lambda: forward_with_topology(model, ids, a, g, skip=skip)):
        model.zero_grad(set_to_none=True)
        logits = run()
        assert logits.requires_grad
        logits.float().logsumexp(-1).mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    model.zero_grad(set_to_none=True)
    fast, ref = grads
    assert fast.keys() == ref.keys() and len(ref) > 10
    for name in ref:
        assert (fast[name] - ref[name]).abs().max() <= TOL, name
    assert ref["model.layers.0.self_attn.q_proj.weight"].abs().max() > 0  # a real gradient, not zeros on both sides


@pytest.mark.parametrize("skip", ["full", "query"])
def test_plan_with_every_head_on_is_the_stock_forward(model, ids, skip):
    out = gated_forward(model, ids, torch.ones(N), skip)
    with torch.no_grad():
        stock = model(ids, output_hidden_states=True)
    assert (out.logits - stock.logits).abs().max() <= TOL
    assert (out.hidden - stock.hidden_states[-1]).abs().max() <= TOL  # the final normed state


def test_graphs_that_are_not_the_standard_stream_go_to_the_general_runtime(model, ids):
    g = gates_of(ids.shape, 0.5, seed=5)
    a = baseline_graph(g, L, H, "full")
    partial = a.clone()
    partial[..., 0, 1 + H] = 0.5  # one head of layer 1 reads half the embedding
    assert not standard_stream(partial, g, L, H, "full")
    assert not standard_stream(a, g, L, H, "query")  # query mode: an off head's key reads its input too
    assert not standard_stream(a, g * 0.5, L, H, "full")  # soft gates
    with torch.no_grad():
        for adjacency, skip in ((partial, "full"), (a, "query")):
            assert torch.equal(execute(model, ids, adjacency, g, skip),
                               forward_with_topology(model, ids, adjacency, g, hard=True, skip=skip))
    # a gradient is wanted: the general runtime (the plan is inference only)
    w = torch.ones(N, requires_grad=True)
    execute(model, ids, head_graph(torch.ones(N), L, H), w, "full").sum().backward()
    assert w.grad is not None


@pytest.mark.parametrize("skip", ["full", "query"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per-position"])
def test_kv_cache_decoding_equals_the_forward_over_the_whole_sequence(model, ids, skip, shared):
    g = gates_of(() if shared else ids.shape, 0.6, seed=9)
    whole = gated_forward(model, ids, g, skip).logits
    for prefill in (1, 6):
        cache = KVCache(model, 2, 12, skip)
        steps = [gated_forward(model, ids[:, :prefill], g if shared else g[:, :prefill], skip, cache).logits]
        for t in range(prefill, ids.shape[1]):
            steps.append(gated_forward(model, ids[:, t:t + 1], g if shared else g[:, t:t + 1], skip, cache).logits)
        assert (torch.cat(steps, dim=1) - whole).abs().max() <= TOL
        on = (g[..., 1:] > 0).view(*g.shape[:-1], L, H)
        if skip == "full":  # a head off at a step stores nothing for it
            ran = on.expand(2, 10, L, H).sum(1).permute(1, 0, 2) if shared else on.sum(1).permute(1, 0, 2)
            assert torch.equal(cache.stored, ran)
            assert cache.nbytes() < 0.6 * KVCache(model, 2, 12, skip).kv[..., :10, :].nbytes
        else:
            assert bool((cache.stored == 10).all())


def test_cache_misuse_is_refused(model, ids):
    cache = KVCache(model, 2, 12, "full")
    gated_forward(model, ids[:, :4], torch.ones(N), "full", cache)
    with pytest.raises(TopologyError, match="one position per call"):
        gated_forward(model, ids[:, 4:6], torch.ones(N), "full", cache)
    with pytest.raises(TopologyError, match="skip='full'"):
        gated_forward(model, ids[:, 4:5], torch.ones(N), "query", cache)
    with pytest.raises(TopologyError, match="holds 3 positions"):
        gated_forward(model, ids[:, :4], torch.ones(N), "full", KVCache(model, 2, 3, "full"))
    with pytest.raises(TopologyError, match="gates must be"):
        gated_forward(model, ids, torch.ones(2, 10, N - 1), "full")
    with pytest.raises(TopologyError, match="0/1 head gates"):
        gated_forward(model, ids, torch.full((N,), 0.5), "full")


def head_router(model, input_kind="lm", keep=0.5, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = PredictorConfig(rank=2, hidden=8, gate="head", budget="topk", keep=keep, input=input_kind,
                          geo_features=False, **kw)
    hidden = model.config.hidden_size
    predictor = StructurePredictor(cfg, model.config.num_hidden_layers, model.config.num_attention_heads,
                                   2 * hidden if input_kind == "lm" else hidden).eval()
    with torch.no_grad():  # logits that vary by token, so the topology changes along the sequence
        for p in predictor.parameters():
            p.normal_(0, 1)
    return predictor


@pytest.mark.parametrize("skip", ["full", "query"])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_generation_with_the_cache_equals_the_loop_without(model, skip, temperature):
    router = Router(head_router(model), model)
    prompt = torch.randint(0, 61, (3, 5), generator=torch.Generator().manual_seed(2))
    runs = [generate(model, router, prompt, 8, skip, temperature, 10, torch.Generator().manual_seed(4), use_cache=c)
            for c in (True, False)]
    assert torch.equal(runs[0].ids, runs[1].ids)
    assert torch.equal(runs[0].gates, runs[1].gates)
    assert runs[0].gates.shape == (3, 12, N)
    per_token = runs[0].gates[..., 1:].sum(-1)
    assert bool((per_token == 6).all())  # the budget: 6 of 12 heads at every position
    assert not torch.equal(runs[0].gates[:, 0], runs[0].gates[:, -1])  # the topology moves along the sequence
    # the prompt's gates are the router's on the dense pass over it (the pipeline's contract)
    assert torch.equal(runs[0].gates[:, :5], router.gates(prompt))


@pytest.mark.parametrize("skip", ["full", "query"])
def test_self_consistent_routing_is_the_fixed_point_of_routing_on_its_own_states(model, skip):
    """The router as deployed (its input at t from the routed forward at t − 1) is the unique fixed
    point of "route on the states of the routed model": a plain reference iterates whole forwards
    until the gates stop changing (position t is final after t + 1 rounds); the cached decoding
    reaches the same gates and logits in one pass. It is not the dense-state routing."""
    router = Router(head_router(model), model)
    ids = torch.randint(0, 61, (3, 9), generator=torch.Generator().manual_seed(6))
    logits, gates = self_consistent(model, router, ids, skip)
    want = router.gates(ids)  # round 0: the dense pass's states
    for _ in range(ids.shape[1] + 1):
        hidden = gated_forward(model, ids, want, skip).hidden
        again = router.gates(ids, states_before(hidden))
        if torch.equal(again, want):
            break
        want = again
    assert torch.equal(gates, want)
    assert torch.allclose(logits, gated_forward(model, ids, want, skip).logits, atol=TOL)
    assert not torch.equal(gates, router.gates(ids))
    # a router that reads no state: the same gates as over the whole window
    embedding = Router(head_router(model, "embedding"), model)
    assert torch.equal(self_consistent(model, embedding, ids, skip)[1], embedding.gates(ids))


def test_dense_generation_is_stock_greedy_decoding(model):
    prompt = torch.randint(0, 61, (2, 4), generator=torch.Generator().manual_seed(3))
    ours = generate_dense(model, prompt, 6).ids
    stock = model.generate(prompt, max_new_tokens=6, do_sample=False, attention_mask=torch.ones_like(prompt))
    assert torch.equal(ours, stock)
    # and routed generation with every head kept is dense generation
    router = Router(head_router(model, keep=1.0), model)
    assert torch.equal(generate(model, router, prompt, 6, "query").ids, ours)


def test_generation_refuses_routers_and_settings_it_cannot_run(model):
    prompt = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(GenerateError, match="predictor.input: lm or embedding"):
        Router(StructurePredictor(PredictorConfig(rank=2, hidden=8, gate="head", budget="topk", keep=0.5, input="cache",
                                                  geo_features=False), L, H, 4), model)
    with pytest.raises(GenerateError, match="head-gate routers"):
        Router(StructurePredictor(PredictorConfig.cascade(rank=2, hidden=8, geo_features=False, input="lm"), L, H, 64),
               model)
    router = Router(head_router(model), model)
    with pytest.raises(GenerateError, match="max_new_tokens"):
        generate(model, router, prompt, 0)
    with pytest.raises(GenerateError, match="prompt"):
        generate(model, router, torch.zeros(3, dtype=torch.long), 2)


def test_generate_command_prints_both_speeds(tiny_tokenizer, tmp_path, capsys):
    lm_dir = save_tiny_lm(tmp_path / "lm", tiny_tokenizer, hidden=32, n_layers=2, n_heads=2)
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(lm_dir)
    save_predictor(head_router(lm), tmp_path / "predictor.safetensors")
    main(["--model", str(lm_dir), "--predictor", str(tmp_path / "predictor.safetensors"), "--prompt", "alpha beta",
          "--max-new-tokens", "5", "--skip", "full"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[routed] ") and out[1].startswith("[dense] ")
    figures = json.loads(out[2])
    assert figures["skip"] == "full" and figures["new_tokens"] == 5
    assert figures["routed_decode_tokens_per_s"] > 0 and figures["dense_decode_tokens_per_s"] > 0
    assert figures["active_head_fraction"] == 0.5
    with pytest.raises(SystemExit, match="no model at"):
        main(["--model", str(tmp_path / "missing"), "--predictor", str(tmp_path / "predictor.safetensors")])


def test_staircase_attention_is_causal_attention_of_the_active_queries():
    """Blocks of 4 over 13 positions (a partial last block), sparse and dense activity, against
    stock causal attention with the inactive rows zeroed."""
    from lookahead.graph.staircase import staircase_attention

    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(2, 3, 13, 8, generator=gen) for _ in range(3))
    for share in (0.2, 0.6, 1.0):
        active = torch.rand(2, 3, 13, generator=gen) < share
        active[0, 0] = False  # a head that never runs in this row
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3) * active[..., None]
        out = staircase_attention(q, k, v, active, 0.3, block=4)
        assert (out - ref).abs().max() <= 1e-6


def test_long_context_sparse_heads_take_the_staircase_and_stay_exact(model, monkeypatch):
    """At long context (here lowered to 8 positions, blocks of 4) heads that run rarely attend only
    their active queries: the plan still equals the plain reference."""
    from lookahead.graph import staircase

    calls = []
    real = staircase.staircase_attention
    monkeypatch.setattr(staircase, "STAIRCASE_FROM", 8)
    monkeypatch.setattr(staircase, "staircase_attention", lambda *a, **kw: calls.append(1) or real(*a, block=4))
    ids = torch.randint(0, 61, (2, 11), generator=torch.Generator().manual_seed(12))
    g = gates_of(ids.shape, 0.8, seed=13)
    g[..., 1] = 1  # one busy head beside the sparse ones
    ref = reference_forward(model, ids, baseline_graph(g, L, H, "query"), g, "query")
    assert (gated_forward(model, ids, g, "query").logits - ref).abs().max() <= TOL
    assert calls


@pytest.mark.slow  # compiles flex attention's graphs: kept out of `make test-fast`
@pytest.mark.xdist_group("compiled_decode")  # on the worker that compiles the decode step's graphs
def test_flex_attention_is_exact_on_every_path_it_takes(model):
    """FlexAttention forced (``attention: flex``): per-token ``query`` prefill over packed active
    queries (a partial last block, a head that never runs in a row), and decoding that visits only
    the key blocks of the (row, head) pairs that run, in both skip modes, against the plain
    reference; ``auto`` leaves short contexts on the SDPA paths (no Flex call)."""
    from lookahead.graph import flex

    if not flex.available("cpu"):
        pytest.skip("FlexAttention does not compile here (no C++ compiler): the plan keeps its SDPA paths")
    ids = torch.randint(0, 61, (2, 140), generator=torch.Generator().manual_seed(14))
    g = gates_of(ids.shape, 0.5, seed=15)
    g[0, :, 1 + 2] = 0  # layer 0's head 2 never runs in row 0
    for skip in ("query", "full"):
        ref = reference_forward(model, ids, baseline_graph(g, L, H, skip), g, skip)
        with flex.use("flex"):
            before = flex.stats()["calls"]
            out = gated_forward(model, ids, g, skip).logits
            cache = KVCache(model, 2, ids.shape[1], skip)
            steps = [gated_forward(model, ids[:, :130], g[:, :130], skip, cache).logits]
            steps += [gated_forward(model, ids[:, t:t + 1], g[:, t:t + 1], skip, cache).logits for t in range(130, 140)]
            assert flex.stats()["calls"] - before == L * (10 + (skip == "query") * 2)  # prefill twice in query mode
        assert (out - ref).abs().max() <= TOL
        assert (torch.cat(steps, dim=1) - ref).abs().max() <= TOL
    before = flex.stats()["calls"]
    with flex.use("auto"):
        gated_forward(model, ids, g, "query")
    assert flex.stats()["calls"] == before and flex.stats()["compile_s"] > 0
    with pytest.raises(flex.FlexError, match="attention must be one of"):
        flex.set_backend("triton")


def test_forced_flex_after_a_failed_compile_is_an_error_not_a_fallback(model, monkeypatch):
    """Under ``auto`` a kernel that does not compile warns once and the plan takes its SDPA path
    (exact); ``flex`` forced afterwards on that device raises instead of quietly running SDPA."""
    from lookahead.graph import flex

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(flex, "_WORKS", {})
    monkeypatch.setattr(flex, "AUTO_DEVICES", ("cpu",))
    monkeypatch.setattr(flex, "_kernel", lambda: broken)
    ids = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(16))
    g = gates_of(ids.shape, 0.5, seed=17)
    ref = reference_forward(model, ids, baseline_graph(g, L, H, "query"), g, "query")
    with flex.use("auto"), pytest.warns(UserWarning, match="does not compile on cpu"):
        out = gated_forward(model, ids, g, "query").logits
    assert (out - ref).abs().max() <= TOL and not flex.available("cpu")
    with flex.use("flex"), pytest.raises(flex.FlexError, match="did not compile on cpu earlier"):
        gated_forward(model, ids, g, "query")


@pytest.mark.parametrize("head_dim", [4, 12], ids=["narrower", "wider"])
@pytest.mark.parametrize("skip", ["full", "query"])
def test_plan_runs_an_attention_whose_width_is_not_the_streams(ids, skip, head_dim):
    """``base.arch.head_dim`` (the smaller dense models of the frontier): n_heads · head_dim need
    not be the hidden size (32 here); the plan slices each head by its own width."""
    narrow = tiny_olmo2(n_layers=L, n_heads=H, hidden=32, ffn=32, head_dim=head_dim)
    assert narrow.model.layers[0].self_attn.q_proj.out_features == H * head_dim
    g = gates_of(ids.shape, 0.5, seed=7)
    a = baseline_graph(g, L, H, skip)
    ref = reference_forward(narrow, ids, a, g, skip)
    with torch.no_grad():
        assert (execute(narrow, ids, a, g, skip) - ref).abs().max() <= TOL
    assert (gated_forward(narrow, ids, g, skip).logits - ref).abs().max() <= TOL
    assert (ref - narrow(ids).logits).abs().max() > 1e-2
