"""The results page's frontier section (``metrics/frontier_report.json``, ``make frontier``): the
declared points' claims on the test windows with Holm's correction, then every routed point's
claims against both frontiers, before and after continued pretraining."""

from __future__ import annotations

import json
from pathlib import Path

from lookahead.tools.verdicts import interval_cell, table

FRONTIER = Path("metrics/frontier_report.json")


def frontier_section(path: Path) -> list[str]:
    """Nothing until the study has been scored on the test windows (its report exists)."""
    if not path.is_file():
        return []
    report = json.loads(path.read_text(encoding="utf-8"))
    out = ["## NLL against MACs: routed, static and smaller dense models", "",
           f"`{FRONTIER}`, written by `make frontier` ([frontier](research/frontier.md); the figure: "
           "[frontier.png](figures/frontier.png)). A claim is routed − the frontier at the routed point's MACs per "
           "token (its forward counted from the gates it ran, the router added), the frontier piecewise linear "
           "between its measured points and no claim outside them; against the smaller dense models the "
           "between-base spread of the NLL level is added (an assumption: measured at one width).", ""]
    judged = report.get("judged") or []
    if judged:
        out += ["The headline, declared on the selection windows before any test score "
                "(`metrics/frontier_declared.json`), judged with Holm's correction across its claims:", ""]
        out += table(("declared point", "against", "MACs / dense", "routed − frontier (test)", "Holm p", "verdict"),
                     [(f"`{c['point']}`", f"{c['against']} frontier", f"{c['macs_over_dense']:.3f}",
                       interval_cell(c.get("estimate"), c.get("ci_low"), c.get("ci_high")),
                       f"{c['holm_p_value']:.3g}", c["verdict"]) for c in judged]) + [""]
    rows = [(f"`{c['point']}`", c["when"], f"{c['macs_over_dense']:.3f}", f"{c['routed_nll']:.3f}", c["against"],
             interval_cell(c.get("estimate"), c.get("ci_low"), c.get("ci_high")), c["verdict"])
            for c in report.get("claims", [])]
    if rows:
        out += ["Every routed point (not corrected for the number of points: the declared ones above are the claims):", ""]
        out += table(("point", "continued pretraining", "MACs / dense", "routed NLL", "against", "routed − frontier",
                       "verdict"), rows) + [""]
    return out


def frontier_line(path: Path) -> str | None:
    """README's line for the study: each declared point's test claims with their Holm verdicts, and
    whether the research target (a declared point below both frontiers) is met; None before the test
    windows are scored."""
    if not path.is_file():
        return None
    judged = json.loads(path.read_text(encoding="utf-8")).get("judged") or []
    if not judged:
        return None
    points: dict[str, list[dict]] = {}
    for c in judged:
        points.setdefault(c["point"], []).append(c)
    parts = [f"`{point}` ({claims[0]['macs_over_dense']:.3f} of dense MACs) "
             + ", ".join(f"− {c['against']} frontier "
                         f"{interval_cell(c.get('estimate'), c.get('ci_low'), c.get('ci_high'))}: {c['verdict']}"
                         for c in claims)
             for point, claims in points.items()]
    met = [p for p, claims in points.items() if len(claims) == 2 and all(c["verdict"] == "below" for c in claims)]
    target = f"met at {', '.join(met)}" if met else "missed"
    return (f"- **NLL against MACs** (after continued pretraining; points declared on the selection windows, "
            f"test windows, Holm's correction across {len(judged)} claims; [frontier](docs/research/frontier.md)): "
            f"{'; '.join(parts)}. Below both frontiers (the research target): {target}.")
