"""The routing unit (``runtime.unit: head | group``, docs/design.md "Model families and grouped-query
attention"): under ``group`` a node of the head graph is a whole key/value group. Topologies over
groups run through every executor as the same topology over their query heads (checked against the
independent reference, tests/reference_routed.py, whose per-head gates are built here by hand), and
the stages that count or select nodes — the oracle, the static baselines, phase 1, pairs and the
denoiser — do it over groups on a tiny grouped Llama (its init file made as the init stage makes one
over groups: the factors of the affinity pooled by :func:`lookahead.graph.nodes.pool`, tested here;
the init stage itself needs WordNet and runs in the tiny pipeline runs, over heads)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from lookahead.core.config import to_dict
from lookahead.core.errors import ConfigError
from lookahead.graph.cost import gate_macs
from lookahead.graph.nodes import head_graph, n_nodes, pool, unit_nodes, widen
from lookahead.graph.plan import KVCache, execute, gated_forward
from lookahead.graph.runtime import RuntimeConfig, forward_with_topology, unit_shape
from lookahead.lm.families.base import FamilyError, read_unit
from tests.reference_routed import routed_reference, stepwise
from tests.test_families import tiny_llama
from tests.test_runtime import TOL

N_LAYERS, N_HEADS, N_KV = 2, 6, 2  # 3 query heads per group


@pytest.fixture(scope="module")
def grouped():
    return tiny_llama(n_layers=N_LAYERS, n_heads=N_HEADS, kv_heads=N_KV, hidden=48, rope_theta=100000.0)


def by_hand(groups: torch.Tensor) -> torch.Tensor:
    """Per-head gates (…, 1 + L·H) of group gates (…, L, G), written out for the reference: each of a
    group's 3 heads takes the group's gate, the source 1."""
    heads = torch.stack([groups] * (N_HEADS // N_KV), -1).flatten(-2).flatten(-2)
    return torch.cat([torch.ones(*groups.shape[:-2], 1), heads], -1)


def group_gates(lead: tuple, seed: int, off: float = 0.5) -> torch.Tensor:
    """Random 0/1 gates (*lead, L, G) over key/value groups."""
    return (torch.rand(*lead, N_LAYERS, N_KV, generator=torch.Generator().manual_seed(seed)) >= off).float()


def over_units(groups: torch.Tensor) -> torch.Tensor:
    """Gates over the group graph (…, 1 + L·G), the source 1."""
    return torch.cat([torch.ones(*groups.shape[:-2], 1), groups.flatten(-2)], -1)


# ---- nodes ----------------------------------------------------------------------------------------

def test_a_group_graph_widens_to_its_heads_and_head_statistics_pool_to_groups():
    assert unit_nodes(2, 6, 3).tolist() == [0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    g = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])  # layer 0: group 0 off, group 1 on; layer 1: on, off
    assert widen(g, 2, 6, 3).tolist() == [1] + [0] * 3 + [1] * 3 + [1] * 3 + [0] * 3
    a = torch.arange(25.0).view(5, 5)
    wide = widen(a, 2, 6, 3, dims=2)
    assert wide.shape == (13, 13) and wide[4, 9].item() == a[2, 3].item() and wide[0, 12].item() == a[0, 4].item()
    head = torch.ones(13)
    assert widen(head, 2, 6, 3) is head and widen(g, 2, 4, 1) is g and widen(None, 2, 6, 3) is None  # as they are
    importance = torch.arange(12.0).view(2, 6)
    assert pool(importance, 3).tolist() == [[3.0, 12.0], [21.0, 30.0]]
    affinity = np.arange(144.0).reshape(12, 12)
    assert pool(affinity, 3, dims=2)[1, 2] == affinity[3:6, 6:9].sum() and pool(affinity, 1, dims=2) is affinity


def test_the_unit_is_a_runtime_key_omitted_at_its_default_and_validated(tmp_path):
    assert to_dict(RuntimeConfig()) == {"skip": "query"}  # saved configs as before
    assert to_dict(RuntimeConfig(unit="group")) == {"skip": "query", "unit": "group"}
    with pytest.raises(ConfigError, match="unit"):
        RuntimeConfig(unit="layer")
    params = tmp_path / "params.yaml"
    params.write_text("runtime:\n  skip: full\n  unit: kv\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="runtime.unit"):
        read_unit(params)
    params.write_text("runtime:\n  skip: full\n", encoding="utf-8")
    assert read_unit(params) == "head"


def test_units_per_layer(grouped):
    assert unit_shape(grouped, "head") == (2, 6) and unit_shape(grouped, "group") == (2, 2)
    with pytest.raises(FamilyError, match="runtime.unit"):
        unit_shape(grouped, "layer")


# ---- executors ------------------------------------------------------------------------------------

def cached(model, ids, gates, skip):
    cache = KVCache(model, ids.shape[0], ids.shape[1], skip)
    run = lambda i, g: gated_forward(model, i, g, skip, cache).logits  # noqa: E731
    return stepwise(run, run, ids, gates, 4)


EXECUTORS = {
    "runtime-soft": lambda m, ids, g, n, skip: forward_with_topology(m, ids, head_graph(g, N_LAYERS, n), g, skip=skip),
    "runtime-hard": lambda m, ids, g, n, skip: forward_with_topology(m, ids, head_graph(g, N_LAYERS, n), g, hard=True,
                                                                     skip=skip),
    "plan": lambda m, ids, g, n, skip: execute(m, ids, head_graph(g, N_LAYERS, n), g, skip),
    "gated": lambda m, ids, g, n, skip: gated_forward(m, ids, g, skip).logits,
    "kv-cache": lambda m, ids, g, n, skip: cached(m, ids, g, skip),
}


@torch.no_grad()
@pytest.mark.parametrize("skip", ["full", "query"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per-position"])
@pytest.mark.parametrize("executor", list(EXECUTORS))
def test_group_gates_run_as_their_heads_and_equal_the_independent_reference(grouped, executor, shared, skip):
    ids = torch.randint(0, 61, (2, 8), generator=torch.Generator().manual_seed(2))
    groups = group_gates(() if shared else tuple(ids.shape), seed=7)
    run = EXECUTORS[executor]
    got = run(grouped, ids, over_units(groups), N_KV, skip)
    want = routed_reference(grouped, ids, by_hand(groups), skip)
    assert (got - want).abs().max().item() <= TOL
    assert torch.equal(got, run(grouped, ids, by_hand(groups), N_HEADS, skip))  # widened: the same call
    assert (want - grouped(ids).logits).abs().max().item() > 1e-3  # the gates matter


def test_group_gates_count_the_macs_of_their_heads(grouped):
    groups = group_gates((2, 9), seed=3)
    for mode in ("full", "query", "static"):
        heads = by_hand(groups)[..., 1:].view(2, 9, N_LAYERS, N_HEADS)
        assert torch.equal(gate_macs(grouped.config, groups, mode), gate_macs(grouped.config, heads, mode))


def test_a_group_masks_gradient_is_the_sum_of_its_heads(grouped):
    from lookahead.lm.nll import causal_lm_nll
    from lookahead.semantics.heads import HeadMasks

    windows = torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(4))
    grads = []
    for units in (N_HEADS, N_KV):
        mask = torch.ones(N_LAYERS, units, requires_grad=True)
        with HeadMasks(grouped, N_HEADS, mask):
            loss = causal_lm_nll(grouped, windows)
        grads.append(torch.autograd.grad(loss, mask)[0])
    assert torch.allclose(grads[1], grads[0].view(N_LAYERS, N_KV, -1).sum(-1), atol=1e-6)


# ---- stages over groups ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def grouped_inputs(tiny_tokenizer, tmp_path_factory):
    """A tiny grouped Llama (2 layers, 6 query heads in 2 key/value groups) saved with the tiny
    tokenizer, token streams, a context cache (the `base` encoder), probe statistics over its 12 heads
    and an init file over its 4 groups (the factors of the pooled affinity)."""
    from safetensors.numpy import save_file as save_numpy
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from lookahead.pipeline.contexts import ContextsConfig, build_contexts
    from lookahead.pipeline.init import head_factors

    d = tmp_path_factory.mktemp("grouped_inputs")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tiny_tokenizer), hidden_size=48, intermediate_size=64, num_hidden_layers=N_LAYERS,
                      num_attention_heads=N_HEADS, num_key_value_heads=N_KV, max_position_embeddings=64,
                      tie_word_embeddings=True, pad_token_id=tiny_tokenizer.pad_token_id,
                      eos_token_id=tiny_tokenizer.eos_token_id, bos_token_id=tiny_tokenizer.bos_token_id)
    LlamaForCausalLM(cfg).eval().save_pretrained(d / "base")
    tiny_tokenizer.save_pretrained(d / "base")
    rng = np.random.default_rng(0)
    (d / "tokens").mkdir()
    np.save(d / "tokens" / "train.npy", rng.integers(2, len(tiny_tokenizer), 4000).astype(np.uint16))
    np.save(d / "tokens" / "val.npy", rng.integers(2, len(tiny_tokenizer), 1000).astype(np.uint16))
    build_contexts(ContextsConfig(encoder="base", train_sequences=8, val_sequences=4, batch_size=4, device="cpu"), 12,
                   tiny_tokenizer, d / "tokens", d / "base", d / "contexts")
    affinity = np.corrcoef(rng.normal(size=(N_LAYERS * N_HEADS, 50))).astype(np.float32)
    save_numpy({"importance": rng.uniform(0.01, 1, (N_LAYERS, N_HEADS)).astype(np.float32), "affinity": affinity},
               str(d / "heads.safetensors"))
    u0, v0 = head_factors(pool(affinity, N_HEADS // N_KV, dims=2), 2)
    gen = torch.Generator().manual_seed(0)
    vocab = len(tiny_tokenizer)
    save_file({"geo_table": torch.randn(vocab, 4, generator=gen), "geo_mask": (torch.rand(vocab, generator=gen) > 0.5).float(),
               "U0": torch.from_numpy(u0), "V0": torch.from_numpy(v0)}, str(d / "init.safetensors"),
              metadata={"config": json.dumps({"n_layers": N_LAYERS, "unit": "group"})})
    return {"base": d / "base", "tokens": d / "tokens", "contexts": d / "contexts", "heads": d / "heads.safetensors",
            "init": d / "init.safetensors", "root": d}


def test_the_oracle_removes_groups(grouped_inputs, tmp_path):
    from torch.nn.functional import log_softmax

    from lookahead.artifacts.oracle_targets import OracleTargets
    from lookahead.graph.oracle import kl_to_dense
    from lookahead.pipeline.oracle import OracleConfig, build_oracle

    metrics = build_oracle(OracleConfig(windows=2, rows=4, device="cpu"), 0.5, "full", 12, grouped_inputs["base"],
                           grouped_inputs["tokens"], tmp_path / "oracle", unit="group")
    targets = OracleTargets(tmp_path / "oracle")
    assert metrics["heads_kept"] == 2 and targets.greedy_order.shape == (2, 12, N_LAYERS * N_KV)
    meta = json.loads((tmp_path / "oracle" / "meta.json").read_text())
    assert (meta["n_heads"], meta["unit"]) == (N_KV, "group")
    # each group's leave-one-out KL: the reference with that group's heads, keys and values off
    lm = AutoModelForCausalLM.from_pretrained(grouped_inputs["base"]).eval()
    ids = targets.windows[:, :-1]
    dense = log_softmax(lm(ids).logits.float(), -1)
    for unit in range(N_LAYERS * N_KV):
        groups = torch.ones(N_LAYERS * N_KV)
        groups[unit] = 0
        logits = routed_reference(lm, ids, by_hand(groups.view(N_LAYERS, N_KV)), "full")
        assert torch.allclose(targets.loo_kl[..., unit], kl_to_dense(dense, logits), atol=1e-5)


def test_the_static_baselines_rank_groups(grouped_inputs, tmp_path):
    from lookahead.artifacts.static_baselines import StaticBaselines, StaticBaselinesError
    from lookahead.artifacts.val_scores import WindowsConfig
    from lookahead.pipeline.static_baselines import StaticBaselinesConfig, build_static_baselines

    report = build_static_baselines(StaticBaselinesConfig(fit_windows=2, batch_size=4, device="cpu"),
                                    WindowsConfig(per_role=4), 12, grouped_inputs["base"], grouped_inputs["tokens"],
                                    tmp_path / "sb", unit="group")
    static = StaticBaselines(tmp_path / "sb")
    assert static.shape == (N_LAYERS, N_KV) and report["heads"] == N_LAYERS * N_KV
    assert len(report["by_heads_kept"]) == N_LAYERS * N_KV + 1 and static.meta["unit"] == "group"
    static.check(N_LAYERS, N_KV, "the grouped Llama")
    with pytest.raises(StaticBaselinesError, match="dvc repro static_baselines"):
        static.check(N_LAYERS, N_HEADS, "the grouped Llama over heads")
    # the selection NLL at 2 of 4 groups: the reference's, whole groups off at every position
    from lookahead.artifacts.val_scores import ScoringConfig, scoring_windows
    from lookahead.graph.nodes import static_gates
    from lookahead.lm.nll import token_nll

    lm = AutoModelForCausalLM.from_pretrained(grouped_inputs["base"]).eval()
    windows = scoring_windows(grouped_inputs["tokens"], ScoringConfig(roles=WindowsConfig(per_role=4)), 12, "selection")
    for method in ("importance", "greedy"):
        keep = static_gates(static.rankings[method], 2)[1:].view(N_LAYERS, N_KV)
        want = token_nll(routed_reference(lm, windows[:, :-1], by_hand(keep), "full"), windows[:, 1:])
        assert static.selection_nll[method][2].item() == pytest.approx(want.double().mean().item(), abs=1e-5)


def test_phase1_and_pairs_route_groups(grouped_inputs, tmp_path):
    from safetensors.torch import load_file

    from lookahead.graph.predictor import PredictorConfig, load_predictor
    from lookahead.artifacts.pairs import load_pairs
    from lookahead.pipeline.pairs import PairsConfig, build_pairs
    from lookahead.pipeline.phase1.build import train_phase1
    from lookahead.pipeline.phase1.config import Phase1Config
    from lookahead.train.loop import TrainConfig

    cfg = Phase1Config(static_twin=False, eval_batch_size=2, eval_sequences=2,
                       train=TrainConfig(steps=2, batch_size=2, warmup_steps=1, eval_every=2, log_every=1,
                                         checkpoint_every=0, device="cpu"))
    pcfg = PredictorConfig(rank=2, hidden=8, keep=0.5)
    i = grouped_inputs
    training, _, module, _ = train_phase1(cfg, pcfg, i["base"], i["contexts"], i["init"], i["heads"],
                                          tmp_path / "router.safetensors", runtime_cfg=RuntimeConfig("full", "group"))
    predictor, meta = load_predictor(tmp_path / "router.safetensors")
    assert (predictor.n_layers, predictor.n_heads) == (N_LAYERS, N_KV) and meta["runtime"]["unit"] == "group"
    # the importance the router starts from and static pruning ranks: the probe's summed over each group's heads
    pooled = load_file(str(i["heads"]))["importance"].view(N_LAYERS, N_KV, -1).sum(-1).flatten()
    assert torch.allclose(module.importance.flatten(), pooled)
    assert np.isfinite(training["hard_nll"]) and 0 < training["active_head_fraction"] < 1
    # pairs over the group graph
    build_pairs(PairsConfig(target="beats_dense", sequences=2, samples=2, keep=2, batch_size=2, approx_positions=0,
                            device="cpu"), i["base"], i["contexts"], i["init"], tmp_path / "router.safetensors",
                tmp_path / "pairs")
    info = load_pairs(tmp_path / "pairs", 12, 0.25, 0).info
    assert (info["n_heads"], info["unit"], info["n_edges"]) == (N_KV, "group", N_LAYERS * N_KV + N_KV**2)
    # the denoiser over the group graph
    from lookahead.core.config import from_dict
    from lookahead.graph.denoiser import load_denoiser
    from lookahead.pipeline.diffusion.build import DiffusionConfig, build_diffusion

    dcfg = from_dict(DiffusionConfig, {
        "denoiser": {"hidden": 8, "layers": 1, "rank": 2, "cond_hidden": 8}, "sample_steps": 2, "eval_samples": 2,
        "heldout_fraction": 0.25, "eval_batch_size": 2, "val_pairs": 8,
        "train": {"steps": 2, "batch_size": 4, "warmup_steps": 1, "eval_every": 2, "log_every": 1,
                  "checkpoint_every": 0, "device": "cpu"}})
    build_diffusion(dcfg, i["base"], i["contexts"], i["init"], tmp_path / "router.safetensors", tmp_path / "pairs",
                    tmp_path / "diffusion")
    denoiser, _ = load_denoiser(tmp_path / "diffusion")
    assert (denoiser.n_layers, denoiser.n_heads) == (N_LAYERS, N_KV)
    # a router over groups against a runtime over heads: refused before any work, naming the mismatch
    with pytest.raises(ValueError, match="runtime.unit"):
        train_phase1(cfg, pcfg, i["base"], i["contexts"], i["init"], i["heads"], tmp_path / "other.safetensors",
                     runtime_cfg=RuntimeConfig("full", "head"))


def test_keep_sets_are_sets_of_groups(grouped):
    from torch.nn.functional import log_softmax

    from lookahead.graph.keepsets import search_keep_sets
    from lookahead.graph.oracle import kl_to_dense

    ids = torch.randint(0, 61, (1, 6), generator=torch.Generator().manual_seed(6))
    sets, kl, _ = search_keep_sets(grouped, ids, None, N_LAYERS, N_KV, 2, "full")
    assert sets.shape[-1] == N_LAYERS * N_KV and bool((sets.sum(-1) == 2).all())
    dense = log_softmax(grouped(ids).logits.float(), -1)
    for c in (0, sets.shape[0] - 1):  # the greedy set and the last swap, at every position
        logits = routed_reference(grouped, ids, by_hand(sets[c].float().view(1, 6, N_LAYERS, N_KV)), "full")
        assert torch.allclose(kl[c], kl_to_dense(dense, logits), atol=1e-5)


def test_the_estimate_counts_nodes_in_the_unit(repo_root, grouped_inputs, tmp_path):
    import yaml

    from lookahead.tools.estimate import estimate
    from lookahead.tools.params import validate_all

    params = yaml.safe_load((repo_root / "params.yaml").read_text())
    params["base"].update(source="hub", model=str(grouped_inputs["base"]))  # its config, read from the directory
    notes = {}
    for unit in ("head", "group"):
        params["runtime"]["unit"] = unit
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
        stages = {s["stage"]: s for s in estimate(validate_all(tmp_path / "params.yaml"))["stages"]}
        notes[unit] = stages["oracle"]["note"]
    assert f"of {N_LAYERS * N_HEADS} heads" in notes["head"] and f"of {N_LAYERS * N_KV} heads" in notes["group"]
