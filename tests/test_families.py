"""Model families (lookahead.lm.families) through every executor of the head graph: Llama, grouped and
not, against transformers' own ``LlamaForCausalLM`` with every head on, and with units off against
an independent reference — transformers' own model with an attention function of the test's (below),
which shares no code with the executors. OLMo2's parity lives in tests/test_runtime.py and
tests/test_plan.py; a third family adds one row to :data:`LLAMAS`' kind of list here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lookahead.graph.nodes import allowed_mask, head_graph, n_nodes
from lookahead.graph.plan import KVCache, execute, gated_forward
from lookahead.graph.runtime import TopologyError, forward_with_topology
from lookahead.lm.families.registry import FamilyError, family_of
from tests.reference_head_graph import reference_forward
from tests.reference_routed import routed_reference, stepwise, unit_gates
from tests.test_runtime import TOL, tiny_olmo2

VOCAB = 61


def tiny_llama(n_layers=2, n_heads=6, kv_heads=2, hidden=48, ffn=64, tie=False, rope_theta=10000.0, seed=0,
               **kw) -> LlamaForCausalLM:
    """A random Llama with random norm weights (so that no norm is an identity)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=n_layers,
                      num_attention_heads=n_heads, num_key_value_heads=kv_heads, max_position_embeddings=64,
                      tie_word_embeddings=tie, rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
                      pad_token_id=None, bos_token_id=None, eos_token_id=None, **kw)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


LLAMAS = {
    "grouped-6/2-tied-theta5e5": dict(n_heads=6, kv_heads=2, hidden=48, tie=True, rope_theta=500000.0),
    "grouped-9/3-untied-theta1e5": dict(n_heads=9, kv_heads=3, hidden=72, rope_theta=100000.0),
    "multi-head-4/4": dict(n_heads=4, kv_heads=4, hidden=32, rope_theta=20000.0),
}


@pytest.fixture(scope="module", params=list(LLAMAS), ids=list(LLAMAS))
def llama(request):
    return tiny_llama(**LLAMAS[request.param])


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))


def shape_of(model):
    cfg = model.config
    return cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads


# ---- the executors -------------------------------------------------------------------------------

PROMPT = 5


def cached(model, ids, gates, skip):
    """The plan's KV cache: the prompt, then one position per call."""
    cache = KVCache(model, ids.shape[0], ids.shape[1], skip)
    run = lambda i, g: gated_forward(model, i, g, skip, cache).logits  # noqa: E731
    return stepwise(run, run, ids, gates, PROMPT)


def graph_of(model, gates):
    n_layers, n_heads, _ = shape_of(model)
    return head_graph(gates, n_layers, n_heads)


EXECUTORS = {
    "runtime-soft": lambda m, ids, g, skip: forward_with_topology(m, ids, graph_of(m, g), g, skip=skip),
    "runtime-hard": lambda m, ids, g, skip: forward_with_topology(m, ids, graph_of(m, g), g, hard=True, skip=skip),
    "plan": lambda m, ids, g, skip: execute(m, ids, graph_of(m, g), g, skip),
    "kv-cache": cached,
}


@torch.no_grad()
@pytest.mark.parametrize("skip", ["full", "query"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per-position"])
@pytest.mark.parametrize("executor", list(EXECUTORS))
def test_every_executor_with_every_head_on_equals_transformers(llama, ids, executor, shared, skip):
    n = n_nodes(*shape_of(llama)[:2])
    gates = torch.ones(n) if shared else torch.ones(*ids.shape, n)
    got = EXECUTORS[executor](llama, ids, gates, skip)
    assert (got - llama(ids).logits).abs().max().item() <= TOL


@torch.no_grad()
@pytest.mark.parametrize("skip", ["full", "query"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per-position"])
@pytest.mark.parametrize("executor", list(EXECUTORS))
def test_units_off_equal_the_independent_reference(llama, ids, executor, shared, skip):
    gates = unit_gates(llama.config, () if shared else tuple(ids.shape), 0.5, skip, seed=3)
    if shared:  # a static mask: any query head may be off, its group's keys exist while one head runs
        gates = unit_gates(llama.config, (), 0.5, "query", seed=3)
    want = routed_reference(llama, ids, gates, skip)
    assert (EXECUTORS[executor](llama, ids, gates, skip) - want).abs().max().item() <= TOL
    # and the reference is not blind to the gates: all heads on is another function
    assert (want - llama(ids).logits).abs().max().item() > 1e-3


@torch.no_grad()
@pytest.mark.parametrize("skip", ["full", "query"])
def test_soft_unit_gates_equal_the_independent_reference(llama, ids, skip):
    gates = unit_gates(llama.config, tuple(ids.shape), 0.3, skip, seed=4)
    soft = gates * torch.rand(gates.shape, generator=torch.Generator().manual_seed(5)).clamp_min(0.05)
    if skip == "full":  # one gate per group
        n_layers, n_heads, n_kv = shape_of(llama)
        g = soft[..., 1:].unflatten(-1, (n_layers, n_kv, n_heads // n_kv))
        soft = torch.cat([soft[..., :1], g[..., :1].expand_as(g).flatten(-3)], -1)
    soft[..., 0] = 1
    n_layers, n_heads, _ = shape_of(llama)  # the standard stream: every allowed edge at weight 1
    a = allowed_mask(n_layers, n_heads).float().expand(*soft.shape, soft.shape[-1])
    got = forward_with_topology(llama, ids, a, soft, skip=skip)
    assert (got - routed_reference(llama, ids, soft, skip)).abs().max().item() <= TOL


def test_a_dag_over_groups_equals_the_plain_reference():
    """Learned edges: each key/value group reads its own stream (its heads' columns equal)."""
    model = tiny_llama(n_heads=4, kv_heads=2, hidden=32, rope_theta=50000.0)
    n_layers, n_heads, n_kv = shape_of(model)
    n = n_nodes(n_layers, n_heads)
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(2))
    gen = torch.Generator().manual_seed(7)
    for skip in ("full", "query"):
        cols = torch.rand(2, 6, n, n_layers, n_kv, 1, generator=gen).expand(-1, -1, -1, -1, -1, n_heads // n_kv)
        a = torch.cat([torch.zeros(2, 6, n, 1), cols.flatten(-3)], -1) * allowed_mask(n_layers, n_heads)
        g = torch.rand(2, 6, n_layers, n_kv, 1, generator=gen).expand(-1, -1, -1, -1, n_heads // n_kv).flatten(-3)
        g = torch.cat([torch.ones(2, 6, 1), g.clamp_min(0.1)], -1)
        got = forward_with_topology(model, ids, a, g, skip=skip)
        assert (got - reference_forward(model, ids, a, g, skip)).abs().max().item() <= TOL


def test_rope_theta_is_the_configs_in_closed_form():
    """The rotary tables every executor reads are cos/sin(t · θ^(−2i/D)) with the config's θ (not only
    whatever transformers' module and the executors agree on)."""
    model = tiny_llama(n_heads=6, kv_heads=2, hidden=48, rope_theta=500000.0)
    d_head = family_of(model).shape.head_dim
    pos = torch.arange(9)
    cos, sin = model.model.rotary_emb(torch.zeros(1, 9, 48), pos[None])
    inv = 500000.0 ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
    angle = pos[:, None].double() * inv[None]
    assert torch.allclose(cos[0].double(), torch.cat([angle.cos(), angle.cos()], -1), atol=1e-6)
    assert torch.allclose(sin[0].double(), torch.cat([angle.sin(), angle.sin()], -1), atol=1e-6)
    assert not torch.allclose(cos[0].double(), torch.cat([(pos[:, None] * 10000.0 ** (
        -torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)).cos()] * 2, -1), atol=1e-3)


def test_families_are_chosen_from_the_config_and_validated_once():
    assert family_of(tiny_olmo2()).name == "olmo2"
    model = tiny_llama()
    fam = family_of(model)
    assert fam.name == "llama" and (fam.shape.n_heads, fam.shape.n_kv_heads, fam.shape.group) == (6, 2, 3)
    assert family_of(model) is fam  # remembered: one validation per model


@pytest.mark.parametrize("build, key", [
    (lambda: tiny_olmo2(n_heads=4, hidden=32, kv_heads=2), "num_key_value_heads"),
    (lambda: tiny_llama(attention_bias=True), "attention_bias"),
    (lambda: tiny_llama(mlp_bias=True), "mlp_bias"),
])
def test_an_unsupported_feature_is_refused_naming_its_config_key(build, key):
    with pytest.raises(FamilyError, match=f"^{key}:"):
        forward_with_topology(build(), torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 1), None)


def test_an_unsupported_family_or_rope_is_refused_naming_its_config_key():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=VOCAB))
    with pytest.raises(FamilyError, match="^model_type: .*'gpt2'"):
        family_of(gpt2)
    model = tiny_llama()
    model.config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    with pytest.raises(FamilyError, match="^rope_parameters.rope_type"):
        family_of(model)
    model = tiny_llama()
    model.config.sliding_window = 4
    with pytest.raises(FamilyError, match="^sliding_window"):
        family_of(model)


def test_full_skip_of_one_query_head_of_a_group_is_refused_naming_layer_and_group(ids):
    model = tiny_llama(n_heads=6, kv_heads=2)
    gates = unit_gates(model.config, tuple(ids.shape), 0.0, "query", seed=0)
    gates[0, 3, 1 + 6 + 4] = 0  # layer 1, head 4: group 1 (heads 3, 4, 5)
    for run in (lambda: execute(model, ids, graph_of(model, gates), gates, "full"),
                lambda: forward_with_topology(model, ids, graph_of(model, gates), gates, skip="full"),
                lambda: gated_forward(model, ids, gates, "full")):
        with pytest.raises(TopologyError, match="layer 1, key/value group 1: full skip of a single query head"):
            run()
    # the same gates under query skip run
    assert torch.isfinite(execute(model, ids, graph_of(model, gates), gates, "query")).all()


def test_a_topology_whose_group_columns_differ_is_refused_naming_layer_and_group(ids):
    model = tiny_llama(n_heads=6, kv_heads=2)
    a = allowed_mask(2, 6).float()
    a[0, 1 + 6 + 1] = 0.5  # layer 1, head 1 reads the source at half weight, heads 0 and 2 of its group do not
    with pytest.raises(TopologyError, match="layer 1, key/value group 0: its query heads read different input streams"):
        forward_with_topology(model, ids, a, None)


def test_a_static_mask_of_single_query_heads_runs_in_full_skip_as_the_reference_runs_it(ids):
    """Static pruning (one mask for every position, in ``full`` skip: a pruned head has no query, key,
    value or output anywhere) of single query heads of a group: the baseline graph leaves a pruned
    head's column empty, which it reads nothing through; every executor equals the independent
    reference, where the group's keys and values come from its heads that run."""
    from lookahead.graph.nodes import baseline_graph
    from lookahead.graph.scoring import static_token_nll

    model = tiny_llama(n_heads=6, kv_heads=2)
    gates = torch.ones(1 + 2 * 6)
    gates[1 + torch.tensor([0, 4, 6 + 1, 6 + 2])] = 0  # one or two heads of a group; group 0 of layer 1 keeps one
    a = baseline_graph(gates, 2, 6, "full")
    reference = routed_reference(model, ids, gates, "query")  # a head off everywhere: its queries never run
    with torch.no_grad():
        for name, logits in (("execute", execute(model, ids, a, gates, "full")),
                             ("runtime-hard", forward_with_topology(model, ids, a, gates, hard=True, skip="full")),
                             ("runtime-soft", forward_with_topology(model, ids, a, gates, skip="full")),
                             ("gated", gated_forward(model, ids, gates, "full").logits)):
            torch.testing.assert_close(logits, reference, atol=TOL, rtol=0, msg=name)
        importance = torch.arange(12, 0, -1).float().view(2, 6)  # heads in node order: the first 5 kept
        windows = torch.cat([ids, ids[:, :1]], 1)
        kept = torch.zeros(13)
        kept[:6] = 1
        expected = torch.nn.functional.cross_entropy(routed_reference(model, ids, kept, "query").transpose(1, 2),
                                                     windows[:, 1:], reduction="none")
        torch.testing.assert_close(static_token_nll(model, windows, importance, 5, "full"), expected, atol=TOL, rtol=0)
    a_bad = a.clone()
    a_bad[0, 1 + 6 + 3] = 0  # layer 1, head 3 (runs) reads another stream than head 5 of its group
    with pytest.raises(TopologyError, match="layer 1, key/value group 1: its query heads read different input streams"):
        forward_with_topology(model, ids, a_bad, gates, skip="full")


def test_the_executors_name_no_family():
    """Family rules live in lookahead.lm.families: no module, class or weight name of a family in graph/."""
    names = re.compile(r"\.q_norm\b|\.k_norm\b|post_attention_layernorm|post_feedforward_layernorm|input_layernorm"
                       r"|model_type|Olmo2|Llama[A-Z]|lm\.olmo2|families\.(olmo2|llama)")
    graph = Path(__file__).resolve().parents[1] / "src" / "lookahead" / "graph"
    found = [f"{path.name}:{i}: {line.strip()}" for path in sorted(graph.glob("*.py"))
             for i, line in enumerate(path.read_text().splitlines(), 1) if names.search(line)]
    assert not found, "family names in the executors:\n" + "\n".join(found)


def test_the_generate_command_runs_a_grouped_llama(tiny_tokenizer, tmp_path, capsys):
    """``python -m lookahead.graph.generate`` on a saved grouped Llama (6 query heads over 2 key/value
    heads) with a head-gate router: routed (``query`` skip: query heads per token) and dense decoding;
    every head kept, routed generation is transformers' own greedy decoding; a router over single
    query heads under ``full`` skip is refused with a clear error, not run."""
    from lookahead.graph.generate import Router, generate, main
    from lookahead.graph.predictor import save_predictor
    from tests.test_plan import head_router

    model = tiny_llama(n_heads=6, kv_heads=2, hidden=48, tie=True, rope_theta=100000.0)
    model.resize_token_embeddings(len(tiny_tokenizer))
    model.config.pad_token_id, model.config.eos_token_id = tiny_tokenizer.pad_token_id, tiny_tokenizer.eos_token_id
    model.save_pretrained(tmp_path / "lm")
    tiny_tokenizer.save_pretrained(tmp_path / "lm")
    save_predictor(head_router(model), tmp_path / "predictor.safetensors")

    prompt = torch.tensor([tiny_tokenizer("alpha beta")["input_ids"]])
    stock = model.generate(prompt, max_new_tokens=5, do_sample=False, attention_mask=torch.ones_like(prompt))
    assert torch.equal(generate(model, Router(head_router(model, keep=1.0), model), prompt, 5, "query").ids, stock)

    main(["--model", str(tmp_path / "lm"), "--predictor", str(tmp_path / "predictor.safetensors"),
          "--prompt", "alpha beta", "--max-new-tokens", "5", "--skip", "query"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[routed] ") and out[1].startswith("[dense] ")
    figures = json.loads(out[2])
    assert figures["skip"] == "query" and figures["active_head_fraction"] == 0.5
    assert figures["routed_decode_tokens_per_s"] > 0
    with pytest.raises(SystemExit, match="full skip of a single query head"):
        main(["--model", str(tmp_path / "lm"), "--predictor", str(tmp_path / "predictor.safetensors"),
              "--prompt", "alpha beta", "--max-new-tokens", "3", "--skip", "full"])
