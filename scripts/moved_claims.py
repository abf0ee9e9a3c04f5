"""What each measurement rule did to each claim (docs/research/measurement-integrity.md): one column per
step, each step a rerun of the same complete run with one more rule in the code — scoring stages only,
but for the static control, which retrains under the stronger static mask.

    python scripts/moved_claims.py collect <step> <run dir> [--rev REV]   # add (or replace) a column
    python scripts/moved_claims.py render                                # the table into the page

``collect`` reads the run's phase-1 and evaluate headlines (their ``_ci`` siblings included) into
``docs/research/moved_claims.json``; ``render`` writes the table between the page's markers from that
file alone, so that the page holds no hand-typed figure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lookahead.core.intervals import CI_HIGH, CI_LOW
from lookahead.core.report import read_headline
from lookahead.tools.verdicts import claim_verdict

DATA = Path("docs/research/moved_claims.json")
PAGE = Path("docs/research/measurement-integrity.md")
BEGIN, END = "<!-- moved claims: begin (scripts/moved_claims.py render) -->", "<!-- moved claims: end -->"
CLAIMS = (
    ("phase1", "deployed_minus_static_pruning", True, "phase 1: router as deployed − static pruning, same heads"),
    ("phase1", "deployed_minus_static_at_equal_macs", True, "phase 1: the same at equal MACs"),
    ("phase1", "router_minus_static_pruning", True, "phase 1: router on dense states − static pruning"),
    ("phase1", "greedy_capture", None, "phase 1: greedy capture (target 0.6)"),
    ("phase1", "oracle_recall_minus_static_recall", False, "phase 1: recall − static recall"),
    ("evaluate", "phase2_minus_control", True, "phase 2 − dense control"),
    ("evaluate", "phase2_minus_static_control", True, "phase 2 − static control"),
)
STEPS = ("before", "fresh test set", "stronger static baseline", "MACs as they run", "names", "budget")
"""The columns, in the order the rules were added (a collected step of another name goes after them)."""
FIGURES = (("phase1", "static_pruning_nll"), ("phase1", "static_importance_nll"), ("phase1", "static_greedy_nll"),
           ("phase1", "static_pruning_mask"), ("phase1", "equal_macs_static_heads"), ("phase1", "window_set"),
           ("evaluate", "static_control_nll"), ("evaluate", "window_set"))


def collect(step: str, run: Path, rev: str | None) -> None:
    column = {"rev": rev, "claims": {}, "figures": {}}
    heads = {stage: read_headline(run / "metrics" / f"{stage}.json") for stage in ("phase1", "evaluate")}
    reports = {stage: json.loads((run / "metrics" / f"{stage}_report.json").read_text(encoding="utf-8"))
               for stage in ("phase1",)}
    for stage, key, _, _ in CLAIMS:
        h = heads[stage]
        value = h.get(key) if h.get(key) is not None else reports.get(stage, {}).get(key)
        low = h.get(f"{key}{CI_LOW}", reports.get(stage, {}).get(f"{key}{CI_LOW}"))
        high = h.get(f"{key}{CI_HIGH}", reports.get(stage, {}).get(f"{key}{CI_HIGH}"))
        column["claims"][f"{stage}.{key}"] = None if value is None else {"mean": value, "ci_low": low, "ci_high": high}
    for stage, key in FIGURES:
        value = heads[stage].get(key, reports.get(stage, {}).get(key))
        column["figures"][f"{stage}.{key}"] = value
    data = json.loads(DATA.read_text(encoding="utf-8")) if DATA.is_file() else {"steps": {}}
    data["steps"][step] = column
    DATA.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def cell(claim: dict | None, below: bool | None, reference: float | None = None) -> str:
    if claim is None:
        return "–"
    if claim["ci_low"] is None:
        return f"{claim['mean']:+.3f}"
    text = f"{claim['mean']:+.3f} [{claim['ci_low']:+.3f}, {claim['ci_high']:+.3f}]"
    if below is None:  # a mean against a reference: capture against 0.6
        verdict = "holds" if claim["ci_low"] > reference else "fails" if claim["ci_high"] < reference else "unresolved"
        return f"{claim['mean']:.2f} [{claim['ci_low']:.2f}, {claim['ci_high']:.2f}] {verdict}"
    return f"{text} {claim_verdict((claim['ci_low'], claim['ci_high']), below)}"


def render() -> None:
    data = json.loads(DATA.read_text(encoding="utf-8"))
    steps = [s for s in STEPS if s in data["steps"]] + [s for s in data["steps"] if s not in STEPS]
    head = "| claim | " + " | ".join(steps) + " |"
    rows = [head, "|" + " --- |" * (len(steps) + 1)]
    for stage, key, below, label in CLAIMS:
        rows.append(f"| {label} (`{key}`) | "
                    + " | ".join(cell(data["steps"][s]["claims"].get(f"{stage}.{key}"), below, 0.6) for s in steps) + " |")
    for stage, key in FIGURES:
        def fig(v):
            return "–" if v is None else f"{v:.3f}" if isinstance(v, float) else f"`{v}`"
        rows.append(f"| {stage}: `{key}` | " + " | ".join(fig(data["steps"][s]["figures"].get(f"{stage}.{key}"))
                                                        for s in steps) + " |")
    revs = ", ".join(f"{s}: `{data['steps'][s]['rev']}`" for s in steps)
    block = "\n".join([BEGIN, "", *rows, "", f"Revisions: {revs}. Figures: [`{DATA.name}`]({DATA.name}).", "", END])
    page = PAGE.read_text(encoding="utf-8")
    if BEGIN not in page or END not in page:
        sys.exit(f"error: {PAGE} has no {BEGIN} … {END} markers")
    PAGE.write_text(page.split(BEGIN)[0] + block + page.split(END, 1)[1], encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("step")
    c.add_argument("run", type=Path)
    c.add_argument("--rev", default=None)
    sub.add_parser("render")
    args = parser.parse_args()
    if args.command == "collect":
        collect(args.step, args.run, args.rev)
    else:
        render()


if __name__ == "__main__":
    main()
