"""Keep sets, the label-free ground truth of good ones, and the decoders judged on it (issue: a
structure decoder that captures several good topologies)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lookahead.graph.keepsets import (KeepSetAR, as_gates, eps_good, gumbel_topk, marginal_sets, recall_at,
                                      score_keep_sets, search_keep_sets, single_swaps)
from lookahead.graph.nodes import head_graph
from lookahead.graph.oracle import DenseKL, greedy_gates, kl_to_dense
from lookahead.graph.runtime import forward_with_topology
from lookahead.pipeline.diffusion.decoders import static_set, truth_sets


def sets_of(*rows):
    return torch.tensor(rows, dtype=torch.bool)


def test_single_swaps_are_every_one_out_one_in_move():
    keep = sets_of([1, 1, 0, 0, 1, 0])[0]
    swaps = single_swaps(keep[None])[:, 0]
    assert swaps.shape == (3 * 3, 6)
    assert (swaps.sum(-1) == 3).all()
    assert ((swaps != keep).sum(-1) == 2).all()  # one head out, one in
    assert len({tuple(s.tolist()) for s in swaps}) == 9
    with pytest.raises(ValueError, match="one size"):
        single_swaps(sets_of([1, 0, 0], [1, 1, 0]))


def test_eps_good_keeps_distinct_sets_within_eps_of_the_best():
    # 4 candidates at 2 positions (B = 1, T = 2); candidate 2 repeats candidate 0 at position 0
    sets = torch.zeros(4, 1, 2, 4, dtype=torch.bool)
    sets[0, 0, 0] = sets[2, 0, 0] = sets_of([1, 1, 0, 0])
    sets[1, 0, 0], sets[3, 0, 0] = sets_of([1, 0, 1, 0]), sets_of([0, 0, 1, 1])
    sets[:, 0, 1] = torch.stack([sets_of(*[[1, 1, 0, 0]]), sets_of([0, 1, 1, 0]), sets_of([0, 0, 1, 1]),
                                 sets_of([1, 0, 0, 1])]).squeeze(1)
    kl = torch.tensor([[[0.10, 0.30]], [[0.12, 0.05]], [[0.10, 0.051]], [[0.5, 0.2]]])
    out = eps_good(sets, kl, 0.025)
    assert out[0][0].tolist() == [0, 1]  # 0.10 (and its repeat, dropped), 0.12; not 0.5
    assert out[1][0].tolist() == [1, 2]  # 0.05, 0.051
    assert torch.allclose(out[1][1], torch.tensor([0.05, 0.051]))
    assert [len(i) for i, _ in eps_good(sets, kl, 0.0)] == [1, 1]


def test_recall_at_n_counts_true_sets_hit_by_the_first_n_samples():
    truth = torch.stack([sets_of([1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 0, 0])])  # the third slot is padding
    valid = torch.tensor([[True, True, False]])
    samples = torch.stack([sets_of([1, 0, 1, 0], [0, 1, 1, 0], [1, 1, 0, 0], [0, 1, 1, 0])])
    r = recall_at(samples, truth, valid, ns=(1, 2, 3, 8))
    assert [float(r[n]) for n in (1, 2, 3, 8)] == [0.0, 0.5, 1.0, 1.0]


def test_truth_sets_and_the_static_null():
    rows = np.array([3, 0, 3, 3])
    sets = sets_of([1, 1, 0, 0], [0, 0, 1, 1], [1, 0, 1, 0], [1, 0, 0, 1])
    truth, valid, has = truth_sets(rows, sets, 5)
    assert truth.shape == (5, 3, 4) and has.tolist() == [True, False, False, True, False]
    assert valid.sum(-1).tolist() == [1, 0, 0, 3, 0]
    assert torch.equal(truth[3, :3], sets[[0, 2, 3]]) and torch.equal(truth[0, 0], sets[1])
    assert static_set(sets, 2).tolist() == [True, False, True, False]  # head 0 in 3 sets; heads 2, 3 in 2 (lower first)


def test_budget_samplers_keep_exactly_k_heads():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(500, 6, generator=gen)
    assert (gumbel_topk(logits, 3, gen).sum(-1) == 3).all()
    probs = torch.tensor([0.999, 0.001, 0.999, 0.001, 0.001, 0.001]).expand(200, -1)
    drawn = marginal_sets(probs, 2, gen)
    assert (drawn.sum(-1) == 2).all() and drawn[:, [0, 2]].float().mean() > 0.95


def test_the_autoregressive_decoder_is_an_exact_distribution_over_the_budgets_sets():
    torch.manual_seed(0)
    model = KeepSetAR(3, 6, 3, hidden=8)
    torch.nn.init.normal_(model.pair, std=1.0)
    torch.nn.init.normal_(model.rate, std=1.0)
    x = torch.randn(1, 3)
    every = torch.tensor([[i in c for i in range(6)] for c in itertools.combinations(range(6), 3)])
    logp = model.log_prob(x.expand(len(every), -1), every)
    assert len(every) == math.comb(6, 3) and float(logp.exp().sum()) == pytest.approx(1.0, abs=1e-5)
    drawn, drawn_logp = model.sample(x.expand(4000, -1), torch.Generator().manual_seed(1))
    assert (drawn.sum(-1) == 3).all()
    codes = {tuple(r.tolist()): i for i, r in enumerate(every)}
    index = torch.tensor([codes[tuple(r.tolist())] for r in drawn])
    assert torch.allclose(drawn_logp, logp[index], atol=1e-5)  # sampling and scoring agree
    share = torch.bincount(index, minlength=len(every)).float() / len(index)
    assert (share - logp.exp()).abs().max() < 0.03


def test_candidates_are_scored_as_the_plain_runtime_scores_them(phase_inputs):
    from transformers import AutoModelForCausalLM

    from lookahead.artifacts.contexts import ContextCache

    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"]).eval()
    cache = ContextCache(phase_inputs["contexts"])
    windows = torch.from_numpy(cache.windows("val")[:2].astype(np.int64))
    ids, targets = windows[:, :-1], windows[:, 1:]
    with torch.no_grad():
        dense_logp = F.log_softmax(lm(input_ids=ids).logits.float(), -1)
    gen = torch.Generator().manual_seed(0)
    candidates = gumbel_topk(torch.randn(3, *ids.shape, 4, generator=gen), 2, gen)  # per-position sets
    kl, nll = score_keep_sets(lm, ids, targets, candidates, DenseKL(dense_logp), 2, 2, "query", max_rows=4)
    for c in range(3):
        gates = as_gates(candidates[c])
        with torch.no_grad():
            logits = forward_with_topology(lm, ids, head_graph(gates, 2, 2), gates, skip="query")
        assert torch.allclose(kl[c], kl_to_dense(dense_logp, logits), atol=1e-5)
        assert torch.allclose(nll[c], F.cross_entropy(logits.transpose(1, 2), targets, reduction="none"), atol=1e-5)
    sets, kls, _ = search_keep_sets(lm, ids, None, 2, 2, 2, "query", rounds=2)
    assert sets.shape[0] == 1 + 2 * 4 and (sets.sum(-1) == 2).all()
    assert torch.equal(sets[0], greedy_gates(lm, ids, 2, 2, 2, "query")[..., 1:] > 0.5)  # candidate 0: the greedy set
    assert (kls.min(0).values <= kls[0]).all()


@pytest.fixture(scope="module")
def keepset_run(phase_inputs, tmp_path_factory):
    """The pairs stage's eps-good ground truth and the diffusion stage's decoders on it, for a router
    with head gates (top-2 of 4) reading the LM's states."""
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    from lookahead.artifacts.contexts import ContextCache
    from lookahead.artifacts.pairs import PAIRS_FILE
    from lookahead.core.config import from_dict
    from lookahead.graph.predictor import PredictorConfig, StructurePredictor, save_predictor
    from lookahead.graph.router_inputs import input_dim
    from lookahead.pipeline.diffusion.build import DiffusionConfig, build_diffusion
    from lookahead.pipeline.pairs import PairsConfig, build_pairs

    d = tmp_path_factory.mktemp("keepsets")
    cache = ContextCache(phase_inputs["contexts"])
    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"]).eval()
    torch.manual_seed(0)
    cfg_p = PredictorConfig(rank=2, hidden=8, gate="head", budget="topk", keep=0.5, input="lm", geo_features=False)
    predictor = StructurePredictor.from_init(cfg_p, phase_inputs["init"], input_dim("lm", cache.dim, lm.config.hidden_size))
    save_predictor(predictor, d / "predictor.safetensors", extra={"runtime": {"skip": "query"}})
    pcfg = PairsConfig(sequences=3, val_sequences=2, rounds=1, eps=0.01, batch_size=3, device="cpu")
    metrics = build_pairs(pcfg, phase_inputs["base"], phase_inputs["contexts"], phase_inputs["init"],
                          d / "predictor.safetensors", d / "pairs")
    cfg = from_dict(DiffusionConfig, {
        "denoiser": {"hidden": 8, "layers": 1, "rank": 2, "cond_hidden": 8}, "sample_steps": 2, "eval_samples": 3,
        "eval_batch_size": 2, "val_pairs": 16, "autoregressive": {"steps": 10, "batch_size": 16, "hidden": 8},
        "train": {"steps": 4, "batch_size": 8, "warmup_steps": 1, "eval_every": 2, "log_every": 1,
                  "checkpoint_every": 0, "device": "cpu"}})
    report, _, _ = build_diffusion(cfg, phase_inputs["base"], phase_inputs["contexts"], phase_inputs["init"],
                                   d / "predictor.safetensors", d / "pairs", d / "diffusion")
    return {"pairs": metrics, "arrays": load_file(str(d / "pairs" / PAIRS_FILE)), "report": report, "cfg": pcfg,
            "dir": d, "cache": cache, "lm": lm, "predictor": predictor, "init": phase_inputs["init"]}


def test_the_ground_truth_holds_each_positions_eps_good_sets(keepset_run):
    arrays, metrics, cfg = keepset_run["arrays"], keepset_run["pairs"], keepset_run["cfg"]
    t_len = keepset_run["cache"].context_length
    assert set(np.unique(arrays["split"]).tolist()) == {0, 1}
    assert metrics["positions"] == (3 + 2) * t_len and metrics["pairs"] == len(arrays["rows"])
    assert metrics["candidates_per_position"] == 1 + 2 * 2 and metrics["search_space"] == 6
    for split in (0, 1):
        sel = arrays["split"] == split
        rows, kl, rank = arrays["rows"][sel], arrays["kl"][sel], arrays["rank"][sel]
        assert len(np.unique(rows)) == (3 if split == 0 else 2) * t_len  # every position has its best set
        for r in np.unique(rows)[:40]:
            at = rows == r
            assert rank[at].tolist() == list(range(at.sum()))
            assert kl[at][0] == kl[at].min() and kl[at].max() <= kl[at][0] + cfg.eps + 1e-6
    counts = np.bincount(arrays["rows"][arrays["split"] == 0])
    assert metrics["eps_good_per_position"] == pytest.approx(counts[counts > 0].mean())
    assert metrics["best_kl"] <= metrics["greedy_kl"]


def test_the_decoders_are_judged_on_the_val_ground_truth(keepset_run):
    from lookahead.graph.denoiser import draw_topology, load_denoiser
    from lookahead.graph.oracle import gates_nll
    from lookahead.graph.predictor import load_init
    from lookahead.graph.router_inputs import router_context
    from lookahead.graph.scoring import GeoLookup
    from lookahead.pipeline.diffusion.build import KEEPSET_HEADLINE, SAMPLERS, headline

    report, cache, lm, predictor = (keepset_run[k] for k in ("report", "cache", "lm", "predictor"))
    assert headline(keepset_run["dir"] / "pairs") == KEEPSET_HEADLINE
    from lookahead.core.seeds import one_run

    assert one_run(KEEPSET_HEADLINE) <= set(report)  # the paired claims come with the seeds (decoder_claims)
    for name in SAMPLERS:
        for n in (1, 4, 8):
            assert 0.0 <= report[f"{name}_recall_at_{n}"] <= 1.0
        assert report[f"{name}_best_of_k_target_nll"] <= report[f"{name}_best_of_k_label_free_nll"] + 1e-6
    assert report["router_recall_at_1"] == report["router_recall_at_8"]  # one set
    from lookahead.pipeline.diffusion.plots import keepset_rows
    assert [row["sampler"] for row in keepset_rows(report)] == list(SAMPLERS)  # the plot's rows: every sampler
    # the router's figure against a plain reference: its top-2 gates run over the two val windows
    windows = torch.from_numpy(cache.windows("val")[:2].astype(np.int64))
    with torch.no_grad():
        gates = predictor.eval()(router_context("lm", lm, windows[:, :-1], None), None, hard=True)[1]
    assert report["deterministic_nll"] == pytest.approx(float(gates_nll(lm, windows, gates, 2, 2, "query").mean()), abs=1e-5)
    # the saved head reads the router's inputs and keeps the budget wherever it is drawn (evaluate, phase 2)
    denoiser, meta = load_denoiser(keepset_run["dir"] / "diffusion")
    assert meta["input"] == "lm" and meta["heads_kept"] == 2
    tensors, _ = load_init(keepset_run["init"])
    geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float())(windows[:, :-1])
    _, drawn = draw_topology(denoiser, lm, windows[:, :-1], None, geo, 2, 1.0, torch.Generator().manual_seed(0),
                             "head")
    assert (drawn[..., 1:].sum(-1) == 2).all()


def test_a_prior_stacks_the_decoder_on_another_routers_logits():
    torch.manual_seed(0)
    model = KeepSetAR(2 + 5, 5, 2, hidden=4, prior=True)
    torch.nn.init.zeros_(model.net[-1].weight)
    torch.nn.init.zeros_(model.net[-1].bias)
    prior = torch.tensor([[-20.0, 20.0, -20.0, 20.0, -20.0]])
    x = torch.cat([torch.randn(50, 2), prior.expand(50, -1)], -1)
    drawn, _ = model.sample(x, torch.Generator().manual_seed(0))
    assert drawn.tolist() == [[False, True, False, True, False]] * 50  # the prior's top-2, at weight 1
    every = torch.tensor([[i in c for i in range(5)] for c in itertools.combinations(range(5), 2)])
    assert float(model.log_prob(x[:1].expand(len(every), -1), every).exp().sum()) == pytest.approx(1.0, abs=1e-5)


def test_the_autoregressive_decoder_is_causal(phase_inputs):
    """Its inputs are the router's (the token embedding at t, the LM's state at t − 1): changing the
    tokens after t changes no sample at or before t (docs/design.md; evaluate checks the other decoders)."""
    from transformers import AutoModelForCausalLM

    from lookahead.artifacts.contexts import ContextCache
    from lookahead.graph.router_inputs import router_context

    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"]).eval()
    ids = torch.from_numpy(ContextCache(phase_inputs["contexts"]).windows("val")[:1, :-1].astype(np.int64))
    t = ids.shape[1] // 2
    changed = ids.clone()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 7) % lm.config.vocab_size
    torch.manual_seed(0)
    model = KeepSetAR(2 * lm.config.hidden_size, 4, 2, hidden=8)
    draws = [model.sample(router_context("lm", lm, x, None)[0], torch.Generator().manual_seed(3))[0] for x in (ids, changed)]
    assert torch.equal(draws[0][: t + 1], draws[1][: t + 1])
    assert not torch.equal(router_context("lm", lm, ids, None)[0, t + 2 :], router_context("lm", lm, changed, None)[0, t + 2 :])


def test_the_decoders_claims_pair_their_figures_position_by_position(keepset_run):
    from lookahead.pipeline.diffusion.judge import DECODER_CLAIMS, TOKEN_KEY, decoder_claims

    report = keepset_run["report"]
    tokens = report[TOKEN_KEY]
    has = tokens["has_truth"]
    assert has.any() and len(has) % tokens["window"] == 0
    for name in ("baseline", "autoregressive", "diffusion", "diffusion_frequency"):
        # the per-position figures are the summary's: recall over the positions with an ε-good set (0
        # elsewhere), the label-free best of K over every position
        assert tokens[f"{name}_recall_at_8"][has].mean() == pytest.approx(report[f"{name}_recall_at_8"], abs=1e-6)
        assert (tokens[f"{name}_recall_at_8"][~has] == 0).all()
        assert tokens[f"{name}_best_of_k_label_free_nll"].mean() == pytest.approx(
            report[f"{name}_best_of_k_label_free_nll"], rel=1e-6)
    # two "seeds": the run, and the run with the diffusion head's NLLs 0.1 higher everywhere
    shifted = {k: v + 0.1 if k == "diffusion_best_of_k_label_free_nll" else v for k, v in tokens.items()}
    runs = [{TOKEN_KEY: tokens}, {TOKEN_KEY: shifted}]
    decoder_claims(runs)
    assert all(TOKEN_KEY not in r for r in runs)
    claims = runs[0]
    recall = report["diffusion_recall_at_8"] - report["baseline_recall_at_8"]
    assert claims["diffusion_minus_baseline_recall_at_8"] == pytest.approx(recall, abs=1e-6)
    assert claims["diffusion_minus_baseline_recall_at_8_sd"] == pytest.approx(0.0, abs=1e-12)
    nll = report["diffusion_best_of_k_label_free_nll"] - report["diffusion_frequency_best_of_k_label_free_nll"]
    assert claims["best_of_k_minus_null"] == pytest.approx(nll + 0.05, abs=1e-5)  # float32 NLLs
    assert claims["best_of_k_minus_null_sd"] == pytest.approx(0.1 / np.sqrt(2), rel=1e-6)
    for name, _, _ in DECODER_CLAIMS:
        assert claims[f"{name}_ci_low"] <= claims[name] <= claims[f"{name}_ci_high"], name
    # two seeds that differ by 0.1: the half-width is at least the normal quantile times the seeds' se
    # (sd / √2 = 0.05), and the seeds' component enters with its t quantile
    half = claims["best_of_k_minus_null_ci_high"] - claims["best_of_k_minus_null"]
    assert half >= 1.96 * 0.05 and half > 1.96 * claims["best_of_k_minus_null_se"]


def test_a_cut_off_ground_truth_resumes_from_its_kept_batches(keepset_run, phase_inputs, tmp_path, monkeypatch):
    """``pairs.target: eps_good`` keeps each batch's keep-set search as it finishes: a run cut off after
    its first batch searches only the others and writes the same pairs file as the uncut run; the
    kept searches go once the file is written."""
    from lookahead.artifacts.pairs import PAIRS_FILE
    from lookahead.pipeline import pairs

    d, cfg = keepset_run["dir"], keepset_run["cfg"]  # 3 train + 2 val windows, 3 per batch: 2 batches
    real, calls = pairs.search_keep_sets, []

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    def run(out):
        return pairs.build_pairs(cfg, phase_inputs["base"], phase_inputs["contexts"], phase_inputs["init"],
                                 d / "predictor.safetensors", out, tmp_path / "ckpt")

    monkeypatch.setattr(pairs, "search_keep_sets", counted)
    monkeypatch.setattr(pairs.shutil, "rmtree", lambda *a, **k: None)  # keep the first run's searches
    run(tmp_path / "a")
    kept = sorted((tmp_path / "ckpt").rglob("*.safetensors"))
    assert [p.name for p in kept] == ["batch-00000.safetensors", "batch-00001.safetensors"] and len(calls) == 2
    kept[1].unlink()  # cut off before its second batch was kept
    monkeypatch.undo()
    monkeypatch.setattr(pairs, "search_keep_sets", counted)
    run(tmp_path / "b")
    assert len(calls) == 3  # the second batch alone was searched again
    for out in ("a", "b"):
        assert (tmp_path / out / PAIRS_FILE).read_bytes() == (d / "pairs" / PAIRS_FILE).read_bytes()
    assert not any((tmp_path / "ckpt").rglob("*.safetensors"))


def test_sampled_swaps_are_a_seeded_subset_of_the_single_swaps(phase_inputs):
    """``pairs.swaps``: a round tries a seeded draw of the single swaps (the same swaps as the full
    enumeration at those indices) and ``pairs.per_round`` / ``candidates`` set the greedy set's search."""
    from transformers import AutoModelForCausalLM

    from lookahead.artifacts.contexts import ContextCache
    from lookahead.graph.keepsets import sampled_swaps, search_keep_sets, single_swaps
    from lookahead.graph.oracle import greedy_gates

    keep = torch.tensor([[True, False, True, False, False, True]])  # K = 3 of 6: 9 swaps
    which = sampled_swaps(3, 6, 4, torch.Generator().manual_seed(0))
    assert which.tolist() == sorted(set(which.tolist())) and len(which) == 4 and int(which.max()) < 9
    assert torch.equal(single_swaps(keep, which), single_swaps(keep)[which])
    assert sampled_swaps(3, 6, 0, torch.Generator()) is None and sampled_swaps(3, 6, 9, torch.Generator()) is None
    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"]).eval()
    windows = torch.from_numpy(ContextCache(phase_inputs["contexts"]).windows("train")[:2].astype(np.int64))
    ids = windows[:, :-1]
    sets, kl, nll = search_keep_sets(lm, ids, windows[:, 1:], 2, 2, 2, "query", rounds=2, per_round=2, candidates=2,
                                     swaps=3, generator=torch.Generator().manual_seed(1))
    assert sets.shape[0] == 1 + 2 * 3 and kl.shape == nll.shape == sets.shape[:3]
    assert torch.equal(sets[0], greedy_gates(lm, ids, 2, 2, 2, "query", per_round=2, candidates=2)[..., 1:] > 0.5)
