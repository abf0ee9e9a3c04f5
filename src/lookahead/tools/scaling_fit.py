"""The head-scaling study's fit (docs/research/head-scaling.md; ``scripts/head_scaling.py`` runs the
points): how a claim changes from one model shape to the next, stated as its data allow.

Every point is scored on the same test windows, so the points' errors are not independent: a window
that is hard for the router at 16 heads is hard at 32. Each contrast of the points — the slope over
the heads-per-layer leg (4 × 4, 4 × 8, 4 × 16: one thing changed, log2(heads) from 4 to 6), or the
difference between two adjacent points — is therefore computed per window and resampled jointly:

- **window component**: a bootstrap of the windows, the same resample for every point, of the
  contrast of the points' seed-averaged per-window differences;
- **seed component**: Σ cᵢ² sdᵢ² / Sᵢ over the points' seeds (cᵢ the contrast's weights);
- **base component**: every point trains its own base LM, so each point carries the between-base
  variance that ``make bases`` measured at 4 × 4 (``metrics/bases_report.json``) — an *assumption*
  (that the spread between base LMs is the same at every shape), added as Σ cᵢ² sd_bases²;
- Student's t at the Welch–Satterthwaite degrees of freedom of the seed and base components (the
  window component taken as known).

No value is given past the largest measured point, and no prediction for the 1B shape. The
overdispersion of the leg's fit (its residual χ² over 1 degree of freedom, each point weighted by
its own standard error) is reported beside the slope: above 1, the points scatter about the line
more than their intervals say, and a straight line in log2(heads) is the wrong summary.
"""

from __future__ import annotations

import math

import numpy as np

LEG = ("4x4", "4x8", "4x16")
"""The heads-per-layer leg: depth and width fixed, heads per layer doubled twice."""


def slope_weights(x: np.ndarray) -> np.ndarray:
    """Least-squares slope as a contrast: slope = Σ cᵢ yᵢ, cᵢ = (xᵢ − x̄) / Σ (x − x̄)²."""
    x = np.asarray(x, dtype=np.float64)
    centred = x - x.mean()
    return centred / (centred ** 2).sum()


def contrast(per_window: list[np.ndarray], weights: np.ndarray, base_sd: float = 0.0, bases: int = 0,
             resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> dict:
    """A contrast Σ cᵢ · claimᵢ of points scored on the same windows, with its interval (module docstring).

    Args:
        per_window: each point's (seeds, windows) per-window claim differences; every point the same windows.
        weights: the contrast's weights cᵢ, one per point.
        base_sd, bases: the between-base sd of the claim and the number of bases it was measured on (0: none added).

    Returns:
        ``estimate``, ``window_se``, ``seed_se``, ``base_se``, ``se``, ``df`` (None: normal), ``ci_low``,
        ``ci_high``.
    """
    from scipy import stats

    weights = np.asarray(weights, dtype=np.float64)
    arrays = [np.atleast_2d(np.asarray(a, dtype=np.float64)) for a in per_window]
    if len({a.shape[1] for a in arrays}) != 1 or len(arrays) != len(weights):
        raise ValueError("every point must score the same windows, one weight per point")
    averaged = np.stack([a.mean(0) for a in arrays])  # (points, windows)
    estimate = float(weights @ averaged.mean(1))
    w = averaged.shape[1]
    rng = np.random.default_rng([seed, 79])
    counts = rng.multinomial(w, np.full(w, 1.0 / w), size=resamples)  # (R, W): one resample for every point
    boot = (counts @ (weights @ averaged)) / w
    window_var = float(boot.var(ddof=1))
    seeds = [(c ** 2 * a.mean(1).var(ddof=1) / len(a), len(a) - 1) for c, a in zip(weights, arrays) if len(a) > 1]
    base = [((weights ** 2).sum() * base_sd ** 2, bases - 1)] if bases > 1 and base_sd > 0 else []
    seed_var, base_var = sum(v for v, _ in seeds), sum(v for v, _ in base)
    var = window_var + seed_var + base_var
    denominator = sum(v ** 2 / df for v, df in seeds + base if v > 0)  # Welch–Satterthwaite
    df = var ** 2 / denominator if denominator > 0 else math.inf
    q = float(stats.t.ppf(0.5 + confidence / 2, df)) if math.isfinite(df) else float(stats.norm.ppf(0.5 + confidence / 2))
    se = math.sqrt(var)
    return {"estimate": estimate, "window_se": math.sqrt(window_var), "seed_se": math.sqrt(seed_var),
            "base_se": math.sqrt(base_var), "se": se, "df": df if math.isfinite(df) else None,
            "ci_low": estimate - q * se, "ci_high": estimate + q * se}


def overdispersion(x: np.ndarray, y: np.ndarray, se: np.ndarray) -> float | None:
    """The weighted line's residual χ² over its degrees of freedom (n − 2; None below 3 points)."""
    x, y, se = (np.asarray(v, dtype=np.float64) for v in (x, y, se))
    if len(x) < 3:
        return None
    w = 1 / np.maximum(se, 1e-12) ** 2
    design = np.stack([np.ones_like(x), x], 1)
    coef = np.linalg.solve(design.T @ (design * w[:, None]), design.T @ (w * y))
    return float((w * (y - design @ coef) ** 2).sum() / (len(x) - 2))


def fit(points: list[dict], differences, base_sd: float = 0.0, bases: int = 0, resamples: int = 2000,
        confidence: float = 0.95, seed: int = 0) -> dict:
    """The slope of a claim over the heads-per-layer leg and its adjacent-point differences.

    Args:
        points: the points in order of heads (each with ``point``, ``log2_heads``), those with per-window data.
        differences: ``point -> (seeds, windows)`` per-window claim differences, or None where the point has none.

    Returns:
        ``slope_per_doubling`` (over :data:`LEG`, where all three points have per-window data) and
        ``adjacent`` (``"<a> → <b>"``: each difference between consecutive points), each a :func:`contrast`,
        and the leg's ``overdispersion``.
    """
    have = [(p, differences(p)) for p in points]
    have = [(p, d) for p, d in have if d is not None]
    out: dict = {"slope_per_doubling": None, "overdispersion": None, "adjacent": {}}
    kwargs = dict(base_sd=base_sd, bases=bases, resamples=resamples, confidence=confidence, seed=seed)
    leg = [(p, d) for p, d in have if p["point"] in LEG]
    if len(leg) == len(LEG):
        x = np.array([p["log2_heads"] for p, _ in leg])
        out["slope_per_doubling"] = contrast([d for _, d in leg], slope_weights(x), **kwargs)
        each = [contrast([d], np.array([1.0]), **kwargs) for _, d in leg]
        out["overdispersion"] = overdispersion(x, np.array([e["estimate"] for e in each]),
                                               np.array([e["se"] for e in each]))
    for (a, da), (b, db) in zip(have, have[1:]):
        out["adjacent"][f"{a['point']} → {b['point']}"] = contrast([da, db], np.array([-1.0, 1.0]), **kwargs)
    return out
