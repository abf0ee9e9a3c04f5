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
