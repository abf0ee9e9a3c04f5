"""The evaluate stage: figures of a topology against a hand count, the causality check catches a
decoder that peeks and fails the stage, and the table's rows are those of the models it reads."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.static_baselines import StaticBaselines
from lookahead.artifacts.val_scores import ScoringConfig
from lookahead.core.config import from_dict
from lookahead.core.errors import ConfigError
from lookahead.graph.nodes import allowed_mask
from lookahead.graph.predictor import PredictorConfig, StructurePredictor, load_init, load_predictor
from lookahead.graph.router_inputs import input_dim, router_context
from lookahead.graph.scoring import GeoLookup, static_pruning_curve
from lookahead.lm.encoders import load_context_encoder
from lookahead.lm.nll import token_nll
from lookahead.pipeline.evaluate import build as ev
from lookahead.pipeline.evaluate.build import HEADLINE, build_evaluate
from lookahead.pipeline.evaluate.causality import causality_check
from lookahead.pipeline.evaluate.config import EvaluateConfig, EvaluateError
from lookahead.pipeline.evaluate.rows import Shapes, position_figures, predictor_topologies

# the table's rows, in order (docs/development.md, "Adding an evaluate row"): written out here, not read from the code
ROW_ORDER = ("dense_base", "phase1_soft", "phase1_hard", "diffusion_sample", "diffusion_best_of_k", "phase2_soft",
             "phase2_hard", "dense_control", "static_control", "static_pruning", "random_heads", "static_pruning_phase2",
             "random_heads_phase2", "random_sample", "random_best_of_k")
from lookahead.pipeline.evaluate.plots import write_evaluate_outputs


def test_position_figures_match_a_hand_count():
    s = Shapes(n_layers=2, n_heads=2, d_model=8, d_head=4)
    mask = allowed_mask(2, 2).float()
    # one window of 3 positions; node order: source, (l0 h0), (l0 h1), (l1 h0), (l1 h1)
    gates = torch.tensor([[[1, 1, 0, 1, 1], [1, 1, 1, 0, 1], [1, 0, 0, 1, 0]]], dtype=torch.float32)
    adjacency = mask * gates[..., :, None] * gates[..., None, :]
    fig = position_figures(adjacency, gates, s)
    d, D = 8, 4
    for t in range(3):
        flops = 0
        for node in range(1, 5):
            if gates[0, t, node]:
                keys = int(gates[0, : t + 1, node].sum())  # positions <= t where this head runs
                flops += 8 * d * D + 4 * D * keys
        dense = 4 * (8 * d * D + 4 * D * (t + 1))
        assert fig["attn_flops"][0, t].item() == flops and fig["dense_flops"][0, t].item() == dense
        edges = int((adjacency[0, t] > 0).sum())
        assert fig["mixing_flops"][0, t].item() == 2 * d * edges  # every edge here ends at a head that runs
        assert fig["heads"][0, t].tolist() == [gates[0, t, 1:3].sum().item(), gates[0, t, 3:5].sum().item()]
        into_l1 = adjacency[0, t, :, 3:5].sum().item()
        assert fig["edges"][0, t, 1].item() == into_l1
    # query skip: every head projects its key and value at every position; a head that runs adds its
    # query and output projections and attends to all t + 1 keys
    fig = position_figures(adjacency, gates, s, "query")
    for t in range(3):
        running = int(gates[0, t, 1:].sum())
        flops = 4 * (4 * d * D) + running * (4 * d * D + 4 * D * (t + 1))
        assert fig["attn_flops"][0, t].item() == flops


@pytest.fixture(scope="module")
def causal_setup(downstream_inputs, tiny_tokenizer):
    cache = ContextCache(downstream_inputs["contexts"])
    tensors, _ = load_init(downstream_inputs["init"])
    geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float())
    lm = AutoModelForCausalLM.from_pretrained(downstream_inputs["base"], dtype=torch.float32).eval()
    encoder = load_context_encoder("base", downstream_inputs["base"], tiny_tokenizer, 8, False, device="cpu")
    predictor, _ = load_predictor(downstream_inputs["predictor"])
    return cache, geo, lm, encoder, predictor


def peeking(predictor):
    """A decoder that reads the last position's context: the topology at t depends on later tokens."""
    def draw(ids, contexts, geo):
        return [predictor(contexts[:, -1:].expand_as(contexts), geo, hard=False)]

    return draw


def test_causality_check_passes_a_causal_decoder_and_catches_one_that_peeks(causal_setup):
    cache, geo, lm, encoder, predictor = causal_setup
    cfg = EvaluateConfig(causality_windows=2, causality_cuts=3)
    good = causality_check({"predictor": (lm, predictor_topologies(predictor, hard=True))}, encoder, cache, geo, cfg,
                           lm.config.vocab_size, "cpu")
    assert good["passed"] and good["max_change"] <= 1e-5
    assert good["after_cut_changed_fraction"] > 0.9  # the perturbation does reach the model after t
    bad = causality_check({"peeking": (lm, peeking(predictor))}, encoder, cache, geo, cfg, lm.config.vocab_size, "cpu")
    assert not bad["passed"] and bad["per_decoder"]["peeking"] > 1e-3


@pytest.mark.parametrize("kind", ["lm", "embedding", "layer"])
def test_causality_check_covers_routers_that_read_the_lm(causal_setup, kind):
    """A head-gate router reading the LM's own states (random weights, so its gates do depend on
    them) passes the check with the real perturbed text; its topology does move after t."""
    cache, geo, lm, encoder, _ = causal_setup
    torch.manual_seed(3)
    budget = "topk_layer" if kind == "layer" else "topk"
    cfg_p = PredictorConfig(rank=2, hidden=8, gate="head", budget=budget, keep=0.5, input=kind, geo_features=False)
    width = input_dim(kind, cache.dim, lm.config.hidden_size, lm.config.num_hidden_layers)
    predictor = StructurePredictor(cfg_p, lm.config.num_hidden_layers, lm.config.num_attention_heads, width).eval()
    weights = ((predictor.layer_in, predictor.layer_out) if kind == "layer"
               else (predictor.mlp[0].weight, predictor.to_gate.weight))
    for weight in weights:
        torch.nn.init.normal_(weight, std=10.0)
    cfg = EvaluateConfig(causality_windows=2, causality_cuts=3)
    for skip in ("full", "query") if kind == "lm" else ("query",):
        out = causality_check({"router": (lm, predictor_topologies(predictor, hard=True, lm=lm))}, encoder, cache, geo,
                              cfg, lm.config.vocab_size, "cpu", skip)
        assert out["passed"] and out["max_change"] <= 1e-5 and out["after_cut_changed_fraction"] > 0.9
    ids = torch.from_numpy(cache.windows("val")[:1, :-1].astype(np.int64))
    later = ids.clone()
    later[:, 5:] = (later[:, 5:] + 1) % lm.config.vocab_size
    z1, z2 = (predictor.head_logits(router_context(kind, lm, x, None)) for x in (ids, later))
    assert torch.equal(z1[:, :5], z2[:, :5]) and (z1[:, 5:] - z2[:, 5:]).abs().max() > 1e-3  # it reads the tokens


@pytest.fixture(scope="module")
def evaluation(downstream_inputs, phase2_run):
    i = downstream_inputs
    cfg = from_dict(EvaluateConfig, {"eval_batch_size": 2, "diffusion_samples": 3, "random_draws": 2, "timing_rounds": 1,
                                     "causality_windows": 1, "causality_cuts": 2, "explainer_tokens": 6})
    return cfg, build_evaluate(cfg, i["base"], i["contexts"], i["init"], i["static_baselines"], i["predictor"], i["diffusion"],
                               phase2_run["out"], phase2_run["control_dir"], phase2_run["static_control_dir"],
                               scoring=ScoringConfig(resamples=200), scores=phase2_run["scores"])


def test_table_rows_are_the_models_they_name(evaluation, downstream_inputs, phase2_run):
    cfg, result = evaluation
    phase2 = phase2_run["report"]
    report = result.report
    assert set(HEADLINE) <= set(report) and list(report["table"]) == list(ROW_ORDER)
    cache = ContextCache(downstream_inputs["contexts"])
    windows = torch.from_numpy(cache.windows("val").astype(np.int64))
    base = AutoModelForCausalLM.from_pretrained(downstream_inputs["base"], dtype=torch.float32).eval()
    control = AutoModelForCausalLM.from_pretrained(phase2_run["control_dir"], dtype=torch.float32).eval()
    with torch.no_grad():
        for lm, key in ((base, "dense_base_nll"), (control, "dense_control_nll")):
            assert report[key] == pytest.approx(token_nll(lm(input_ids=windows[:, :-1]).logits, windows[:, 1:]).mean().item(),
                                                rel=1e-5)
    table = report["table"]
    # the phase-2 rows are what the phase-2 stage measured on the same windows (another code path)
    assert table["phase2_hard"]["nll"] == pytest.approx(phase2["hard_nll"], rel=1e-5)
    assert table["phase2_soft"]["nll"] == pytest.approx(phase2["soft_nll"], rel=1e-5)
    assert table["phase2_hard"]["active_head_fraction"] == pytest.approx(phase2["active_head_fraction"], rel=1e-5)
    assert table["diffusion_best_of_k"]["nll"] <= table["diffusion_sample"]["nll"] + 1e-6
    # static pruning keeps round(fraction * 4) heads: the point of the whole-head curve at that count
    k = round(report["phase2_active_head_fraction"] * 4)
    ranking = StaticBaselines(downstream_inputs["static_baselines"]).ranking(k)  # the stronger static baseline at k
    curve = static_pruning_curve(control, [windows], ranking)
    assert table["static_pruning"]["nll"] == pytest.approx(curve[k]["nll"], rel=1e-5)
    assert table["static_pruning"]["active_head_fraction"] == pytest.approx(k / 4)
    # the static control: its LM under the same k heads, which is what its stage measured
    static = AutoModelForCausalLM.from_pretrained(phase2_run["static_control_dir"], dtype=torch.float32).eval()
    curve = static_pruning_curve(static, [windows], ranking)
    assert table["static_control"]["nll"] == pytest.approx(curve[k]["nll"], rel=1e-5)
    assert table["static_control"]["nll"] == pytest.approx(phase2_run["static_control"]["val_nll"], rel=1e-5)
    assert table["static_control"]["active_head_fraction"] == pytest.approx(k / 4)
    assert report["phase2_minus_static_control"] == pytest.approx(table["phase2_hard"]["nll"] - table["static_control"]["nll"])
    assert report["phase2_minus_control"] == pytest.approx(table["phase2_hard"]["nll"] - report["dense_control_nll"])
    # each claim: the paired mean over seeds and positions, inside its interval
    assert report["diffusion_best_of_k_minus_null"] == pytest.approx(report["diffusion_best_of_k_nll"]
                                                                     - report["random_best_of_k_nll"], abs=1e-6)
    for claim in ("phase2_minus_control", "phase2_minus_static_control", "diffusion_best_of_k_minus_null"):
        assert report[f"{claim}_ci_low"] < report[claim] < report[f"{claim}_ci_high"], claim
    for name, row in table.items():
        assert 0.0 <= row["active_head_fraction"] <= 1.0 and len(row["active_head_fraction_per_layer"]) == 2, name
        assert row["ppl"] == pytest.approx(np.exp(row["nll"]))
    assert table["dense_base"]["attention_only_flops_over_dense"] == 1.0
    assert table["phase2_hard"]["tokens_per_s_over_dense"] > 0
    assert report["causality_max_change"] <= cfg.causality_tolerance


def load_file_importance(path):
    from safetensors.torch import load_file

    return load_file(str(path))["importance"].float()


def test_outputs_table_plots_and_a_self_contained_explainer(evaluation, tmp_path):
    _, result = evaluation
    outputs = {"table": tmp_path / "t.md", "pareto": tmp_path / "p.csv", "layers": tmp_path / "l.csv",
               "figure": tmp_path / "e.png", "page": tmp_path / "e.html"}
    write_evaluate_outputs(result, outputs)
    md = outputs["table"].read_text()
    assert all(f"`{name}`" in md for name in ROW_ORDER)
    assert outputs["figure"].stat().st_size > 20_000
    page = outputs["page"].read_text()
    assert page.count("<svg") == 1 and "<script" not in page and "<text" not in page  # text drawn as paths
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//|url\(\s*["']?(?:https?:)?//|@import""", page)
    assert "phase2_hard" in page


def test_a_decoder_that_peeks_fails_the_stage(downstream_inputs, phase2_run, monkeypatch):
    i = downstream_inputs
    real = ev.predictor_topologies
    monkeypatch.setattr(ev, "predictor_topologies", lambda p, hard, lm=None: peeking(p) if hard else real(p, hard, lm))
    cfg = EvaluateConfig(eval_batch_size=4, diffusion_samples=1, random_draws=1, timing_rounds=1, causality_windows=1,
                         causality_cuts=1)
    with pytest.raises(EvaluateError, match="causality check failed"):
        build_evaluate(cfg, i["base"], i["contexts"], i["init"], i["static_baselines"], i["predictor"], i["diffusion"],
                       phase2_run["out"], phase2_run["control_dir"], phase2_run["static_control_dir"])


def test_config_is_validated_with_the_key_named():
    with pytest.raises(ConfigError, match="diffusion_samples"):
        from_dict(EvaluateConfig, {"diffusion_samples": 0})
    with pytest.raises(ConfigError, match="causality_tolerance"):
        from_dict(EvaluateConfig, {"causality_tolerance": float("nan")})


def test_a_strided_static_curve_scores_every_nth_count_and_those_around_the_router():
    """``evaluate.static_curve_step``: the counts scored, and the curve read at the router's share —
    linear between the whole counts around it, the same arithmetic as the full curve's at step 1."""
    from lookahead.graph.scoring import interpolate_curve
    from lookahead.pipeline.evaluate.build import curve_at, curve_counts

    assert curve_counts(8, 1, 0.5) == list(range(9))
    assert curve_counts(270, 10, 0.5) == sorted(set(range(0, 271, 10)) | {135})
    assert curve_counts(270, 100, 0.33) == [0, 89, 90, 100, 200, 270]
    full = [{"heads_kept": k, "nll": 5.0 - 0.01 * k ** 1.5} for k in range(271)]
    assert curve_at(full, 0.4321) == interpolate_curve(full, 0.4321)  # bitwise: the default's figures stay
    strided = [full[k] for k in curve_counts(270, 10, 0.4321)]
    x = 0.4321 * 270  # 116.667: between the counts 116 and 117 scored around it
    expected = full[116]["nll"] + (x - 116) * (full[117]["nll"] - full[116]["nll"])
    assert abs(curve_at(strided, 0.4321) - expected) < 1e-12
