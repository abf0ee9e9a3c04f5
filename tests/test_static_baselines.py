"""The static_baselines stage: importance on the fit windows, the greedy static mask against a plain
reference search (head outputs zeroed by hooks, not the plan's skipping), the stronger of the two on
the selection windows, and the reader every static baseline takes its mask from."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from lookahead.artifacts.static_baselines import METHODS, StaticBaselines, StaticBaselinesError
from lookahead.artifacts.val_scores import ScoringConfig, WindowsConfig, scoring_windows
from lookahead.core.errors import ConfigError
from lookahead.graph.nodes import baseline_graph, static_gates
from lookahead.pipeline.static_baselines import (StaticBaselinesConfig, build_static_baselines, gradient_importance,
                                                 greedy_ranking, layer_streams, mask_nll)
from lookahead.semantics.heads import probe_heads
from tests.conftest import save_tiny_lm
from tests.reference_head_graph import reference_forward


@pytest.fixture(scope="module")
def lm_and_windows(tiny_tokenizer, tmp_path_factory):
    """A tiny random 2 x 3-head LM and 6 windows of 13 tokens."""
    path = save_tiny_lm(tmp_path_factory.mktemp("static") / "lm", tiny_tokenizer, hidden=24, n_layers=2, n_heads=3, seed=3)
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    windows = torch.from_numpy(np.random.default_rng(1).integers(2, len(tiny_tokenizer), (6, 13)))
    return lm, windows


def reference_nll(lm, windows: torch.Tensor, on: list[bool]) -> float:
    """Mean NLL with only the heads ``on`` running at every token, in ``full`` skip, by the plain
    reference forward (tests/reference_head_graph.py: no plan, no skipping code of the runtime)."""
    gates = torch.tensor([1.0] + [float(o) for o in on])
    adjacency = baseline_graph(gates, lm.config.num_hidden_layers, lm.config.num_attention_heads, "full")
    logits = reference_forward(lm, windows[:, :-1], adjacency, gates, "full")
    return F.cross_entropy(logits.flatten(0, 1).double(), windows[:, 1:].flatten()).item()


def reference_greedy(lm, windows: torch.Tensor) -> list[int]:
    """The heads in the order a plain greedy search drops them: each step the removal of least NLL."""
    on, order = [True] * 6, []
    for _ in range(6):
        costs = {h: reference_nll(lm, windows, [o and i != h for i, o in enumerate(on)]) for h in range(6) if on[h]}
        drop = min(costs, key=lambda h: (costs[h], h))
        on[drop] = False
        order.append(drop)
    return order


def test_the_greedy_static_mask_is_the_plain_greedy_search_and_nests(lm_and_windows):
    lm, windows = lm_and_windows
    batches = list(windows.split(4))
    ranking, path = greedy_ranking(lm, batches, progress=False)
    order = torch.argsort(ranking.flatten()).tolist()  # dropped first = ranked lowest
    assert order == reference_greedy(lm, windows)
    assert sorted(ranking.flatten().tolist()) == [0, 1, 2, 3, 4, 5]
    for k in range(7):  # the top k of the ranking is the search's mask after 6 − k drops, and its fit NLL
        on = static_gates(ranking, k)[1:].bool()
        assert set(on.nonzero().flatten().tolist()) == set(order[6 - k :])
        if k < 6:
            assert path[5 - k] == pytest.approx(reference_nll(lm, windows, on.tolist()), abs=1e-5)
            assert mask_nll(lm, batches, on) == pytest.approx(path[5 - k], abs=1e-9)
    # min_keep stops the search: the heads it never dropped rank equal, above every dropped one
    stopped, _ = greedy_ranking(lm, batches, min_keep=2, progress=False)
    assert torch.equal(torch.argsort(stopped.flatten())[:4], torch.tensor(order[:4]))
    assert (stopped.flatten()[order[4:]] == 6).all()
    # the lazy search trying every head still on is the exact one
    assert torch.equal(greedy_ranking(lm, batches, candidates=6, progress=False)[0], ranking)
    lazy, _ = greedy_ranking(lm, batches, candidates=1, progress=False)
    assert sorted(lazy.flatten().tolist()) == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("model", ["olmo2", "grouped llama, heads", "grouped llama, groups"])
def test_a_trial_resumed_at_its_units_layer_is_the_whole_forwards_floats(model, lm_and_windows):
    """The greedy search's trials start at the layer of the unit they drop, from the current mask's
    stream there (layer_streams): the same floats, bit for bit, as the whole forward (execute)."""
    from lookahead.graph.runtime import unit_shape
    from tests.test_families import VOCAB, tiny_llama

    if model == "olmo2":
        lm, windows = lm_and_windows[0], list(lm_and_windows[1].split(3))
    else:
        lm = tiny_llama(n_layers=3, n_heads=6, kv_heads=2, hidden=48)
        windows = [torch.randint(0, VOCAB, (3, 11), generator=torch.Generator().manual_seed(i)) for i in range(2)]
    n_layers, n_units = unit_shape(lm, "group" if model.endswith("groups") else "head")
    on = torch.rand(n_layers * n_units, generator=torch.Generator().manual_seed(0)) > 0.3
    streams = layer_streams(lm, windows, on)
    for node in on.nonzero().flatten().tolist():
        trial = on.clone()
        trial[node] = False
        layer = node // n_units
        assert mask_nll(lm, windows, trial, resume=(layer, streams[layer])) == mask_nll(lm, windows, trial), node
    from lookahead.graph.plan import gated_forward
    from lookahead.graph.runtime import TopologyError

    gates = torch.cat([torch.ones(1), on.float()])
    with pytest.raises(TopologyError, match="resume"):  # past the last layer
        gated_forward(lm, windows[0][:, :-1], gates, "full", resume=(n_layers, streams[0][0]))
    with pytest.raises(TopologyError, match="resume"):  # another batch's stream
        gated_forward(lm, windows[0][:1, :-1], gates, "full", resume=(0, streams[0][0]))


def test_importance_on_the_fit_windows_is_the_probes_measure(lm_and_windows):
    lm, windows = lm_and_windows
    batches = list(windows.split(3))
    expected = torch.from_numpy(probe_heads(lm, batches)["importance"])
    torch.testing.assert_close(gradient_importance(lm, batches), expected, rtol=1e-6, atol=1e-9)


def test_the_stage_fits_on_fit_compares_on_selection_and_every_baseline_reads_the_stronger(phase_inputs, tmp_path):
    i = phase_inputs
    roles = WindowsConfig(per_role=4)
    cfg = StaticBaselinesConfig(fit_windows=2, batch_size=2, device="cpu")
    report = build_static_baselines(cfg, roles, 12, i["base"], i["tokens"], tmp_path / "sb")
    again = build_static_baselines(cfg, roles, 12, i["base"], i["tokens"], tmp_path / "sb2")
    for name in ("baselines.safetensors", "meta.json"):  # deterministic: the same bytes
        assert (tmp_path / "sb" / name).read_bytes() == (tmp_path / "sb2" / name).read_bytes()
    assert report["by_heads_kept"] == again["by_heads_kept"]
    sb = StaticBaselines(tmp_path / "sb")
    lm = AutoModelForCausalLM.from_pretrained(i["base"], dtype=torch.float32).eval()
    scoring = ScoringConfig(roles=roles)
    fit = scoring_windows(i["tokens"], scoring, 12, "fit")
    selection = scoring_windows(i["tokens"], scoring, 12, "selection")
    torch.testing.assert_close(sb.rankings["importance"], torch.from_numpy(probe_heads(lm, list(fit.split(2)))["importance"]))
    assert torch.equal(sb.rankings["greedy"], greedy_ranking(lm, list(fit[:2].split(2)), progress=False)[0])
    for k in range(5):
        nll = {m: mask_nll(lm, list(selection.split(2)), static_gates(sb.rankings[m], k)[1:].bool()) for m in METHODS}
        assert sb.selection_nll["importance"][k].item() == pytest.approx(nll["importance"], abs=1e-12)
        best = "greedy" if nll["greedy"] < nll["importance"] else "importance"
        assert sb.method(k) == best and torch.equal(sb.ranking(k), sb.rankings[best])
        assert report["by_heads_kept"][k]["stronger"] == best
    assert sb.at_fraction(0.5) is sb.ranking(2)
    meta = json.loads((tmp_path / "sb" / "meta.json").read_text())
    assert meta["fit_set"].startswith("fit:4x12:") and meta["selection_set"].startswith("selection:4x12:")
    stream = np.load(i["tokens"] / "val.npy").astype(np.int64)
    for role, windows in (("fit", fit), ("selection", selection)):  # the spans it read are its windows' tokens
        spans = sb.spans[f"static_baselines ({role} windows)"]
        assert [np.array_equal(stream[a:b], w) for (_, a, b), w in zip(spans, windows.numpy())] == [True] * 4
    sb.check(2, 2, "phase 1's LM")
    with pytest.raises(StaticBaselinesError, match="rank 2 x 2 heads, the LM has 4 x 4: rerun `dvc repro static_baselines`"):
        sb.check(4, 4, "the LM")
    with pytest.raises(StaticBaselinesError, match="run `dvc repro static_baselines`"):
        StaticBaselines(tmp_path / "missing")
    with pytest.raises(ConfigError, match="min_keep: must be <= the model's 4 heads"):
        build_static_baselines(StaticBaselinesConfig(min_keep=5, device="cpu"), roles, 12, i["base"], i["tokens"],
                               tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_the_selection_compares_only_the_declared_shares_and_importance_stands_elsewhere(phase_inputs, tmp_path):
    """``selection_shares``: the two masks are scored on selection at round(share · L·H) units only (the
    same NLLs as a full curve there); every other count takes the importance mask, as on a tie."""
    i, roles = phase_inputs, WindowsConfig(per_role=4)
    full = StaticBaselinesConfig(fit_windows=2, batch_size=2, device="cpu")
    build_static_baselines(full, roles, 12, i["base"], i["tokens"], tmp_path / "all")
    declared = StaticBaselinesConfig(fit_windows=2, batch_size=2, device="cpu", selection_shares=[0.5, 0.75])
    report = build_static_baselines(declared, roles, 12, i["base"], i["tokens"], tmp_path / "declared")
    every, some = StaticBaselines(tmp_path / "all"), StaticBaselines(tmp_path / "declared")
    assert [r["heads_kept"] for r in report["by_heads_kept"]] == [2, 3]
    for k in range(5):
        if k in (2, 3):
            for m in METHODS:
                assert some.selection_nll[m][k].item() == every.selection_nll[m][k].item()
            assert some.method(k) == every.method(k)
        else:
            assert all(np.isnan(some.selection_nll[m][k].item()) for m in METHODS) and some.method(k) == "importance"
    assert report["selection_nll_importance_at_half"] == every.selection_nll["importance"][2].item()
    assert "selection_shares" not in json.loads((tmp_path / "all" / "meta.json").read_text())["config"]  # omitted at the default
    with pytest.raises(ConfigError, match="selection_shares"):
        StaticBaselinesConfig(selection_shares=[1.5])


def test_a_killed_greedy_search_resumes_at_its_next_step(phase_inputs, tmp_path, monkeypatch):
    """The greedy search's state is kept after each step: killed in its third step, the stage resumes
    there (no step measured twice) and writes the bytes of a straight run; the checkpoint goes at the end."""
    import lookahead.pipeline.static_baselines as stage

    i, roles = phase_inputs, WindowsConfig(per_role=4)
    cfg = StaticBaselinesConfig(fit_windows=2, batch_size=2, device="cpu", candidates=2)
    build_static_baselines(cfg, roles, 12, i["base"], i["tokens"], tmp_path / "straight")
    calls, real, kill = [], stage.mask_nll, [True]

    def counted(lm, windows, on, **kw):
        calls.append(int(on.sum()))
        if kill[0] and len(calls) == 4 + 2 + 1:  # every head at step 1, the 2 candidates at step 2, then step 3
            raise KeyboardInterrupt
        return real(lm, windows, on, **kw)

    monkeypatch.setattr(stage, "mask_nll", counted)
    with pytest.raises(KeyboardInterrupt):
        build_static_baselines(cfg, roles, 12, i["base"], i["tokens"], tmp_path / "out", checkpoint_root=tmp_path / "ckpt")
    assert not (tmp_path / "out").exists() and len(list((tmp_path / "ckpt").glob("*/greedy.safetensors"))) == 1
    kill[0], calls[:] = False, []
    build_static_baselines(cfg, roles, 12, i["base"], i["tokens"], tmp_path / "out", checkpoint_root=tmp_path / "ckpt")
    assert calls[0] == 1  # its first trial drops one of the 2 heads still on: the third step, not the first (3 on)
    for name in ("baselines.safetensors", "meta.json"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "straight" / name).read_bytes()
    assert not list((tmp_path / "ckpt").glob("*/greedy.safetensors"))
