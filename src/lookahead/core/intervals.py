"""Paired intervals of research claims (DESIGN §12): "A beats B" judged on the same val tokens.

A claim compares two models scored on the same val positions, over S seeds of the stage's own
randomness (seed i of A paired with seed i of B, or one deterministic B for every seed). Its figure
is the mean over seeds and positions of the per-position difference ``d[s, p] = nll_A − nll_B``;
the estimate moves with two things, and its interval combines both:

- **which tokens** were scored: the paired bootstrap over val positions, resampling whole windows
  (blocks of T positions, the same for every seed) because positions of one window are correlated
  — the block standard error is the honest one; the plain token-level ``sd / sqrt(n)`` of the
  seed-averaged differences is reported beside it (``token_se``);
- **which seeds** trained the models: the sample sd of the per-seed means over sqrt(S).

``se = sqrt(se_tokens² + sd_seeds² / S)`` and the interval is ``mean ± z · se`` (z = 1.96 for
95 %). The base LM's own bits (another machine) are a third component no single run sees: the
replicate (``lookahead.tools.replicate``) measures it.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

CI_LOW, CI_HIGH, SE = "_ci_low", "_ci_high", "_se"


def paired_interval(diffs: np.ndarray, window: int, resamples: int = 2000, confidence: float = 0.95,
                    seed: int = 0) -> dict[str, float]:
    """The interval of the mean paired difference.

    Args:
        diffs: (S, P) per-position differences of S paired seeds on the same P val positions, in
            windows of ``window`` consecutive positions (P a multiple of it); (P,) is one seed.
        window: positions per val window (the bootstrap's block).
        resamples: bootstrap resamples of the windows.
        confidence: coverage of the interval.
        seed: seed of the resampling (the same inputs give the same interval).

    Returns:
        ``mean``, ``sd`` (over the per-seed means), ``se`` (combined), ``token_se`` (block bootstrap
        over windows), ``naive_token_se`` (sd of the seed-averaged per-position differences /
        sqrt(P)), ``ci_low``, ``ci_high``, ``seeds``, ``positions``.
    """
    d = np.asarray(diffs, dtype=np.float64)
    d = d[None] if d.ndim == 1 else d
    if d.ndim != 2 or d.shape[1] == 0 or d.shape[1] % window:
        raise ValueError(f"diffs must be (seeds, positions) with positions a multiple of the window {window}; "
                         f"got shape {np.shape(diffs)}")
    if not np.isfinite(d).all():
        raise ValueError("diffs hold NaN or inf: a model's NLL diverged on some val position")
    s, p = d.shape
    per_seed = d.mean(1)
    sd = float(per_seed.std(ddof=1)) if s > 1 else 0.0
    averaged = d.mean(0)  # (P,): the seeds' mean difference at each position
    blocks = averaged.reshape(-1, window).mean(1)  # (W,): per-window means (equal sizes)
    rng = np.random.default_rng([seed, 71])
    counts = rng.multinomial(len(blocks), np.full(len(blocks), 1.0 / len(blocks)), size=resamples)  # (R, W)
    boot = counts @ blocks / len(blocks)
    token_se = float(boot.std(ddof=1))
    se = math.sqrt(token_se ** 2 + sd ** 2 / s)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    mean = float(averaged.mean())
    return {"mean": mean, "sd": sd, "se": se, "token_se": token_se,
            "naive_token_se": float(averaged.std(ddof=1) / math.sqrt(p)) if p > 1 else 0.0,
            "ci_low": mean - z * se, "ci_high": mean + z * se, "seeds": s, "positions": p}


def claim_figures(name: str, interval: dict[str, float]) -> dict[str, float]:
    """The headline keys of a claim: ``<name>``, ``<name>_sd``, ``<name>_se``, ``<name>_ci_low``,
    ``<name>_ci_high``."""
    return {name: interval["mean"], f"{name}_sd": interval["sd"], f"{name}{SE}": interval["se"],
            f"{name}{CI_LOW}": interval["ci_low"], f"{name}{CI_HIGH}": interval["ci_high"]}


def claim_keys(name: str) -> tuple[str, ...]:
    """The headline keys :func:`claim_figures` writes, in order."""
    return (name, f"{name}_sd", f"{name}{SE}", f"{name}{CI_LOW}", f"{name}{CI_HIGH}")
