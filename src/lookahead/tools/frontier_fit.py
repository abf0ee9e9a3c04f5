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


# --- the frontiers of a study's point records (scripts/frontier.py writes them) -------------------

FULL_WIDTH = 128
"""The base recipe's attention width (hidden 128): the dense frontier's MACs-1 point."""
FRONTIERS = ("static_before", "static_after", "dense_before", "dense_after")


def _rows(record: dict, file: str, key: str):
    return np.asarray(record["windows"][file][key], dtype=np.float64)  # (rows, windows)


def controls(record: dict) -> str:
    """The settings a point's controls continued pretraining under ("" the grid's; a variant that trains
    longer names them): its after-frontiers are drawn from controls trained alike."""
    return record.get("controls", "")


def frontiers(records: list[dict], shape: str, trained: str = "") -> dict[str, list[tuple[float, object, str]]]:
    """Each frontier of ``shape`` as (MACs over dense, (rows, windows) per-window NLLs, label) points:

    - ``static_before``: the stronger static mask at every whole head count (a full-skip grid point's
      static curve; all heads: the base LM itself);
    - ``static_after``: the static control at each full-skip point's share (one per head count, a grid
      point's first), and the dense control at 1;
    - ``dense_before`` / ``dense_after``: at each attention width, the base LMs of the base seeds (one
      row each) and their dense controls (each base seed's control seeds averaged: one row per base);
      the full width is the shape's own base, the narrower ones every dense record's (of any shape:
      the same MACs at the same width).

    The after-frontiers hold controls whose continued pretraining ran under ``trained`` (:func:`controls`)
    alone; the before-frontiers do not depend on it (the same base LMs).
    """
    routed = [r for r in records if r["shape"] == shape and r["kind"] == "routed"]
    grid = sorted((r for r in routed if r["skip"] == "full" and not r.get("variant")), key=lambda r: r["keep"])
    alike = [r for r in routed if controls(r) == trained]
    out: dict[str, list] = {k: [] for k in FRONTIERS}
    if grid:
        curve, n = grid[0], grid[0]["heads_total"]
        out["static_before"] = [(curve["macs"][f"static_heads_{k}"], _rows(curve, "phase1", f"static_heads_{k}"),
                                 f"static {k}/{n}") for k in range(1, n + 1)]
    full = sorted((r for r in alike if r["skip"] == "full"), key=lambda r: (bool(r.get("variant")), r["keep"]))
    by_heads = {}
    for r in full:  # the variants of a share run the same static control: one point per head count
        by_heads.setdefault(r["static_control_heads"], r)
    for heads, r in sorted(by_heads.items()):
        out["static_after"].append((r["macs"]["static_control"], _rows(r, "static_control", "hard"),
                                    f"static control {heads}/{r['heads_total']}"))
    before: dict[int, list[tuple[float, object]]] = {}
    after: dict[int, list[tuple[float, object]]] = {}
    if routed:  # the base recipe at seed 0: the routed points' own base, and its control trained alike
        before[FULL_WIDTH] = [(1.0, _rows(routed[0], "control", "base"))]
    if alike:  # the dense control: the static frontier's point at 1 and the dense frontier's full width
        control = _rows(alike[0], "control", "dense")
        out["static_after"].append((1.0, control, "dense control"))
        after[FULL_WIDTH] = [(1.0, control)]
    for r in (r for r in records if r["kind"] == "dense"):  # one dense frontier for every shape (the same MACs)
        if not controls(r):
            before.setdefault(r["width"], []).append((r["macs"]["dense"], _rows(r, "control", "base")))
        if controls(r) == trained:
            after.setdefault(r["width"], []).append((r["macs"]["dense"], _rows(r, "control", "dense")))
    for name, widths, label in (("dense_before", before, ""), ("dense_after", after, " + control")):
        for width, seeds in sorted(widths.items(), reverse=True):
            rows = np.vstack([a.mean(0, keepdims=True) for _, a in seeds])  # (base seeds, windows)
            out[name].append((seeds[0][0], rows, f"dense {width}{label}"))
    return out


CLAIM_SIDES = (("before", "phase1", "deployed"), ("after", "phase2", "phase2_deployed"))
"""(when, the routed point's score file, its MACs key): the router as deployed, before and after continued pretraining."""


def level_spread(base_records: list[dict]) -> dict[str, tuple[float, int]]:
    """The between-base sd of a dense model's NLL level, before (the base LM: phase 1's ``dense``) and
    after continued pretraining (its dense control), from ``make bases``' records
    (``metrics/bases/seed<s>.json``), with the number of bases; {} with fewer than two."""
    if len(base_records) < 2:
        return {}
    before = [np.mean(r["windows"]["phase1"]["dense"]) for r in base_records]
    after = [np.mean(r["windows"]["control"]["dense"]) for r in base_records]
    return {"before": (float(np.std(before, ddof=1)), len(base_records)),
            "after": (float(np.std(after, ddof=1)), len(base_records))}


def claims(records: list[dict], shape: str, resamples: int = 2000, confidence: float = 0.95, seed: int = 0,
           spread: dict[str, tuple[float, int]] | None = None) -> list[dict]:
    """At every routed point of ``shape``, before and after continued pretraining: routed − the static
    frontier and routed − the smaller-dense frontier at the routed point's MACs
    (:func:`frontier_claim`; None outside a frontier's measured range). ``spread``
    (:func:`level_spread`): against the dense frontier, whose points are other base LMs than the routed
    point's, every point carries the between-base sd of the NLL level at that stage, measured on one
    recipe and *assumed* the same at every width (``base_sd`` in the claim); against the static frontier,
    which runs on the routed point's own base LM, the claim is conditional on that base (none added)."""
    routed_records = [r for r in records if r["shape"] == shape and r["kind"] == "routed"]
    by_training = {t: frontiers(records, shape, t) for t in {controls(r) for r in routed_records}}
    out = []
    for r in routed_records:
        f = by_training[controls(r)]
        for when, file, macs_key in CLAIM_SIDES:
            macs = r["macs"].get(macs_key)
            if macs is None or "deployed" not in r["windows"].get(file, {}):
                continue
            routed = _rows(r, file, "deployed")
            for against in ("static", "dense"):
                points = [(m, a) for m, a, _ in f[f"{against}_{when}"]]
                base_sd, bases = (spread or {}).get(when, (0.0, 0)) if against == "dense" else (0.0, 0)
                claim = frontier_claim(routed, macs, points, base_sd, bases, resamples, confidence, seed)
                out.append({"point": r["point"], "skip": r["skip"], "keep": r["keep"], "variant": r.get("variant", ""),
                            "controls": controls(r), "when": when, "against": against,
                            "macs_over_dense": macs, "routed_nll": float(routed.mean()), "base_sd": base_sd,
                            "bases": bases, **({} if claim is None else claim), "verdict": verdict(claim)})
    return out
