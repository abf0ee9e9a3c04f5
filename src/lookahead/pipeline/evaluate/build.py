"""The evaluate stage (docs/pipeline.md): one table that answers the research question — at what
fraction of heads switched off, per token, does the LM keep the NLL of the same LM trained densely on
the same tokens — and the causality check (docs/design.md) of every decoder.

Rows, all on the context cache's val windows (the positions phase 1, diffusion and phase 2 report on):

    dense_base            the base LM, stock forward
    phase1_soft/_hard     base + the phase-1 predictor (soft execution; hard = thresholded, skipped work)
    diffusion_sample      base + one diffusion sample per position (K samples, their mean NLL)
    diffusion_best_of_k   base + the best of those K per position (an oracle choice: it reads the target)
    phase2_soft/_hard     the phase-2 LM + its predictor (decoder mlp) — or + diffusion samples (`hard` only)
    dense_control         the control LM (same tokens, no topology), stock forward
    static_control        the static-control LM (same tokens, trained under static importance pruning at
                          phase 2's final active-head fraction) under that same mask
    static_pruning        the control LM with only its most important heads (probe importance), at the
                          phase-2 hard row's active-head fraction (linear between whole head counts)
    random_heads          the control LM with random per-position heads at that fraction
    static_pruning_phase2, random_heads_phase2   the same two baselines on the phase-2 LM
    random_sample/_best_of_k   the null of diffusion_best_of_k: base + K random head sets per position
                          at the diffusion samples' active-head fraction, their mean and their best

Each row: NLL and perplexity; active-head and active-edge fraction, mean and per layer (soft rows:
the mean gate value and edge weight — every head is computed there); estimated attention FLOPs per
token relative to dense; measured forward tokens/s relative to the stock dense forward of the same
batch (topologies computed beforehand, hard rows skip the work of off heads).

The rows and their figures: :mod:`lookahead.pipeline.evaluate.rows`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from tqdm import tqdm

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.static_baselines import StaticBaselines
from lookahead.artifacts.val_scores import ScoringConfig
from lookahead.core.intervals import SE, claim_keys
from lookahead.core.seeds import seed_summary, seeded_headline
from lookahead.core.windows import set_label
from lookahead.graph.router_inputs import router_context
from lookahead.graph.scoring import GeoLookup, interpolate_curve, static_token_nll
from lookahead.pipeline.evaluate.causality import causality_check
from lookahead.pipeline.evaluate.claims import CLAIMS, best_of_k_claim, trained_claims
from lookahead.pipeline.evaluate.config import EvaluateConfig, EvaluateError
from lookahead.pipeline.evaluate.decoders import Decoders, load_decoders
from lookahead.pipeline.evaluate.rows import (RowSpec, Topologies, connected_topologies, diffusion_topologies,
                                             predictor_topologies, random_topologies, score_rows, static_topologies,
                                             time_rows)


# metrics/evaluate.json (lookahead.core.report): the headline keys
# Rows drawn at random, scored over `seeds` seeds: their NLLs are the mean over seeds (`<row>_nll`,
# with `<row>_nll_sd`); the table keeps the first seed's rows
SEEDED_ROWS = ("diffusion_sample", "diffusion_best_of_k", "random_heads", "random_best_of_k")
# The trained LMs' NLLs and their claims (phase 2 − each control: mean over the paired seeds of the
# stages' per-position NLLs on the scoring set) and the best-of-K claim carry intervals
# (lookahead.pipeline.evaluate.claims); the other figures are the table's (the cache's val windows).
# (static_pruning_nll and diffusion_sample_nll: in the report and the table)
HEADLINE = (*seeded_headline(("dense_base_nll", "dense_control_nll", "static_control_nll", "phase1_hard_nll",
                              "phase2_hard_nll", "phase2_active_head_fraction", "diffusion_best_of_k_nll",
                              "random_best_of_k_nll", "attention_only_flops_over_dense", "causality_max_change"),
                             ["dense_control_nll", "static_control_nll", "phase1_hard_nll", "phase2_hard_nll",
                              *[f"{name}_nll" for name in SEEDED_ROWS]])[:-1],
            *[key for claim in CLAIMS for key in claim_keys(claim) if not key.endswith(SE)], "seeds", "window_set",
            "cache_window_set")

@dataclasses.dataclass
class Evaluation:
    """The report and what the plots and the explainer figure are drawn from."""

    report: dict
    static_curve: list[dict]
    explainer: dict
    info: dict
    """Shapes and names the explainer's data-flow panel shows."""


def check_causality(cfg: EvaluateConfig, d: Decoders, cache: ContextCache, geo: GeoLookup, tokenizer, base_dir,
                    device) -> dict:
    """The causality check (docs/design.md) of every decoder, with the real encoder on perturbed val text;
    raise :class:`EvaluateError` when it fails (before the long scoring)."""
    from lookahead.lm.encoders import load_context_encoder

    window, trust_remote_code = cache.encoder_settings()
    encoder = load_context_encoder(cache.meta["encoder"], base_dir, tokenizer, window, trust_remote_code, device=device)
    decoders = {"phase1 predictor": (d.base, predictor_topologies(d.predictor1, hard=True, lm=d.base)),
                "diffusion head": (d.base, diffusion_topologies(d.denoiser, 1, d.steps, d.temperature, cfg.seed, device,
                                                                reseed=True, gate_kind=d.gate_kind, lm=d.base))}
    if d.predictor2 is not None:
        decoders["phase-2 predictor"] = (d.lm2, d.phase2_graph)
    else:
        decoders["phase-2 diffusion"] = (d.lm2, diffusion_topologies(d.denoiser, 1, d.steps, d.temperature, cfg.seed + 1,
                                                                     device, reseed=True, gate_kind=d.gate_kind,
                                                                     lm=d.lm2))
    causality = causality_check(decoders, encoder, cache, geo, cfg, d.base.config.vocab_size, device, d.skip)
    if not causality["passed"]:
        worst = max(causality["per_decoder"], key=causality["per_decoder"].get)
        raise EvaluateError(f"causality check failed (docs/design.md): changing tokens after t changed the {worst}'s "
                            f"topology or logits at <= t by {causality['per_decoder'][worst]:.3g} "
                            f"(tolerance {cfg.causality_tolerance}); per decoder: {causality['per_decoder']}")
    return causality


def row_specs(cfg: EvaluateConfig, d: Decoders, static: StaticBaselines, device) -> list[RowSpec]:
    """The table's rows before the baselines, in the table's order (adding a row: README)."""
    specs = [
        RowSpec("dense_base", d.base, None),
        RowSpec("phase1_soft", d.base, predictor_topologies(d.predictor1, hard=False, lm=d.base, tau=d.tau1), hard=False,
                skip=d.skip),
        RowSpec("phase1_hard", d.base, predictor_topologies(d.predictor1, hard=True, lm=d.base), skip=d.skip),
        RowSpec("diffusion_sample", d.base, diffusion_topologies(d.denoiser, cfg.diffusion_samples, d.steps,
                                                                  d.temperature, cfg.seed, device, gate_kind=d.gate_kind,
                                                                  lm=d.base),
                best_of="diffusion_best_of_k", skip=d.skip),
        RowSpec("phase2_hard", d.lm2, d.phase2_hard, skip=d.skip),
        RowSpec("dense_control", d.control, None),
        RowSpec("static_control", d.static_control, static_topologies(static.at_fraction(d.static_fraction),
                                                                       d.static_fraction, device, d.skip),
                skip=d.skip),
    ]
    if d.predictor2 is not None and not d.value_residual:
        soft = connected_topologies(predictor_topologies(d.predictor2, hard=False, lm=d.lm2, tau=d.tau2), d.connectivity,
                                    d.predictor2.cfg.input, d.lm2)
        specs.insert(4, RowSpec("phase2_soft", d.lm2, soft, hard=False, skip=d.skip))
    return specs


def null_best_of_k(cfg: EvaluateConfig, d: Decoders, fraction: float, seed: int, device) -> RowSpec:
    """The null of the diffusion best-of-K: K random head sets per position at ``fraction`` (the
    diffusion samples'), on the base LM; its best-of row is chosen with the target the same way."""
    s = d.shapes
    return RowSpec("random_sample", d.base, random_topologies(s.n_layers, s.n_heads, fraction, cfg.diffusion_samples,
                                                              seed + 7, device, d.skip),
                   best_of="random_best_of_k", skip=d.skip)


def baseline_specs(cfg: EvaluateConfig, d: Decoders, static: StaticBaselines, fraction: float, seed: int,
                   device) -> list[RowSpec]:
    """Static pruning (the stronger static baseline) and random per-position heads at ``fraction``, on
    the control and on the phase-2 LM."""
    s, baselines = d.shapes, []
    for suffix, lm in (("", d.control), ("_phase2", d.lm2)):
        baselines += [RowSpec(f"static_pruning{suffix}", lm, static_topologies(static.at_fraction(fraction), fraction,
                                                                              device, d.skip),
                              skip=d.skip),
                      RowSpec(f"random_heads{suffix}", lm, random_topologies(s.n_layers, s.n_heads, fraction,
                                                                              cfg.random_draws, seed, device, d.skip),
                              skip=d.skip)]
    return baselines


def seeded_rows(cfg: EvaluateConfig, d: Decoders, fraction: float, seed: int, device,
                diffusion_fraction: float) -> list[RowSpec]:
    """The rows the stage's own randomness draws (diffusion samples, random heads), on ``seed``;
    every other row is a deterministic function of its inputs (lookahead.core.seeds)."""
    return [RowSpec("diffusion_sample", d.base, diffusion_topologies(d.denoiser, cfg.diffusion_samples, d.steps,
                                                                     d.temperature, seed, device, gate_kind=d.gate_kind,
                                                                     lm=d.base),
                    best_of="diffusion_best_of_k", skip=d.skip),
            RowSpec("random_heads", d.control, random_topologies(d.shapes.n_layers, d.shapes.n_heads, fraction,
                                                                 cfg.random_draws, seed, device, d.skip), skip=d.skip),
            null_best_of_k(cfg, d, diffusion_fraction, seed, device)]


def seeded_figures(scored: dict) -> dict[str, float]:
    return {f"{name}_nll": scored[name]["nll"] for name in SEEDED_ROWS}


def add_timings(cfg: EvaluateConfig, timed: list[RowSpec], results: dict, cache: ContextCache, geo: GeoLookup,
                rows: np.ndarray, device) -> None:
    """Each topology row's forward tokens/s over the stock dense forward: the first val batch, each
    row's first topology drawn once and timed on every device (a timing: metrics/evaluate_timing.json)."""
    windows, contexts = (x.to(device) for x in cache.batch("val", rows[: cfg.eval_batch_size]))
    ids = windows[:, :-1]
    first = {spec.name: spec.topologies(ids, contexts, geo(ids))[0] for spec in timed}
    speed = {device.type: time_rows(timed, ids, first, cfg.timing_rounds, device)}
    if device.type == "cpu" and torch.cuda.is_available():  # a GPU is present: time there too
        speed["cuda"] = time_rows(timed, ids, first, cfg.timing_rounds, torch.device("cuda"))
    for name, row in results.items():
        row["tokens_per_s_over_dense"] = speed[device.type].get(name, 1.0 if name.startswith("dense") else None)
        if "cuda" in speed and device.type != "cuda":
            row["cuda_tokens_per_s_over_dense"] = speed["cuda"].get(name)


@torch.no_grad()
def curve_counts(total: int, step: int, fraction: float) -> list[int]:
    """The head counts the static curve scores: every ``step``-th of 0 … ``total``, ``total`` itself and
    the two whole counts around ``fraction`` of it (every count at step 1)."""
    around = {math.floor(fraction * total), math.ceil(fraction * total)}
    return sorted(set(range(0, total + 1, step)) | {total} | around)


def curve_at(curve: list[dict], fraction: float) -> float:
    """The curve's NLL at ``fraction`` of the heads: linear between the whole counts around it (every
    count: :func:`lookahead.graph.scoring.interpolate_curve`, the same arithmetic as before)."""
    counts = [r["heads_kept"] for r in curve]
    if counts == list(range(len(curve))):
        return interpolate_curve(curve, fraction)
    return float(np.interp(fraction * counts[-1], counts, [r["nll"] for r in curve]))


def stronger_static_curve(lm, windows: list[torch.Tensor], static: StaticBaselines, skip: str,
                          counts: list[int] | None = None) -> list[dict]:
    """NLL of ``lm`` under static pruning at head counts ``counts`` (None: every k = 0 … L·H), each
    count's stronger static baseline (:meth:`StaticBaselines.ranking`; as
    :func:`lookahead.graph.scoring.static_pruning_curve` does for one ranking). Rows of k, fraction,
    nll and the mask's name."""
    total = int(np.prod(static.shape))
    rows = []
    for k in tqdm(range(total + 1) if counts is None else counts, desc="static curve", unit="count", mininterval=5):
        nll = torch.cat([static_token_nll(lm, w, static.ranking(k), k, skip).flatten() for w in windows])
        rows.append({"heads_kept": k, "active_head_fraction": k / total, "nll": nll.double().mean().item(),
                     "mask": static.method(k)})
    return rows


def build_evaluate(cfg: EvaluateConfig, base_dir, contexts_dir, init_file, static_dir, predictor_file, diffusion_dir,
                   phase2_dir, control_dir, static_control_dir, scoring: ScoringConfig | None = None,
                   scores: dict | None = None) -> Evaluation:
    """Score every row, time the hard ones, check causality, judge the claims; raise
    :class:`EvaluateError` if it fails. ``scores``: the per-position NLL files of ``phase2``,
    ``control`` and ``static_control`` (:mod:`lookahead.artifacts.val_scores`); None: the claims
    of phase 2 are left out."""
    from transformers import AutoTokenizer

    from lookahead.core.devices import resolve_device
    from lookahead.graph.predictor import load_init

    device = torch.device(resolve_device(cfg.device, "evaluate.device"))
    cache = ContextCache(contexts_dir)
    n_val = len(cache.windows("val"))
    if cfg.explainer_window >= n_val:
        raise EvaluateError(f"evaluate.explainer_window: must be < {n_val} (the cache's val windows); "
                            f"got {cfg.explainer_window}")
    rows = np.arange(n_val if cfg.eval_sequences == 0 else min(cfg.eval_sequences, n_val))
    tensors, _ = load_init(init_file)
    geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float()).to(device)
    static = StaticBaselines(static_dir)
    d = load_decoders(cfg, cache, base_dir, predictor_file, diffusion_dir, phase2_dir, control_dir, static_control_dir,
                      device)
    static.check(d.shapes.n_layers, d.shapes.n_heads, f"the base LM {base_dir}")
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    causality = check_causality(cfg, d, cache, geo, tokenizer, base_dir, device)

    specs = row_specs(cfg, d, static, device)
    best = {}  # best-of rows' per-position NLLs, seed by seed: the best-of-K claim
    results = score_rows(specs, cache, geo, rows, cfg.eval_batch_size, device, per_token=best, unit=d.unit)
    fraction = results["phase2_hard"]["active_head_fraction"]
    if abs(d.static_fraction - fraction) > 1e-4:  # every comparison at equal active fraction
        raise EvaluateError(f"the static control was trained at active-head fraction {d.static_fraction:.4f} but the "
                            f"phase-2 row runs at {fraction:.4f}: rerun `dvc repro static_control`")
    diffusion_fraction = results["diffusion_sample"]["active_head_fraction"]
    baselines = baseline_specs(cfg, d, static, fraction, cfg.seed, device)
    baselines.append(null_best_of_k(cfg, d, diffusion_fraction, cfg.seed, device))
    results.update(score_rows(baselines, cache, geo, rows, cfg.eval_batch_size, device, per_token=best, unit=d.unit))
    per_seed = [seeded_figures(results)]
    best_per_seed = [best]
    for offset in tqdm(range(1, cfg.seeds), desc="evaluate seeds", unit="seed", disable=cfg.seeds <= 1):
        best_per_seed.append({})
        per_seed.append(seeded_figures(score_rows(seeded_rows(cfg, d, fraction, cfg.seed + offset, device,
                                                              diffusion_fraction), cache, geo,
                                                  rows, cfg.eval_batch_size, device, per_token=best_per_seed[-1],
                                                  unit=d.unit)))
    windows = [torch.from_numpy(cache.windows("val")[rows[i : i + cfg.eval_batch_size]].astype(np.int64)).to(device)
               for i in range(0, len(rows), cfg.eval_batch_size)]
    static_curve = stronger_static_curve(d.control, windows, static, d.skip,
                                         curve_counts(int(np.prod(static.shape)), cfg.static_curve_step, fraction))
    add_timings(cfg, [spec for spec in specs + baselines if spec.topologies is not None], results, cache, geo, rows,
                device)

    explainer = explainer_data(cfg, cache, geo, tokenizer, d.lm2, None if d.connectivity is not None else d.predictor2,
                               d.phase2_graph, device)
    report = evaluate_report(results, per_seed, causality, static_curve, fraction, d.decoder, cfg, cache, rows, device)
    scoring = scoring or ScoringConfig()
    flat = [{k: torch.cat(v).numpy() for k, v in seed.items()} for seed in best_per_seed]
    figures, claims = best_of_k_claim(scoring, cache.context_length, [f["diffusion_best_of_k"] for f in flat],
                                      [f["random_best_of_k"] for f in flat])
    if scores is not None:
        trained, more = trained_claims(scoring, cache.context_length, scores["phase2"], scores["control"],
                                       scores["static_control"], scores.get("phase1"))
        figures.update(trained)
        claims.update(more)
    report.update(figures)
    # the table's rows and the best-of-K claim score the cache's val windows (the decoders read their
    # encodings); the trained LMs' figures and claims, the scoring set's (`window_set`)
    report["cache_window_set"] = set_label("cache-val", cache.windows("val")[rows])
    report.setdefault("window_set", report["cache_window_set"])
    report["claims"] = claims
    s = d.shapes
    router = (d.predictor2 or d.predictor1).cfg
    info = {"context_length": cache.context_length, "encoder": cache.meta["encoder"], "context_dim": cache.dim,
            "nodes": 1 + s.n_layers * s.n_heads, "rank": router.rank, "n_layers": s.n_layers, "n_heads": s.n_heads,
            "router_input": router.input, "gate": router.gate, "shared": len(router.always_on),
            "kept": round(results["phase2_hard"]["active_head_fraction"] * s.n_layers * s.n_heads)}
    return Evaluation(report, static_curve, explainer, info)


def evaluate_report(table: dict, per_seed: list[dict], causality: dict, static_curve: list[dict], fraction: float,
                    decoder: str, cfg: EvaluateConfig, cache: ContextCache, rows: np.ndarray, device) -> dict:
    """The stage's report: the headline figures, then the table (its rows in the order they were
    scored: the row specs' order) and the causality check."""
    p2 = table["phase2_hard"]
    return {
        "dense_base_nll": table["dense_base"]["nll"],
        "dense_control_nll": table["dense_control"]["nll"],
        "static_control_nll": table["static_control"]["nll"],
        "phase1_hard_nll": table["phase1_hard"]["nll"],
        "phase2_soft_nll": table["phase2_soft"]["nll"] if "phase2_soft" in table else None,
        "phase2_hard_nll": p2["nll"],
        "phase2_minus_control": p2["nll"] - table["dense_control"]["nll"],
        "phase2_minus_static_control": p2["nll"] - table["static_control"]["nll"],
        "phase2_active_head_fraction": p2["active_head_fraction"],
        "phase2_active_edge_fraction": p2["active_edge_fraction"],
        "static_pruning_nll": table["static_pruning"]["nll"],
        # the first seed's figure; seed_summary's mean over seeds then overwrites it (keeping this position)
        "random_heads_nll": table["random_heads"]["nll"],
        **seed_summary(per_seed, [f"{name}_nll" for name in SEEDED_ROWS]),
        "per_seed": per_seed,
        "attention_only_flops_over_dense": p2["attention_only_flops_over_dense"],
        # a timing (metrics/evaluate_timing.json); None where the phase-2 row is the stock forward (value residual)
        "hard_tokens_per_s_over_dense": p2.get("tokens_per_s_over_dense"),
        "causality_max_change": causality["max_change"],
        "static_pruning_interpolated_nll": curve_at(static_curve, fraction),
        "decoder": decoder,
        "val_positions": int(len(rows) * cache.context_length),
        "diffusion_samples": cfg.diffusion_samples,
        "timing_device": device.type,
        "table": table,
        "causality": causality,
    }


@torch.no_grad()
def explainer_data(cfg: EvaluateConfig, cache: ContextCache, geo: GeoLookup, tokenizer, lm, predictor,
                   phase2_hard: Topologies, device) -> dict:
    """One val window under the phase-2 decoder: its tokens, each token's hard gates, and the soft
    graph (A, g) of the token whose active fraction is nearest the window's median."""
    windows, contexts = (x.to(device) for x in cache.batch("val", [cfg.explainer_window]))
    ids = windows[:, :-1]
    features = geo(ids)
    (adjacency, gates), = phase2_hard(ids, contexts, features)
    shown = min(cfg.explainer_tokens, ids.shape[1])
    hard_gates = gates[0, :shown].cpu()  # (T', N)
    fractions = hard_gates[:, 1:].mean(-1)
    token = int((fractions - fractions.median()).abs().argmin())
    if predictor is not None:  # the soft graph: edge widths from A
        router = router_context(predictor.cfg.input, lm, ids, contexts)
        soft_a, soft_g = predictor(router, features if predictor.geo_dim else None, hard=False)
        graph_a, graph_g = soft_a[0, token].cpu(), soft_g[0, token].cpu()
    else:
        graph_a, graph_g = adjacency[0, token].cpu(), gates[0, token].cpu()
    pieces = [tokenizer.decode([i]) for i in ids[0, :shown].tolist()]
    return {"tokens": pieces, "gates": hard_gates, "token": token, "adjacency": graph_a, "graph_gates": graph_g,
            "hard_gates_of_token": hard_gates[token], "window": cfg.explainer_window}
