"""The research claims evaluate judges, each a paired difference with its interval (docs/reproducibility.md).

- ``phase2_minus_control``, ``phase2_minus_static_control``: the phase-2 LM under its router — as
  deployed (the router reading the routed model's own states) where phase 2 scored it so, else
  reading a dense pass's — minus the dense control, and minus the static control under its mask — seed i of phase 2 paired with
  seed i of each control (the same training windows), on the same val positions: the per-position
  NLLs phase 2 and both controls wrote for every seed on the scoring set
  (:mod:`lookahead.artifacts.val_scores`);
- ``diffusion_best_of_k_minus_null``: the diffusion head's best-of-K minus the best of K random head
  sets at the same fraction (its null), seed by seed of evaluate's draws, on the context cache's val
  windows (the diffusion head reads their encodings).

Each claim's figure is the mean difference over seeds and positions (negative: the first model has
the lower NLL), with ``_sd`` over seeds, ``_se`` and the 95 % interval ``_ci_low`` … ``_ci_high``
(:func:`lookahead.core.intervals.paired_interval`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lookahead.artifacts.val_scores import ScoringConfig, load_scores, paired
from lookahead.core.intervals import claim_figures, paired_interval

CLAIMS = ("phase2_minus_control", "phase2_minus_static_control", "diffusion_best_of_k_minus_null")


def trained_claims(scoring: ScoringConfig, window: int, phase2_scores, control_scores,
                   static_scores, phase1_scores=None) -> tuple[dict, dict]:
    """(headline figures, report) of phase 2 against both controls from the stages' score files: the
    three LMs' mean NLLs over seeds (``phase2_hard_nll``, ``dense_control_nll``, ``static_control_nll``,
    each with ``_sd``; the report adds ``phase2_deployed_nll``) and the two claims, phase 2 as deployed
    where its scores have it; with ``phase1_scores``, the base LM dense and under phase 1's router
    (``dense_base_nll``, ``phase1_hard_nll``) on the same windows. Every file must score the same
    windows (:func:`lookahead.artifacts.val_scores.paired`); ``window_set`` names them."""
    phase2, control, static = (load_scores(Path(p)) for p in (phase2_scores, control_scores, static_scores))
    figures, report = {"window_set": phase2.window_set, "phase1_hard_nll_sd": None}, {}
    paired(phase2["hard"], control["dense"], "phase 2 and the control", (phase2.window_set, control.window_set))
    paired(phase2["hard"], static["hard"], "phase 2 and the static control", (phase2.window_set, static.window_set))
    if phase1_scores is not None:  # the base LM on the same windows, dense and under phase 1's router
        phase1 = load_scores(Path(phase1_scores))
        paired(phase2["hard"], phase1["hard"], "phase 2 and phase 1", (phase2.window_set, phase1.window_set))
        figures["dense_base_nll"] = float(phase1["dense"].mean())
        per_seed = phase1["hard"].reshape(-1, phase1["hard"].shape[-1]).mean(1)
        figures["phase1_hard_nll"] = float(per_seed.mean())
        figures["phase1_hard_nll_sd"] = float(per_seed.std(ddof=1)) if len(per_seed) > 1 else 0.0
    routed = phase2.get("deployed", phase2["hard"])
    if "deployed" in phase2:
        per_seed = phase2["deployed"].mean(1)
        report["phase2_deployed_nll"] = {"mean": float(per_seed.mean()), "per_seed": per_seed.tolist()}
    report["phase2_scored_as"] = "deployed" if "deployed" in phase2 else "dense states"
    for name, scores in (("phase2_hard_nll", phase2["hard"]), ("dense_control_nll", control["dense"]),
                         ("static_control_nll", static["hard"])):
        per_seed = scores.mean(1)
        figures[name], figures[f"{name}_sd"] = float(per_seed.mean()), float(per_seed.std(ddof=1)) if len(per_seed) > 1 else 0.0
    for name, diffs in (("phase2_minus_control", paired(routed, control["dense"], "phase 2 − control",
                                                        (phase2.window_set, control.window_set))),
                        ("phase2_minus_static_control", paired(routed, static["hard"], "phase 2 − static control",
                                                               (phase2.window_set, static.window_set)))):
        interval = paired_interval(diffs, window, scoring.resamples, scoring.confidence, scoring.bootstrap_seed)
        figures.update(claim_figures(name, interval))
        report[name] = {**interval, "per_seed": diffs.mean(1).tolist(), "verdict": verdict(interval)}
    figures["scored_positions"] = int(phase2["hard"].shape[1])
    return figures, report


def verdict(interval: dict) -> str:
    """What a paired difference A − B may be called: ``matches`` where its interval contains 0,
    ``below`` (A better) or ``above`` (A worse) where the interval excludes 0 — the only words the
    README may use for it."""
    if interval["ci_low"] <= 0 <= interval["ci_high"]:
        return "matches"
    return "below" if interval["ci_high"] < 0 else "above"


def best_of_k_claim(scoring: ScoringConfig, window: int, best: list[np.ndarray], null: list[np.ndarray]) -> tuple[dict, dict]:
    """(headline figures, report) of the diffusion best-of-K against its null: per-position NLLs of
    both best-of rows, one array (P,) per evaluate seed."""
    diffs = np.stack(best) - np.stack(null)
    interval = paired_interval(diffs, window, scoring.resamples, scoring.confidence, scoring.bootstrap_seed)
    return (claim_figures("diffusion_best_of_k_minus_null", interval),
            {"diffusion_best_of_k_minus_null": {**interval, "per_seed": diffs.mean(1).tolist()}})
