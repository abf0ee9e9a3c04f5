"""Paired intervals of research claims (docs/reproducibility.md): "A beats B" judged on the same val tokens.

A claim compares two models scored on the same val positions, over S seeds of the stage's own
randomness (seed i of A paired with seed i of B, or one deterministic B for every seed). Its figure
is the mean over seeds and positions of the per-position difference ``d[s, p] = nll_A − nll_B``;
the estimate moves with two things, and its interval combines both:

- **which tokens** were scored: the paired bootstrap over val positions, resampling whole windows
  (blocks of T positions, the same for every seed) because positions of one window are correlated
  — the block standard error is the honest one; the plain token-level ``sd / sqrt(n)`` of the
  seed-averaged differences is reported beside it (``token_se``);
- **which seeds** trained the models: the sample sd of the per-seed means over sqrt(S).

``se = sqrt(se_tokens² + sd_seeds² / S)`` and the interval is ``mean ± q · se``, q the Student-t
quantile at the Welch–Satterthwaite degrees of freedom of that sum: the window component counts as
known (a bootstrap over hundreds of windows), the seed component has S − 1 degrees of freedom, so
with few seeds and a seed-dominated spread q approaches t(S − 1) (4.30 at 95 % and 3 seeds) and with
a window-dominated spread the normal 1.96 (:func:`quantile`). The base LM's own bits (another
machine) are a third component no single run sees: the replicate (``lookahead.tools.replicate``)
measures it.

The same rule judges any figure measured over seeds and windows (:func:`combined_interval`), e.g. a
ratio of NLL gains whose window component is a bootstrap of the ratio (:func:`ratio_interval`).
"""

from __future__ import annotations

import math
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
    mean = float(averaged.mean())
    out = combined_interval(mean, token_se, sd, s, confidence)
    return {"mean": mean, "sd": sd, "se": out["se"], "token_se": token_se,
            "naive_token_se": float(averaged.std(ddof=1) / math.sqrt(p)) if p > 1 else 0.0,
            "ci_low": out["ci_low"], "ci_high": out["ci_high"], "df": out["df"], "seeds": s, "positions": p}


def quantile(window_se: float, seed_sd: float, seeds: int, confidence: float = 0.95) -> tuple[float, float]:
    """(q, degrees of freedom) of a two-sided ``confidence`` interval ``mean ± q · se`` with
    ``se² = window_se² + seed_sd² / seeds``: Student's t at the Welch–Satterthwaite degrees of
    freedom, ``se⁴ / ((seed_sd² / seeds)² / (seeds − 1))`` (the window component taken as known:
    infinite degrees of freedom; no seed spread, or one seed: the normal quantile)."""
    from scipy import stats

    seed_var = seed_sd ** 2 / seeds if seeds > 1 else 0.0
    var = window_se ** 2 + seed_var
    if seed_var <= 0.0 or var <= 0.0:
        return float(stats.norm.ppf(0.5 + confidence / 2)), math.inf
    df = var ** 2 / (seed_var ** 2 / (seeds - 1))
    return float(stats.t.ppf(0.5 + confidence / 2, df)), float(df)


def combined_interval(mean: float, window_se: float, seed_sd: float, seeds: int,
                      confidence: float = 0.95) -> dict[str, float]:
    """``se``, ``df`` (None: normal), ``ci_low``, ``ci_high`` of a figure whose mean moves with the windows scored
    (standard error ``window_se``) and with the seeds (sample sd ``seed_sd`` of the per-seed
    figures over ``seeds`` seeds): :func:`quantile`. ``window_se`` 0: the seeds' t interval alone."""
    se = math.sqrt(window_se ** 2 + (seed_sd ** 2 / seeds if seeds > 1 else 0.0))
    q, df = quantile(window_se, seed_sd, seeds, confidence)
    return {"se": se, "df": df if math.isfinite(df) else None, "ci_low": mean - q * se, "ci_high": mean + q * se}


def ratio_interval(numerators: np.ndarray, denominators: np.ndarray, window: int, resamples: int = 2000,
                   confidence: float = 0.95, seed: int = 0) -> dict[str, float]:
    """The interval of a ratio of sums, ``Σ num / Σ den`` over positions, measured over seeds.

    Args:
        numerators, denominators: (S, P) per-position terms of each seed on the same P positions
            (a (P,) or (1, P) array is shared by every seed), in windows of ``window`` positions.

    Returns:
        ``mean`` (the mean over seeds of each seed's ratio), ``sd`` (over seeds), ``token_se`` (the
        bootstrap over whole windows, the same resample for every seed, of the seed-averaged ratio),
        and :func:`combined_interval`'s ``se``, ``df``, ``ci_low``, ``ci_high``; ``seeds``.
    """
    num, den = (np.atleast_2d(np.asarray(x, dtype=np.float64)) for x in (numerators, denominators))
    s = max(len(num), len(den))
    num, den = np.broadcast_to(num, (s, num.shape[1])), np.broadcast_to(den, (s, den.shape[1]))
    if num.shape[1] != den.shape[1] or num.shape[1] % window:
        raise ValueError(f"numerators {num.shape} and denominators {den.shape} must share positions, a multiple of "
                         f"the window {window}")
    per_seed = num.sum(1) / den.sum(1)
    sd = float(per_seed.std(ddof=1)) if s > 1 else 0.0
    num_w, den_w = (x.reshape(s, -1, window).sum(2) for x in (num, den))  # (S, W)
    rng = np.random.default_rng([seed, 73])
    w = num_w.shape[1]
    counts = rng.multinomial(w, np.full(w, 1.0 / w), size=resamples)  # (R, W)
    boot = ((counts @ num_w.T) / (counts @ den_w.T)).mean(1)  # (R,): the seeds' mean ratio per resample
    token_se = float(boot.std(ddof=1))
    mean = float(per_seed.mean())
    return {"mean": mean, "sd": sd, "token_se": token_se, **combined_interval(mean, token_se, sd, s, confidence),
            "seeds": s}


def claim_figures(name: str, interval: dict[str, float]) -> dict[str, float]:
    """The headline keys of a claim: ``<name>``, ``<name>_sd``, ``<name>_se``, ``<name>_ci_low``,
    ``<name>_ci_high``."""
    return {name: interval["mean"], f"{name}_sd": interval["sd"], f"{name}{SE}": interval["se"],
            f"{name}{CI_LOW}": interval["ci_low"], f"{name}{CI_HIGH}": interval["ci_high"]}


def claim_keys(name: str) -> tuple[str, ...]:
    """The headline keys :func:`claim_figures` writes, in order."""
    return (name, f"{name}_sd", f"{name}{SE}", f"{name}{CI_LOW}", f"{name}{CI_HIGH}")
