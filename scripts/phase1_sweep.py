"""Add the phase-1 points of DVC experiments to the Pareto picture.

Reads every experiment derived from the Git HEAD (`dvc.api.exp_show`), takes from each its
`phase1.lambda_head` and `phase1.lambda_edge` (or the `--param`s given) and the hard predictor's
point (`active_head_fraction`, `hard_nll` of `metrics/phase1.json`), and draws them over the
workspace's static-pruning curve (`metrics/phase1_pareto.csv`). Writes a PNG and a csv, and prints a markdown table.

    dvc exp run --queue -S scoring.set=selection -S phase1.lambda_head=0.2
    dvc exp run --queue -S scoring.set=selection -S phase1.lambda_head=0.5
    dvc exp run --queue -S scoring.set=selection -S phase1.lambda_head=1.0
    dvc queue start && dvc queue status     # wait until every task shows Success
    python scripts/phase1_sweep.py          # metrics/phase1_sweep.{png,csv}

Variants are compared on the selection set (``scoring.set=selection``): the test set is the committed
claims' alone. Experiments belong to the commit they were queued from: after committing, pass `--num N` (the
last N commits) or `--rev <commit>` to still see them.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import dvc.api

from lookahead.core.atomic import write_csv
from lookahead.pipeline.phase1.plots import plot_pareto

METRICS = ("active_head_fraction", "hard_nll", "dense_nll", "static_pruning_nll", "random_heads_nll")


def _value(row: dict, key: str):
    """A column of an exp_show row: DVC names it by its key alone, or prefixed with its file when
    two files share the key."""
    if key in row:
        return row[key]
    matches = [v for k, v in row.items() if k.endswith(":" + key)]
    return matches[0] if matches else None


def sweep_points(rows: list[dict], params: list[str]) -> list[dict]:
    """One point per finished experiment, and the workspace / baseline, that has phase-1 metrics
    (a baseline commit whose point equals the workspace's is drawn once)."""
    points, seen = [], set()
    for row in rows:
        if row.get("State") not in (None, "Success"):
            continue  # queued, running (its metrics are half written) or failed
        values = {k: _value(row, k) for k in METRICS}
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values.values()):
            continue  # run before the phase1 stage existed
        key = (*(_value(row, p) for p in params), values["active_head_fraction"], values["hard_nll"])
        if key in seen:
            continue
        seen.add(key)
        name = row.get("Experiment") or row.get("rev") or "workspace"
        points.append({"experiment": name, "rev": row.get("rev"), **{p: _value(row, p) for p in params},
                       **values, "increase": values["hard_nll"] - values["dense_nll"],
                       "static_increase": values["static_pruning_nll"] - values["dense_nll"]})
    return sorted(points, key=lambda p: p["active_head_fraction"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--param", action="append", help="a param the experiments vary (repeatable; default: "
                        "phase1.lambda_head and phase1.lambda_edge)")
    parser.add_argument("--rev", action="append", help="experiments derived from this commit (repeatable; "
                        "default: HEAD)")
    parser.add_argument("--num", type=int, default=1, help="and from the N - 1 commits before each")
    parser.add_argument("--pareto", default="metrics/phase1_pareto.csv", help="the workspace's Pareto csv")
    parser.add_argument("--figure", default="metrics/phase1_sweep.png")
    parser.add_argument("--csv", default="metrics/phase1_sweep.csv")
    args = parser.parse_args()
    params = args.param or ["phase1.lambda_head", "phase1.lambda_edge"]
    if not Path(args.pareto).is_file():
        sys.exit(f"{args.pareto} not found: run `dvc repro phase1` first")

    if args.num < 1:
        parser.error("--num must be >= 1")
    points = sweep_points(dvc.api.exp_show(revs=args.rev, num=args.num), params)
    if not points:
        sys.exit("no experiment with phase-1 metrics: `dvc exp run --queue -S phase1.lambda_head=…`, then "
                 "`dvc queue start`, and wait for `dvc queue status` to show Success (experiments queued "
                 "from an earlier commit: --num or --rev)")
    with open(args.pareto) as f:
        rows = [{**r, "active_head_fraction": float(r["active_head_fraction"]), "nll": float(r["nll"])}
                for r in csv.DictReader(f)]
    extra = [{"label": f"{p['experiment']} (" + ", ".join(f"{q.split('.')[-1]}={p[q]}" for q in params) + ")",
              "active_head_fraction": p["active_head_fraction"], "nll": p["hard_nll"]} for p in points]
    plot_pareto(rows, args.figure, extra_points=extra)
    write_csv(args.csv, points)
    print("| experiment | " + " | ".join(params)
          + " | active heads | hard NLL − dense | static pruning − dense | ratio |")
    print("|---" * (len(params) + 5) + "|")
    for p in points:
        ratio = p["increase"] / p["static_increase"] if p["static_increase"] > 0 else float("nan")
        print(f"| {p['experiment']} | " + " | ".join(str(p[q]) for q in params)
              + f" | {p['active_head_fraction']:.3f} | {p['increase']:.4f} | {p['static_increase']:.4f} | {ratio:.2f} |")
    print(f"wrote {args.figure} and {args.csv}")


if __name__ == "__main__":
    main()
