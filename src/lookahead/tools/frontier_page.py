"""The frontier study's declaration, headline and figure (``scripts/frontier.py`` runs the points;
:mod:`lookahead.tools.frontier_fit` draws the frontiers and the claims): rendered from the committed
point files, so they are rebuilt without running anything.

The headline point is **declared before the test windows are read**: from the selection windows'
claims (``--set selection``), at each shape the routed point after continued pretraining whose worse
claim (against the static or the smaller-dense frontier, both measured there) is lowest; the
declaration (``metrics/frontier_declared.json``) is committed, and only then are the declared points
scored on the test windows. Their claims are judged together with Holm's step-down correction
(:func:`lookahead.tools.frontier_fit.holm`) across every declared point and both frontiers.
"""

from __future__ import annotations

import json
from pathlib import Path

from lookahead.tools.frontier_fit import FRONTIERS, claims, controls, frontiers, holm, verdict

DECLARED = Path("metrics/frontier_declared.json")
HEADLINE = Path("metrics/frontier.json")
REPORT = Path("metrics/frontier_report.json")
FIGURE = Path("docs/figures/frontier.png")
ALPHA = 0.05
RULE = ("at each shape, the routed point after continued pretraining whose larger estimate of routed − static "
        "frontier and routed − smaller-dense frontier (both measured) is lowest on the selection windows")


def declare(records: list[dict], shapes: list[str], resamples: int = 2000, confidence: float = 0.95, seed: int = 0,
            spread: dict | None = None) -> dict:
    """The declaration from the selection windows' records: each shape's chosen point (:data:`RULE`),
    with the selection figures it was chosen on, and the rule. A shape with no point measured against
    both frontiers declares nothing."""
    if any(r.get("set") not in (None, "selection") for r in records):
        raise ValueError("the headline point is declared from the selection windows' records alone")
    chosen = {}
    for shape in shapes:
        after = [c for c in claims(records, shape, resamples, confidence, seed, spread) if c["when"] == "after"]
        worst: dict[str, float] = {}
        for c in after:
            if c["verdict"] != "outside":
                worst.setdefault(c["point"], []).append(c["estimate"])
        both = {p: max(v) for p, v in worst.items() if len(v) == 2}
        if both:
            point = min(both, key=both.get)
            chosen[shape] = {"point": point, "selection_worse_estimate": both[point],
                             "selection_claims": [c for c in after if c["point"] == point]}
    return {"rule": RULE, "alpha": ALPHA, "declared": chosen}


def judged(records: list[dict], declaration: dict, resamples: int = 2000, confidence: float = 0.95,
           seed: int = 0, spread: dict | None = None) -> list[dict]:
    """The declared points' claims after continued pretraining on the test windows' ``records``, each
    with its Holm-adjusted p-value across them all and its verdict at :data:`ALPHA`."""
    if any(r.get("set") not in (None, "test") for r in records):
        raise ValueError("the declared points are judged on the test windows' records alone")
    out = []
    for shape, chosen in declaration["declared"].items():
        out += [c for c in claims(records, shape, resamples, confidence, seed, spread)
                if c["point"] == chosen["point"] and c["when"] == "after"]
    adjusted = holm([c.get("p_value", 1.0) for c in out])
    for c, p in zip(out, adjusted):
        c["holm_p_value"] = p
        c["verdict"] = verdict(c if "estimate" in c else None, p, declaration.get("alpha", ALPHA))
    return out


def headline(judged_claims: list[dict], declaration: dict) -> dict:
    """``metrics/frontier.json``: each declared claim's estimate, interval and Holm p-value, keyed by the
    shape and the frontier (``<shape>_<static|dense>``, the point named in the declaration), and each
    declared point's MACs over dense; rounded (4 decimals, p to 2 significant digits) so that
    `dvc metrics show` stays within 400 columns."""
    shape_of = {chosen["point"]: shape for shape, chosen in declaration["declared"].items()}
    out = {}
    for c in judged_claims:
        shape = shape_of[c["point"]]
        key = f"{shape}_{c['against']}"
        rounded = {key: c.get("estimate"), f"{key}_lo": c.get("ci_low"), f"{key}_hi": c.get("ci_high")}
        out.update({k: None if v is None else round(v, 4) for k, v in rounded.items()})
        out[f"{key}_holm_p"] = float(f"{c['holm_p_value']:.2g}")
        out[f"{shape}_macs"] = round(c["macs_over_dense"], 4)
    return out


def figure(records: list[dict], shapes: list[str], path: Path = FIGURE) -> dict[str, dict[str, list[float]]]:
    """NLL on the records' windows against MACs over dense, one line per method (static, smaller dense,
    routed full, routed query; the frontiers the grid's, the variants unjoined points; after continued
    pretraining a variant whose controls train otherwise beside the frontiers trained alike, dotted),
    before and after continued pretraining side by side, one row per shape;
    bars: ±1.96 · the standard error of the mean over the windows (each window's mean over the rows):
    the token component alone; the claims' intervals add the seeds' and the bases'.

    Returns:
        each panel's ("<shape> <before|after>") series: {label: the MACs over dense of its points}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from lookahead.core.atomic import atomic_file

    def bars(ax, points, **style) -> list[float]:
        """``points`` ((MACs, (rows, windows) NLLs)) as one series in MACs order, the bars ±1.96 · the
        standard error over the windows; returns their MACs."""
        points = sorted(points, key=lambda p: p[0])
        ax.errorbar([m for m, _ in points], [a.mean() for _, a in points],
                    yerr=[1.96 * a.mean(0).std(ddof=1) / np.sqrt(a.shape[1]) for _, a in points], capsize=3, **style)
        return [m for m, _ in points]

    windows = " and ".join(sorted({r.get("set") or "test" for r in records}))
    fig, axes = plt.subplots(len(shapes), 2, figsize=(12, 4.5 * len(shapes)), dpi=100, squeeze=False)
    drawn: dict[str, dict[str, list[float]]] = {}
    for row, shape in zip(axes, shapes):
        f = frontiers(records, shape)
        routed = [r for r in records if r["shape"] == shape and r["kind"] == "routed"]
        for ax, when in zip(row, ("before", "after")):
            panel = drawn.setdefault(f"{shape} {when}", {})
            # the static line drawn wide beneath the dense one: where they share points (a static control
            # keeping k heads is a dense model of that width) both stay visible
            for kind, color, width in (("static", "tab:gray", 5.0), ("dense", "tab:green", 1.5)):
                panel[f"{kind} frontier"] = bars(ax, [(m, a) for m, a, _ in f[f"{kind}_{when}"]], fmt="o-", color=color,
                                                 linewidth=width, alpha=0.8, label=f"{kind} frontier")
            file, key = ("phase1", "deployed") if when == "before" else ("phase2", "deployed")
            macs_key = "deployed" if when == "before" else "phase2_deployed"
            # the grid's points joined per skip mode; each variant a point of its own (one setting changed);
            # after continued pretraining a variant whose controls train otherwise is drawn with the
            # frontiers it is measured against (dotted), not the grid's
            series = [("routed (full skip)", lambda r: r["skip"] == "full" and not r.get("variant"), "tab:blue", "s--"),
                      ("routed (query skip)", lambda r: r["skip"] == "query" and not r.get("variant"), "tab:orange",
                       "s--"),
                      ("routed variants", lambda r: bool(r.get("variant")) and (when == "before" or not controls(r)),
                       "tab:purple", "D")]
            if when == "after":
                for t in sorted({controls(r) for r in routed} - {""}):
                    alike = frontiers(records, shape, t)
                    for kind, color in (("static", "tab:gray"), ("dense", "tab:green")):
                        panel[f"{kind} frontier ({t})"] = bars(ax, [(m, a) for m, a, _ in alike[f"{kind}_after"]],
                                                               fmt="x:", color=color, alpha=0.8,
                                                               label=f"{kind} frontier ({t})")
                    series.append((f"routed variant ({t})", lambda r, t=t: controls(r) == t, "tab:red", "P"))
            for label, chosen, color, fmt in series:
                pts = [(r["macs"][macs_key], np.asarray(r["windows"][file][key])) for r in routed
                       if chosen(r) and r["macs"].get(macs_key) is not None and key in r["windows"].get(file, {})]
                if pts:
                    panel[label] = bars(ax, pts, fmt=fmt, color=color, label=label)
            ax.set_title(f"{shape}: {'before' if when == 'before' else 'after'} continued pretraining")
            ax.set_xlabel("MACs per token / dense")
            ax.set_ylabel(f"NLL on the {windows} windows (nats)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return drawn


def report(records: list[dict], shapes: list[str], declaration: dict | None, judged_claims: list[dict] | None,
           resamples: int = 2000, confidence: float = 0.95, seed: int = 0, spread: dict | None = None) -> dict:
    """``metrics/frontier_report.json``: every point's claims, the frontiers' points, the declaration and
    the judged claims."""
    def listed(points):
        return [{"macs_over_dense": m, "nll": float(a.mean()), "label": label, "rows": int(a.shape[0])}
                for m, a, label in points]

    return {"shapes": shapes,
            "frontiers": {shape: {name: listed(pts) for name, pts in frontiers(records, shape).items() if name in FRONTIERS}
                          for shape in shapes},
            # the after-frontiers a routed variant whose controls train otherwise (frontier_fit.controls) is
            # measured against, as the claims and the figure take them
            "frontiers_trained_otherwise": {
                shape: {t: {name: listed(pts) for name, pts in frontiers(records, shape, t).items() if name.endswith("_after")}
                        for t in sorted({controls(r) for r in records
                                         if r["shape"] == shape and r["kind"] == "routed"} - {""})}
                for shape in shapes},
            "claims": [c for shape in shapes for c in claims(records, shape, resamples, confidence, seed, spread)],
            "between_base_spread": spread,
            "declaration": declaration, "judged": judged_claims,
            "points": [{k: v for k, v in r.items() if k != "windows"} for r in records]}


def read_declaration(path: Path = DECLARED) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
