"""How the diffusion stage judges its decoders against the router's own sampler: on keep sets (head gates
under a budget: recall of the eps-good sets, NLL at the same K) or on sampled topologies."""

from __future__ import annotations

import numpy as np
import torch

from lookahead.artifacts.contexts import ContextCache
from lookahead.core.inputs import recorded
from lookahead.core.windows import set_label
from lookahead.graph.nodes import allowed_mask
from lookahead.graph.scoring import GeoLookup
from lookahead.pipeline.diffusion.config import DiffusionConfig
from lookahead.pipeline.diffusion.module import DiffusionModule, PairFeatures, input_scale


def judge_keep_sets(cfg: DiffusionConfig, module: DiffusionModule, predictor, meta: dict, lm, cache: ContextCache,
                    geo: GeoLookup, device) -> dict:
    """Train the autoregressive decoder and judge every decoder against its nulls on the val windows'
    ε-good sets (:mod:`lookahead.pipeline.diffusion.decoders`)."""
    from lookahead.graph.runtime import recorded_skip
    from lookahead.graph.gating import logistic_noise
    from lookahead.graph.nodes import topk_set
    from lookahead.graph.sampling import executed_topology
    from lookahead.pipeline.diffusion.decoders import Scorer, judge, static_set, train_autoregressive, truth_sets

    pairs, features = module.pairs, module.features
    n_l, n_h, k = pairs.info["n_layers"], pairs.info["n_heads"], int(pairs.info["heads_kept"])
    mask = allowed_mask(n_l, n_h)
    keep = executed_topology(pairs.edges.float(), mask, n_l, n_h, "head")[1][..., 1:] > 0.5  # (pairs, L·H)
    # every decoder reads the router's inputs and, as each was built, the geometric features
    full = features if features.geo is not None else PairFeatures(cache, geo, features.kind, lm)
    a = cfg.autoregressive
    predictor.eval()

    def geo_of(model_geo_dim, g):
        return g if model_geo_dim else None

    def ar_inputs(x, g):
        parts = [x, g] if cfg.geo_features else [x]
        if a.router_logits:
            with torch.no_grad():
                parts.append(predictor.head_logits(x, geo_of(predictor.geo_dim, g)))
        return torch.cat(parts, -1)

    train_x, train_g = full(pairs.rows[pairs.train], 0)
    ar_in = ar_inputs(train_x, train_g)
    shift, scale = input_scale(ar_in)
    if a.router_logits:  # the prior logits enter as they are
        shift[-keep.shape[1] :], scale[-keep.shape[1] :] = 0.0, 1.0
    ar, ar_curve = train_autoregressive(ar_in, keep[pairs.train], k, a.steps, a.batch_size, a.lr, cfg.train.seed,
                                        a.hidden, scale=(shift, scale), prior=a.router_logits)
    t_len = cache.context_length
    n_val = int(pairs.rows[pairs.heldout].max() // t_len) + 1  # the first val windows
    positions = np.arange(n_val * t_len)
    val_x, val_g = full(positions, 1)
    truth, valid, has_truth = truth_sets(pairs.rows[pairs.heldout], keep[pairs.heldout], len(positions))
    denoiser = module.model.eval()
    steps, temperature = cfg.sample_steps, cfg.sample_temperature

    def baseline(x, g, gen):  # the router's sampler: top-K of its keep logits plus logistic noise
        with torch.no_grad():
            z = predictor.head_logits(x, geo_of(predictor.geo_dim, g))
        return topk_set(z + cfg.baseline_noise * logistic_noise(z.shape, z.device, z.dtype, gen), k)

    draws = {
        "baseline": baseline,
        "autoregressive": lambda x, g, gen: ar.sample(ar_inputs(x, g), gen, temperature=a.temperature)[0],
        "diffusion": lambda x, g, gen: denoiser.sample_keep_sets(x, geo_of(denoiser.geo_dim, g), steps, k, gen,
                                                                 temperature),
    }
    with torch.no_grad():
        deterministic = predictor(val_x, geo_of(predictor.geo_dim, val_g), hard=True)[1][..., 1:] > 0.5
    windows = torch.from_numpy(cache.windows("val")[:n_val].astype(np.int64))
    scorer = Scorer(lm, windows, n_l, n_h, recorded_skip(meta), cfg.eval_batch_size)
    table, tokens = judge(draws, deterministic, static_set(keep[pairs.train], k), scorer, val_x, val_g, truth, valid,
                          has_truth, k, cfg.eval_samples, cfg.seed)
    counts = valid.sum(-1)[has_truth].float()
    report = {f"{name}_{fig}": value for name, figs in table.items() for fig, value in figs.items()}
    d, b = table["diffusion"], table["baseline"]
    report.update({
        "eps_good_per_position": float(counts.mean()), "eps_good_multi_share": float((counts >= 2).float().mean()),
        **{f"recall_at_{n}": d[f"recall_at_{n}"] for n in (1, 4, 8)},
        **{f"baseline_recall_at_{n}": b[f"recall_at_{n}"] for n in (1, 4, 8)},
        "sample_nll": d["sample_nll"], "deterministic_nll": table["router"]["sample_nll"],
        "best_of_k_label_free_nll": d["best_of_k_label_free_nll"],
        "null_frequency_best_of_k_nll": table["diffusion_frequency"]["best_of_k_label_free_nll"],
        "dense_nll": table["dense"]["sample_nll"], "heads_kept": k, "eval_samples": cfg.eval_samples,
        "val_positions": len(positions), "truth_positions": int(has_truth.sum()),
        "window_set": set_label("cache-val", windows),
        "autoregressive_train_curve": ar_curve, "best_of_k_criterion": "least KL(dense || routed), no label",
        # per position, for the paired claims over seeds (decoder_claims pops them before the report is written)
        TOKEN_KEY: {"window": t_len, "has_truth": has_truth.numpy(),
                    **{f"{name}_{fig}": values for name, figs in tokens.items() for fig, values in figs.items()}},
    })
    return report


TOKEN_KEY = "token_figures"
"""The report key of the per-position figures :func:`judge_keep_sets` leaves for :func:`decoder_claims`."""

DECODER_CLAIMS = (
    ("diffusion_minus_baseline_recall_at_8", "diffusion_recall_at_8", "baseline_recall_at_8"),
    ("autoregressive_minus_baseline_recall_at_8", "autoregressive_recall_at_8", "baseline_recall_at_8"),
    ("best_of_k_minus_null", "diffusion_best_of_k_label_free_nll", "diffusion_frequency_best_of_k_label_free_nll"),
    ("autoregressive_best_of_k_minus_null", "autoregressive_best_of_k_label_free_nll",
     "diffusion_frequency_best_of_k_label_free_nll"),
)
"""The decoders' paired claims: (name, figure, the figure it is compared with), per position and seed."""


def decoder_claims(reports: list[dict]) -> None:
    """Pop every seed's per-position figures (:data:`TOKEN_KEY`; primary first) and put each of
    :data:`DECODER_CLAIMS` into the primary report with its interval, windows and seeds combined
    (:mod:`lookahead.core.intervals`): a recall difference is a ratio over the positions that have an
    ε-good set (:func:`~lookahead.core.intervals.ratio_interval`), an NLL difference a paired mean over
    every position (:func:`~lookahead.core.intervals.paired_interval`). Reports without them pass."""
    from lookahead.core.intervals import claim_figures, paired_interval, ratio_interval

    tokens = [r.pop(TOKEN_KEY, None) for r in reports]
    if tokens[0] is None:
        return
    window, has = tokens[0]["window"], tokens[0]["has_truth"].astype(np.float64)
    for name, figure, reference in DECODER_CLAIMS:
        diffs = np.stack([t[figure] - t[reference] for t in tokens]).astype(np.float64)  # (S, P)
        interval = (ratio_interval(diffs * has, has, window) if figure.endswith("recall_at_8")
                    else paired_interval(diffs, window))
        reports[0].update(claim_figures(name, interval))


def judge_samplers(cfg: DiffusionConfig, module: DiffusionModule, predictor, meta: dict, lm, cache: ContextCache,
                   geo: GeoLookup, device, pairs_dir) -> dict:
    """The diffusion head against the predictor's own sampler on beats_dense pairs."""
    from lookahead.graph.runtime import recorded_skip
    from lookahead.pipeline.diffusion.evaluation import lm_comparison, make_samplers, mode_recall

    lm.to(device)
    denoiser = module.model.to(device).eval()
    predictor.to(device).eval()
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    flip_prob = float(recorded(module.pairs.info, "config", "flip_prob", stage="pairs", source=pairs_dir))
    samplers = make_samplers(denoiser, predictor, cfg.sample_steps, cfg.sample_temperature, flip_prob, generator)
    skip = recorded_skip(meta)
    lm_figures = lm_comparison(lm, predictor, samplers, cache, geo.to(device), cfg.eval_samples, cfg.eval_sequences,
                               cfg.eval_batch_size, device, cfg.seed, skip)
    # every sampler takes the geometric features if its model was built with them: the full table here
    features = module.features if module.features.geo is not None else PairFeatures(cache, geo, module.features.kind, lm)
    recall = mode_recall(samplers, predictor, module.pairs, features, cfg.eval_samples, cfg.recall_radius, device)
    pairs = module.pairs
    diff, base = lm_figures["diffusion"], lm_figures["baseline"]
    return {
        "sample_nll": diff["sample_nll"],
        "best_of_k_nll": diff["best_of_k_nll"],
        "baseline_sample_nll": base["sample_nll"],
        "baseline_best_of_k_nll": base["best_of_k_nll"],
        "deterministic_nll": lm_figures["deterministic_nll"],
        "dense_nll": lm_figures["dense_nll"],
        "density": diff["density"],
        "pairs_density": float(pairs.edge_fraction.mean()),
        "within_context_hamming": diff["within_context_hamming"],
        "across_context_hamming": diff["across_context_hamming"],
        "mode_recall": recall["diffusion"]["mode_recall"],
        "baseline_mode_recall": recall["baseline"]["mode_recall"],
        "samples_per_s": samplers["diffusion"].graphs / max(samplers["diffusion"].seconds, 1e-9),
        "active_head_fraction": diff["active_head_fraction"],
        "pairs_active_head_fraction": float(pairs.head_fraction.mean()),
        "deterministic_active_head_fraction": lm_figures["deterministic_active_head_fraction"],
        "eval_samples": cfg.eval_samples,
        "recall_radius": cfg.recall_radius,
        "samplers": {name: {**lm_figures[name], **recall[name],
                            "samples_per_s": s.graphs / max(s.seconds, 1e-9)} for name, s in samplers.items()},
        "recall_positions": recall["positions"],
        "recall_topologies": recall["topologies"],
        "val_positions": lm_figures["positions"],
        "explore_flip_prob": flip_prob,
    }
