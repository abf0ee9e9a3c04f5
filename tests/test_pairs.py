"""The pairs stage: which sampled topologies are kept, and what the pairs file holds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from transformers import AutoModelForCausalLM

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.pairs import PAIRS_FILE
from lookahead.core.errors import ConfigError
from lookahead.graph.nodes import allowed_mask, n_edges, to_dense, unpack_bits
from lookahead.graph.predictor import PredictorConfig, StructurePredictor, save_predictor
from lookahead.graph.runtime import default_gates, forward_with_topology
from lookahead.lm.nll import token_nll
from lookahead.pipeline.pairs import PairsConfig, PairsError, build_pairs, select_pairs


def test_select_keeps_distinct_topologies_that_beat_dense_best_first():
    bits = np.array([[[1]], [[2]], [[1]], [[3]], [[4]]], dtype=np.uint8).repeat(2, axis=1)  # (S=5, P=2, 1)
    nll = np.array([[1.0, 5.0], [0.5, 4.0], [0.2, 6.0], [2.5, 1.0], [0.9, 2.0]])
    dense = np.array([2.0, 3.0])
    # position 0: samples by NLL 2 (bits 1), 1 (bits 2), 4 (bits 4), 0 (bits 1: a duplicate), 3 (above dense)
    # position 1: samples 3 and 4 beat dense 3.0
    assert select_pairs(bits, nll, dense, keep=3) == [[2, 1, 4], [3, 4]]
    assert select_pairs(bits, nll, dense, keep=1) == [[2], [3]]
    assert select_pairs(bits, nll, np.array([0.0, 0.0]), keep=3) == [[], []]


@pytest.fixture(scope="module")
def sampled(phase_inputs, tmp_path_factory):
    """Pairs of a predictor whose edges are coin flips (static logits 0): varied samples."""
    d = tmp_path_factory.mktemp("pairs")
    cache = ContextCache(phase_inputs["contexts"])
    torch.manual_seed(0)
    predictor = StructurePredictor.from_init(PredictorConfig.cascade(rank=2, hidden=8, init_bias=1.5), phase_inputs["init"],
                                             cache.dim)
    save_predictor(predictor, d / "predictor.safetensors")
    cfg = PairsConfig(target="beats_dense", sequences=6, samples=6, keep=3, batch_size=4, approx_positions=40, device="cpu")
    metrics = build_pairs(cfg, phase_inputs["base"], phase_inputs["contexts"], phase_inputs["init"],
                          d / "predictor.safetensors", d / "out")
    return cfg, metrics, load_file(str(d / "out" / PAIRS_FILE)), cache


def test_pairs_file_holds_kept_topologies_with_their_nll(sampled, phase_inputs):
    cfg, metrics, arrays, cache = sampled
    t_len = cache.context_length
    n_e = n_edges(2, 2)
    assert metrics["positions"] == 6 * t_len and metrics["pairs"] == len(arrays["rows"]) > 0
    assert metrics["bits_per_pair"] == n_e and arrays["bits"].shape == (metrics["pairs"], (n_e + 7) // 8)
    assert (arrays["nll"] < arrays["dense_nll"]).all()  # every pair beats its position's dense NLL
    assert metrics["mean_gain"] == pytest.approx(float((arrays["dense_nll"] - arrays["nll"]).mean()), rel=1e-5)
    rows = arrays["rows"]
    assert rows.min() >= 0 and rows.max() < 6 * t_len
    _, counts = np.unique(rows, return_counts=True)
    assert counts.max() <= cfg.keep
    assert metrics["multi_topology_share"] == pytest.approx((counts >= 2).sum() / metrics["positions"])
    for r in np.unique(rows):  # distinct topologies per position
        b = arrays["bits"][rows == r]
        assert len({x.tobytes() for x in b}) == len(b)
    # fractions agree with the bits; the dense NLL is the stock model's
    edges = torch.from_numpy(unpack_bits(arrays["bits"], n_e)).float()
    adjacency = to_dense(edges, allowed_mask(2, 2))
    gates = default_gates(adjacency)
    assert np.allclose(arrays["head_fraction"], gates[:, 1:].mean(-1).numpy())
    assert np.allclose(arrays["edge_fraction"], edges.mean(-1).numpy())
    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"]).eval()
    windows, _ = cache.batch("train", rows[:5] // t_len)
    with torch.no_grad():
        dense = token_nll(lm(windows[:, :-1]).logits, windows[:, 1:])
    assert np.allclose(dense[torch.arange(5), torch.from_numpy(rows[:5] % t_len)].numpy(), arrays["dense_nll"][:5], atol=1e-5)
    assert -1.0 <= metrics["approximation_spearman"] <= 1.0 and metrics["approximation_positions"] == 40
    assert metrics["pairs_per_s"] > 0  # in the report's timings (lookahead.core.report.split_timings)


def test_isolated_rescoring_of_the_first_position_is_exact(sampled, phase_inputs):
    """At position 0 nothing precedes: the one-forward NLL of a pair is its isolated NLL."""
    _, _, arrays, cache = sampled
    t_len = cache.context_length
    first = np.flatnonzero(arrays["rows"] % t_len == 0)
    assert len(first)
    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"]).eval()
    n_e = n_edges(2, 2)
    for i in first[:3]:
        windows, _ = cache.batch("train", [arrays["rows"][i] // t_len])
        adjacency = to_dense(torch.from_numpy(unpack_bits(arrays["bits"][i], n_e)).float(), allowed_mask(2, 2))
        ids = windows[:, :1]
        with torch.no_grad():
            nll = token_nll(forward_with_topology(lm, ids, adjacency[None, None], default_gates(adjacency)[None, None],
                                                  hard=True), windows[:, 1:2])
        assert nll.item() == pytest.approx(float(arrays["nll"][i]), abs=1e-5)


def test_more_sequences_than_cached_is_refused(phase_inputs, tmp_path):
    with pytest.raises(PairsError, match="contexts.train_sequences"):
        build_pairs(PairsConfig(target="beats_dense", sequences=1000), phase_inputs["base"], phase_inputs["contexts"], phase_inputs["init"],
                    tmp_path / "p.safetensors", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_cuda_without_a_device_names_the_pairs_key(phase_inputs, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError) as info:
        build_pairs(PairsConfig(target="beats_dense", device="cuda"), phase_inputs["base"], phase_inputs["contexts"], phase_inputs["init"],
                    tmp_path / "p.safetensors", tmp_path / "out")
    assert info.value.key == "pairs.device"
    assert not (tmp_path / "out").exists()


def test_sampler_without_flips_is_the_predictors_own_noise(phase_inputs):
    from lookahead.graph.sampling import sample_topologies

    cache = ContextCache(phase_inputs["contexts"])
    torch.manual_seed(0)
    predictor = StructurePredictor.from_init(PredictorConfig.cascade(rank=2, hidden=8, init_bias=0.5), phase_inputs["init"],
                                             cache.dim).train()
    windows, contexts = cache.batch("train", [0, 1])
    from lookahead.graph.predictor import load_init
    from lookahead.graph.scoring import GeoLookup

    tensors, _ = load_init(phase_inputs["init"])
    geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float())(windows[:, :-1])
    with torch.no_grad():
        expected = predictor(contexts, geo, hard=True, generator=torch.Generator().manual_seed(5))
        got = sample_topologies(predictor.eval(), contexts, geo, 0.0, torch.Generator().manual_seed(5))
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert not predictor.training  # the caller's mode is restored


def test_flips_turn_edges_of_a_saturated_predictor_off_at_their_rate():
    """One layer: a head is on iff its edge from the source is; logits of +100 put every edge on, so
    the share of heads on after flipping is 1 − flip_prob (binomial tolerance)."""
    from lookahead.graph.sampling import sample_topologies

    predictor = StructurePredictor(PredictorConfig.cascade(rank=1, hidden=4, init_bias=100.0, geo_features=False), 1, 8, 3)
    with torch.no_grad():
        _, gates = sample_topologies(predictor, torch.zeros(4000, 3), None, 0.1, torch.Generator().manual_seed(0))
        _, none = sample_topologies(predictor, torch.zeros(10, 3), None, 0.0, torch.Generator().manual_seed(0))
    assert gates[:, 1:].mean().item() == pytest.approx(0.9, abs=0.005)  # sd of the mean ≈ 0.0017
    assert (none == 1).all()


def test_pairs_of_a_head_gate_router_store_its_heads_and_beside_them_a_null(phase_inputs, tmp_path):
    """A head-gate router reading the LM (query skip): the stored bits are every edge among the
    active heads, so the gates read back from them are the sampled ones (exactly K per position
    before the exploration flips); the null statistics sit beside the pairs'."""
    from lookahead.graph.router_inputs import input_dim
    from lookahead.graph.sampling import executed_topology

    cache = ContextCache(phase_inputs["contexts"])
    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"]).eval()
    torch.manual_seed(0)
    cfg_p = PredictorConfig(rank=2, hidden=8, gate="head", budget="topk", keep=0.5, input="lm")
    predictor = StructurePredictor.from_init(cfg_p, phase_inputs["init"], input_dim("lm", cache.dim, lm.config.hidden_size))
    save_predictor(predictor, tmp_path / "predictor.safetensors", extra={"runtime": {"skip": "query"}})
    cfg = PairsConfig(target="beats_dense", sequences=4, samples=4, keep=2, batch_size=4, approx_positions=20, flip_prob=0.0, device="cpu")
    metrics = build_pairs(cfg, phase_inputs["base"], phase_inputs["contexts"], phase_inputs["init"],
                          tmp_path / "predictor.safetensors", tmp_path / "out")
    arrays = load_file(str(tmp_path / "out" / PAIRS_FILE))
    n_e = n_edges(2, 2)
    edges = torch.from_numpy(unpack_bits(arrays["bits"], n_e)).float()
    mask = allowed_mask(2, 2)
    adjacency, gates = executed_topology(edges, mask, 2, 2, "head")
    assert gates[:, 1:].sum(-1).eq(2).all()  # top-2 of 4 heads, no flips
    assert np.allclose(arrays["head_fraction"], 0.5)
    assert torch.equal(to_dense(edges, mask), mask.float() * gates[:, :, None] * gates[:, None, :])
    assert torch.equal(adjacency, mask.float() * gates[:, :, None])  # executed: every edge out of an active head
    for key in ("multi_topology_share", "positions_with_pair_share"):
        assert 0.0 <= metrics[f"{key}_null"] <= 1.0
    assert metrics["multi_topology_share_null"] <= metrics["positions_with_pair_share_null"]
    assert metrics["positions_with_pair_share"] > 0
