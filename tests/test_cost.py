"""MACs per token (lookahead.graph.cost) counted from the gates as they run, against the closed form,
hand counts and the evaluate table's independent attention count; and an attention narrower than
the residual stream (``base.arch.head_dim``)."""

from __future__ import annotations

import pytest
import torch
from transformers import Olmo2Config

from lookahead.graph.cost import attention_width, gate_macs, lm_head_macs, macs_per_token
from lookahead.graph.nodes import baseline_graph
from lookahead.lm.olmo2 import ArchConfig, head_dim_of, olmo2_config
from lookahead.pipeline.evaluate.rows import Shapes, position_figures
from lookahead.core.errors import ConfigError


def config(**kw) -> Olmo2Config:
    return Olmo2Config(hidden_size=8, intermediate_size=12, num_hidden_layers=4, num_attention_heads=4, vocab_size=61, **kw)


def test_a_narrower_attention_costs_its_own_width_in_every_projection_and_key():
    """head_dim 2 at 4 heads: the attention is 8 wide at d = 16 — Q, K, V, O 16·8 each, QK and
    AV 2·keys·8 at every head — and the LM head (16·61) is the part no attention width changes."""
    cfg = Olmo2Config(hidden_size=16, intermediate_size=12, num_hidden_layers=4, num_attention_heads=4,
                      vocab_size=61, head_dim=2)
    assert head_dim_of(cfg) == 2 and attention_width(cfg) == 8 and lm_head_macs(cfg) == 16 * 61
    assert macs_per_token(cfg, 5, 1.0, "query") == 4 * (4 * 16 * 8 + 2 * 5 * 8 + 3 * 16 * 12) + 16 * 61
    assert macs_per_token(cfg, 5, 0.5, "full") == 4 * (0.5 * 2 * 16 * 8 + 0.5 * (2 * 16 * 8 + 2 * 2.5 * 8)
                                                       + 3 * 16 * 12) + 16 * 61
    assert head_dim_of(config()) == 2 and attention_width(config()) == 8  # no head_dim: hidden / heads


@pytest.mark.parametrize("mode", ["full", "query", "static"])
def test_gates_all_on_cost_a_dense_forward_at_each_positions_keys(mode):
    """Every head on: position t attends t + 1 keys, whatever the mode; the mean over a window of T
    is the closed form at the prefill mean (T + 1) / 2."""
    cfg = config()
    macs = gate_macs(cfg, torch.ones(2, 7, 4, 4), mode)
    assert macs.shape == (2, 7)
    for t in range(7):
        assert macs[0, t].item() == pytest.approx(macs_per_token(cfg, t + 1, 1.0, mode))
    assert macs.mean().item() == pytest.approx(macs_per_token(cfg, 4.0, 1.0, mode))


def test_a_static_mask_costs_the_closed_form_and_routed_gates_count_the_keys_that_ran():
    """A static mask (half the heads, every position): the closed form's ``static`` at t + 1 keys.
    One head at alternate positions (full skip): its keys at t are the positions <= t where it ran,
    counted by hand; under ``query`` every head has its key and value anyway."""
    cfg = config()
    static = torch.zeros(1, 6, 4, 4)
    static[..., :2] = 1
    macs = gate_macs(cfg, static, "static")
    for t in range(6):
        assert macs[0, t].item() == pytest.approx(macs_per_token(cfg, t + 1, 0.5, "static"))
    one = torch.zeros(1, 6, 4, 4)
    one[0, ::2, 0, 0] = 1  # layer 0, head 0 at t = 0, 2, 4
    base = 4 * 3 * 8 * 12 + 8 * 61  # MLPs and the LM head
    ran = [1, 0, 2, 0, 3, 0]  # keys it attends where it runs
    for t in range(6):
        on = t % 2 == 0
        assert gate_macs(cfg, one, "full")[0, t].item() == base + on * (4 * 8 * 2 + 2 * ran[t] * 2)
        assert gate_macs(cfg, one, "query")[0, t].item() == base + 16 * 2 * 8 * 2 + on * (2 * 8 * 2 + 2 * (t + 1) * 2)
    with pytest.raises(ValueError, match="mode must be one of"):
        gate_macs(cfg, one, "pruned")


@pytest.mark.parametrize("skip", ["full", "query"])
@pytest.mark.parametrize("head_dim", [None, 6])
def test_gate_macs_agree_with_the_evaluate_tables_attention_flops(skip, head_dim):
    """The evaluate table counts attention FLOPs (2 per MAC) from the graph's gates its own way
    (:func:`lookahead.pipeline.evaluate.rows.position_figures`); beside the MLPs and the LM head,
    :func:`gate_macs` is half of it at every position, random gates included."""
    cfg = config(**({} if head_dim is None else {"head_dim": head_dim}))
    lm = type("LM", (), {"config": cfg})()
    gates = (torch.rand(3, 9, 1 + 16, generator=torch.Generator().manual_seed(2)) < 0.4).float()
    gates[..., 0] = 1
    figures = position_figures(baseline_graph(gates, 4, 4, skip), gates, Shapes.of(lm), skip)
    macs = gate_macs(cfg, gates[..., 1:].reshape(3, 9, 4, 4), skip)
    rest = 4 * 3 * 8 * 12 + lm_head_macs(cfg)
    torch.testing.assert_close(macs - rest, figures["attn_flops"].double() / 2)


def test_head_dim_sets_the_attention_width_and_is_checked():
    tokenizer = type("Tok", (), {"__len__": lambda self: 61, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2})()
    narrow = olmo2_config(ArchConfig(hidden_size=128, n_heads=4, head_dim=16), tokenizer)
    assert narrow.head_dim == 16 and attention_width(narrow) == 64
    assert "head_dim" not in olmo2_config(ArchConfig(), tokenizer).to_dict()  # the default model's config.json as it was
    ArchConfig(hidden_size=128, n_heads=3, head_dim=16)  # heads need not divide the stream once head_dim is set
    for bad in (7, 0):
        with pytest.raises(ConfigError, match="head_dim"):
            ArchConfig(head_dim=bad)
    with pytest.raises(ConfigError, match="n_heads"):
        ArchConfig(hidden_size=128, n_heads=3)


def test_grouped_keys_and_values_cost_their_own_heads_where_any_head_of_the_group_runs():
    """Llama, 6 query heads over 2 key/value groups (head_dim 2, d = 12): a key/value head is 12·2
    wide per projection. ``query``: both groups' keys and values at every position, t + 1 keys per
    running head. ``full``: one head of group 0 at t = 0, 2, 4 and another of group 0 at t = 1 —
    the group's keys and values exist at t = 0, 1, 2, 4 and a running head attends every one of
    them so far; group 1 never runs and costs nothing. The LM head costs d·V, tied or not."""
    from transformers import LlamaConfig

    def llama(tied):
        return LlamaConfig(hidden_size=12, intermediate_size=10, num_hidden_layers=1, num_attention_heads=6,
                           num_key_value_heads=2, vocab_size=61, tie_word_embeddings=tied)

    cfg = llama(True)
    assert lm_head_macs(cfg) == lm_head_macs(llama(False)) == 12 * 61
    d, hd, mlp, head = 12, 2, 3 * 12 * 10, 12 * 61
    on = torch.ones(1, 5, 1, 6)
    q = gate_macs(cfg, on, "query")
    for t in range(5):
        assert q[0, t].item() == 2 * d * hd * 2 + 6 * (2 * d * hd + 2 * (t + 1) * hd) + mlp + head
        assert q[0, t].item() == pytest.approx(macs_per_token(cfg, t + 1, 1.0, "query"))
    one = torch.zeros(1, 5, 1, 6)
    one[0, [0, 2, 4], 0, 0] = 1
    one[0, 1, 0, 2] = 1  # heads 0 and 2 are both in group 0 (heads 0-2)
    full = gate_macs(cfg, one, "full")
    keys = [1, 2, 3, 0, 4]  # group 0's keys at positions <= t where it ran (none computed at t = 3)
    for t in range(5):
        ran = bool(one[0, t].any())
        expected = (2 * d * hd + (2 * d * hd + 2 * keys[t] * hd)) * ran + mlp + head
        assert full[0, t].item() == expected
    assert gate_macs(cfg, one, "query")[0, 3].item() == 2 * d * hd * 2 + mlp + head  # no head runs: k, v still


def test_the_estimates_weight_count_charges_keys_and_values_their_own_heads():
    """``make estimate``'s block parameters under grouped-query attention: Q and O d², K and V
    d·(d·kv/H), the MLP 3·d·ffn — every linear weight of a Llama layer, counted by torch."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lookahead.tools.estimate import Arch

    cfg = LlamaConfig(hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=6,
                      num_key_value_heads=2, vocab_size=61)
    linear = sum(m.weight.numel() for m in LlamaForCausalLM(cfg).model.layers.modules()
                 if isinstance(m, torch.nn.Linear))
    arch = Arch(2, 6, 24, 40, 61, kv_heads=2)
    assert arch.body - 2 * 4 * 24 == linear  # less the block's norm weights (4·d: OLMo2's count)
    assert Arch(2, 6, 24, 40, 61).body - Arch(2, 6, 24, 40, 61, kv_heads=2).body == 2 * 2 * 24 * (24 - 8)


def test_the_estimate_counts_a_tied_llama_as_torch_does(tmp_path):
    """A Llama's config read as ``make estimate`` reads it: two norms per block and, tied, one
    vocab x hidden matrix — every parameter torch counts; the SmolLM2 shape likewise (134.5 M)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from types import SimpleNamespace

    from lookahead.tools.estimate import PUBLISHED, _arch_of, _published

    cfg = LlamaConfig(hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=6,
                      num_key_value_heads=2, vocab_size=61, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    unused = SimpleNamespace(n_layers=1, n_heads=1, hidden_size=1, intermediate_size=1, tie_word_embeddings=False)
    arch, where = _arch_of("hub", str(tmp_path), None, unused, 0)  # base.arch: not read for a loaded model
    assert where.endswith("config") and (arch.tied, arch.norms) == (True, 2)
    assert arch.params == sum(p.numel() for p in LlamaForCausalLM(cfg).parameters())
    smollm2 = _published(next(k for k in PUBLISHED if "SmolLM2" in k))
    assert round(smollm2.params / 1e5) == 1345  # 134.5 M, as the loaded model holds
