"""The NLL-vs-MACs frontier's claims (docs/research/frontier.md; ``scripts/frontier.py`` runs the points):
is a routed model below what static pruning and a smaller dense model reach at the same MACs per token?

A method's frontier is the piecewise-linear curve through its measured points in (MACs / dense, NLL):

- **static pruning**: its MACs are linear in the heads kept (a pruned head costs nothing anywhere, a
  kept one attends every key: :func:`lookahead.graph.cost.macs_per_token`, ``static``), and a
  fractional count is reached by time-sharing the two whole counts around it, so the frontier
  between two whole counts is the line between them — per window, on the same test windows;
- **smaller dense models** (``base.arch.head_dim``): the line between adjacent measured sizes, and no
  claim outside the measured range (nothing is extrapolated).

A claim at a routed point is ``routed − frontier(MACs of the routed point)``: a contrast of the
points with weights 1 and −(1 − w), −w of the two frontier points around it, resampled jointly over
the shared windows with each point's seeds (or base seeds) as its own variance component
(:func:`lookahead.tools.scaling_fit.contrast`). Several declared claims are judged together with
Holm's step-down correction (:func:`holm`): the family-wise error stays at the level asked for.
"""

from __future__ import annotations

import numpy as np

from lookahead.tools.scaling_fit import contrast


def interpolation(xs: list[float], x: float) -> list[tuple[int, float]] | None:
    """The weights of the piecewise-linear interpolation at ``x`` through points at ``xs`` (any
    order): [(index, weight)] of the one or two points around it (weights summing to 1), or None
    where ``x`` is outside [min(xs), max(xs)] (no extrapolation)."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    if not order or not xs[order[0]] <= x <= xs[order[-1]]:
        return None
    for lo, hi in zip(order, order[1:]):
        if xs[lo] <= x <= xs[hi]:
            if x == xs[lo] or xs[hi] == xs[lo]:
                return [(lo, 1.0)]
            w = (x - xs[lo]) / (xs[hi] - xs[lo])
            return [(hi, 1.0)] if w == 1.0 else [(lo, 1.0 - w), (hi, w)]
    return [(order[0], 1.0)]  # a single point, x on it


def frontier_claim(routed: np.ndarray, macs: float, frontier: list[tuple[float, np.ndarray]], base_sd: float = 0.0,
                   bases: int = 0, resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> dict | None:
    """``routed − frontier(macs)`` with its interval, or None outside the frontier's measured MACs.

    Args:
        routed: (seeds, windows) per-window mean NLLs of the routed point.
        macs: the routed point's MACs per token over dense, as run.
        frontier: (MACs over dense, (seeds, windows) per-window mean NLLs) of each frontier point, the
            same windows as ``routed``.
        base_sd, bases: a between-base spread of the claim added to it (:func:`lookahead.tools.scaling_fit.contrast`).

    Returns:
        :func:`lookahead.tools.scaling_fit.contrast`'s figures, ``p_value`` (two-sided, :func:`p_value`),
        ``frontier_nll`` (the frontier's NLL there) and ``between`` ([index, weight] of the frontier points).
    """
    weights = interpolation([m for m, _ in frontier], macs)
    if weights is None:
        return None
    arrays = [np.atleast_2d(np.asarray(routed, dtype=np.float64))]
    arrays += [np.atleast_2d(np.asarray(frontier[i][1], dtype=np.float64)) for i, _ in weights]
    out = contrast(arrays, np.array([1.0] + [-w for _, w in weights]), base_sd, bases, resamples, confidence, seed)
    out["frontier_nll"] = float(sum(w * a.mean() for (_, w), a in zip(weights, arrays[1:])))
    out["p_value"] = p_value(out)
    out["between"] = [[i, w] for i, w in weights]
    return out


def p_value(interval: dict) -> float:
    """Two-sided p-value of ``estimate = 0`` from a contrast's ``estimate``, ``se`` and ``df`` (None: normal)."""
    from scipy import stats

    if interval["se"] <= 0:
        return 0.0 if interval["estimate"] != 0 else 1.0
    z = abs(interval["estimate"]) / interval["se"]
    tail = stats.norm.sf(z) if interval.get("df") is None else stats.t.sf(z, interval["df"])
    return float(min(1.0, 2 * tail))


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order: sorted ascending, the i-th (from 0) of
    m is multiplied by m − i, then made non-decreasing and capped at 1. A claim holds at family-wise
    level α where its adjusted p-value is below α."""
    m = len(p_values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda j: p_values[j])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def verdict(interval: dict | None, adjusted_p: float | None = None, alpha: float = 0.05) -> str:
    """``below`` (the routed point under the frontier), ``above``, ``unresolved`` or ``outside`` (no
    frontier there); with ``adjusted_p``, resolved only where it is below ``alpha`` as well."""
    if interval is None:
        return "outside"
    if adjusted_p is not None and adjusted_p >= alpha:
        return "unresolved"
    if interval["ci_high"] < 0:
        return "below"
    if interval["ci_low"] > 0:
        return "above"
    return "unresolved"

