"""The compiled decode step (lookahead.graph.decode) against the plain per-head reference
(tests/reference_head_graph.py) over whole generations, the eager plan's tokens, and its bound on
compilations. Every test here shares one tiny model and router, so each graph compiles once in the
file (per token, shared, the router's — each serving both skip modes — and the stock forward): the
group runs on one worker, and compiling is most of its time (the suite's compile-heavy tests: ≤ 60 s
together)."""

from __future__ import annotations

import json

import pytest
import torch

from lookahead.graph.decode import DecodeError, DecodeStep
from lookahead.graph.generate import Router, generate, generate_dense, main
from lookahead.graph.nodes import baseline_graph, n_nodes
from tests.reference_head_graph import reference_forward
from tests.test_plan import head_router
from tests.test_runtime import TOL, tiny_olmo2

# one worker compiles each graph once; `slow`: compiling is most of their time, so `make test-fast`
# leaves them to `make test` (run the file itself when changing the step)
pytestmark = [pytest.mark.xdist_group("compiled_decode"), pytest.mark.slow]

L, H = 2, 4
N = n_nodes(L, H)
PROMPT, NEW = 5, 7
SHARED = (torch.tensor([1.0, 1, 1, 0, 0, 0, 1, 1, 1]), torch.tensor([1.0, 1, 1, 1, 0, 1, 0, 0, 1]))
"""Shared topologies with 2 or 3 heads in each layer: one graph serves both (counts are sizes)."""


@pytest.fixture(scope="module")
def model():
    return tiny_olmo2(n_layers=L, n_heads=H, hidden=32, ffn=32)


@pytest.fixture(scope="module")
def router(model):
    return Router(head_router(model), model)


def gates_of(shape, p_off: float, seed: int) -> torch.Tensor:
    g = (torch.rand(*shape, N, generator=torch.Generator().manual_seed(seed)) > p_off).float()
    g[..., 0] = 1
    return g


def decode(model, skip, ids, gates, router=None):
    """Logits (B, NEW, V) of the compiled steps over ids[:, PROMPT:] after the prompt ids[:, :PROMPT]
    (teacher-forced), and the gates (B, T, N) every position ran."""
    step = DecodeStep(model, ids.shape[0], ids.shape[1], skip, router)
    prompt_gates = gates if gates.dim() == 1 else gates[:, :PROMPT]
    out = step.prefill(ids[:, :PROMPT], prompt_gates)
    logits, ran = [], [prompt_gates.expand(ids.shape[0], PROMPT, N)]
    for t in range(PROMPT, ids.shape[1]):
        given = None if router else (gates if gates.dim() == 1 else gates[:, t : t + 1])
        out, g = step.step(ids[:, t : t + 1], given, out.hidden[:, -1:])
        logits.append(out.logits)
        ran.append(g)
    return torch.cat(logits, 1), torch.cat(ran, 1)


@pytest.mark.parametrize("skip", ["full", "query"])
@pytest.mark.parametrize("kind", ["shared", "per-token", "router"])
def test_compiled_steps_equal_the_reference_over_a_generation(model, router, skip, kind):
    """Every step's logits against the plain per-head reference over the whole sequence under the
    gates that ran (a head off at some steps and on at others: ragged per-head caches in ``full``)."""
    ids = torch.randint(0, 61, (3, PROMPT + NEW), generator=torch.Generator().manual_seed(5))
    gates = {"shared": SHARED[0], "per-token": gates_of(ids.shape, 0.5, seed=2),
             "router": router.gates(ids[:, :PROMPT])}[kind]
    logits, ran = decode(model, skip, ids, gates, router if kind == "router" else None)
    ref = reference_forward(model, ids, baseline_graph(ran, L, H, skip), ran, skip)[:, PROMPT:]
    assert (logits - ref).abs().max().item() <= TOL
    if kind == "router":  # heads on at some steps and off at others (the eager router's gates: the next test)
        assert 0 < ran[:, PROMPT:, 1:].mean() < 1 and ran[:, PROMPT:, 1:].std(1).sum() > 0


@pytest.mark.parametrize("skip", ["full", "query"])
def test_compiled_generation_yields_the_eager_tokens(model, router, skip):
    prompt = torch.randint(0, 61, (3, PROMPT), generator=torch.Generator().manual_seed(7))
    eager = generate(model, router, prompt, NEW, skip, compile=False)
    compiled = generate(model, router, prompt, NEW, skip, compile=True)
    assert torch.equal(compiled.ids, eager.ids)
    assert torch.equal(compiled.gates, eager.gates)
    assert compiled.decode_s > 0 and compiled.compiled_steps <= 1


def test_compilations_are_bounded_while_the_topology_changes_every_step(model, router):
    """One per-token graph, one shared-topology graph and one graph per router, each serving both skip
    modes: once each exists, a generation whose topology changes every step, the other skip mode, a
    new cache length, batch size or head count compiles nothing more (batch 1 and single heads would
    be specialised apart)."""
    ids = torch.randint(0, 61, (3, PROMPT + NEW), generator=torch.Generator().manual_seed(9))
    decode(model, "full", ids, gates_of(ids.shape, 0.5, seed=3))  # the per-token graph
    decode(model, "full", ids, SHARED[0])  # the shared graph
    step = DecodeStep(model, 3, PROMPT + NEW, "full", router)
    step.prefill(ids[:, :PROMPT], router.gates(ids[:, :PROMPT]))
    before = step.compilations
    out = step.step(ids[:, PROMPT : PROMPT + 1], None, torch.zeros(3, 1, 32))[0]  # the router's graph
    compiled = step.compilations
    assert compiled - before <= 1 and compiled >= 3  # (an earlier test may have compiled the router's already)
    seen = set()
    for t in range(PROMPT + 1, PROMPT + NEW):
        out, g = step.step(ids[:, t : t + 1], None, out.hidden)
        seen.add(tuple(g.flatten().tolist()))
    assert len(seen) == NEW - 1  # a new topology at every step
    longer = torch.randint(0, 61, (2, 3 * PROMPT + NEW), generator=torch.Generator().manual_seed(10))
    decode(model, "full", longer, gates_of(longer.shape, 0.7, seed=4))  # other lengths, batch, pair counts
    decode(model, "query", longer, gates_of(longer.shape, 0.3, seed=5))  # the other skip mode
    decode(model, "full", longer, SHARED[1])  # other head counts
    decode(model, "query", longer, SHARED[0])
    assert step.compilations == compiled == 3  # per token, shared, the router's: this model's every graph


def test_a_weight_changed_in_place_reaches_the_compiled_step(model):
    """The per-token graph takes W_qkv as the plan fuses it (``plan._fused``, cached per layer): a
    weight trained or loaded in place since is fused again for the next generation."""
    ids = torch.randint(0, 61, (3, PROMPT + NEW), generator=torch.Generator().manual_seed(12))
    gates = gates_of(ids.shape, 0.5, seed=6)
    weight = model.model.layers[1].self_attn.k_proj.weight
    kept = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.mul_(1.5)
        logits, ran = decode(model, "query", ids, gates)
        ref = reference_forward(model, ids, baseline_graph(ran, L, H, "query"), ran, "query")[:, PROMPT:]
        assert (logits - ref).abs().max().item() <= TOL
    finally:
        with torch.no_grad():
            weight.copy_(kept)


def test_compiled_stock_decoding_yields_the_eager_tokens(model):
    prompt = torch.randint(0, 61, (3, PROMPT), generator=torch.Generator().manual_seed(11))
    eager = generate_dense(model, prompt, NEW, compile=False)
    compiled = generate_dense(model, prompt, NEW, compile=True)
    assert torch.equal(compiled.ids, eager.ids)
    assert compiled.compiled_steps <= 1  # once: the last tokens go in as a tensor of their own (a view's stride changes)


def test_step_refuses_what_it_cannot_run(model):
    ids, prompt = torch.zeros(2, 1, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long)
    shared = DecodeStep(model, 2, 5, "full")
    with pytest.raises(DecodeError, match="prefill the prompt first"):
        shared.step(ids, torch.ones(N))
    shared.prefill(prompt, torch.ones(N))
    with pytest.raises(DecodeError, match="filled already"):
        shared.prefill(prompt, torch.ones(N))
    with pytest.raises(DecodeError, match="other gates"):
        shared.step(ids, gates_of((), 0.5, seed=0))
    with pytest.raises(DecodeError, match="pass it at every step"):
        shared.step(ids)
    with pytest.raises(DecodeError, match="need a step prefilled with per-token gates"):
        shared.step(ids, torch.ones(2, 1, N))
    per_token = DecodeStep(model, 2, 5, "query")
    per_token.prefill(prompt, torch.ones(2, 3, N))
    with pytest.raises(DecodeError, match="0/1 head gates"):
        per_token.step(ids, torch.full((2, 1, N), 0.5))
    with pytest.raises(DecodeError, match="gates must be"):
        per_token.step(ids, torch.ones(2, 2, N))
    with pytest.raises(DecodeError, match="prefilled with per-token gates"):
        per_token.step(ids, torch.ones(N))
    with pytest.raises(DecodeError, match="previous hidden state"):
        per_token.step(ids)
    with pytest.raises(DecodeError, match="a step takes"):
        per_token.step(torch.zeros(3, 1, dtype=torch.long), torch.ones(3, 1, N))
    with pytest.raises(DecodeError, match="skip must be"):
        DecodeStep(model, 2, 4, "keys")


class Letters:
    """A stand-in tokenizer over the tiny model's 61 ids: a letter per id."""

    def __call__(self, text: str) -> dict:
        return {"input_ids": [ord(c) % 61 for c in text]}

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(48 + i) for i in ids)


def test_generate_command_compiles_on_request(model, router, monkeypatch, capsys):
    """``--compile`` / ``--no-compile`` through the command (the fixture's model and router stand in for
    the loaded ones, whose loading tests/test_plan.py covers: their graphs exist already)."""
    import lookahead.graph.generate as generation

    monkeypatch.setattr(generation, "load", lambda *_: (model, router, Letters()))
    args = ["--prompt", "alpha", "--max-new-tokens", str(NEW), "--skip", "query", "--batch", "3"]  # the shapes above
    main(args + ["--no-compile"])
    eager = capsys.readouterr().out.splitlines()
    main(args + ["--compile"])
    compiled = capsys.readouterr().out.splitlines()
    assert compiled[:2] == eager[:2]  # the same routed and dense text
    figures = json.loads(compiled[2])
    assert figures["compiled"] is True and json.loads(eager[2])["compiled"] is False
    assert figures["routed_decode_tokens_per_s"] > 0 and figures["dense_decode_tokens_per_s"] > 0


@pytest.fixture(scope="module")
def grouped():
    from tests.test_families import tiny_llama

    return tiny_llama(n_heads=6, kv_heads=2, hidden=48, rope_theta=500000.0)


@pytest.mark.parametrize("kind", ["shared", "per-token"])
def test_compiled_steps_on_a_grouped_llama_equal_the_independent_reference(grouped, kind):
    """Grouped-query attention (6 query heads over 2 key/value heads): the cache per key/value head,
    a running pair reading its group's keys; per-token key/value groups off (``full``) and query
    heads off (``query``), and a static mask with groups partly on, against transformers' own model
    with the routed attention function (tests/reference_routed.py). One graph per kind serves both modes."""
    from tests.reference_routed import routed_reference, stepwise, unit_gates

    ids = torch.randint(0, 61, (2, PROMPT + NEW), generator=torch.Generator().manual_seed(5))
    for skip in ("full", "query"):
        gates = (unit_gates(grouped.config, (), 0.4, "query", seed=1) if kind == "shared"
                 else unit_gates(grouped.config, tuple(ids.shape), 0.5, skip, seed=2))
        step = DecodeStep(grouped, ids.shape[0], ids.shape[1], skip)
        logits = stepwise(lambda i, g: step.prefill(i, g).logits, lambda i, g: step.step(i, g)[0].logits,
                          ids, gates, PROMPT)[:, PROMPT:]
        ref = routed_reference(grouped, ids, gates, skip)[:, PROMPT:]
        assert (logits - ref).abs().max().item() <= TOL, skip
