"""Add the phase-1 points of DVC experiments to the Pareto picture.

Reads every experiment derived from the Git HEAD (`dvc.api.exp_show`), takes from each its
`phase1.lambda_head` (or any other `--param`) and the hard predictor's point (`active_head_fraction`,
`hard_nll` of `metrics/phase1.json`), and draws them over the workspace's static-pruning curve
(`metrics/phase1_pareto.csv`). Writes a PNG and a csv, and prints a markdown table.

    dvc exp run --queue -S phase1.lambda_head=0.2
    dvc exp run --queue -S phase1.lambda_head=0.5
    dvc exp run --queue -S phase1.lambda_head=1.0
    dvc queue start && dvc queue status     # wait until every task shows Success
    python scripts/phase1_sweep.py          # metrics/phase1_sweep.{png,csv}
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import dvc.api

from lookahead.atomic import write_csv
from lookahead.phase1_plots import plot_pareto

METRICS = ("active_head_fraction", "hard_nll", "dense_nll", "static_pruning_nll", "random_heads_nll")


def _value(row: dict, key: str):
    """A column of an exp_show row: DVC names it by its key alone, or prefixed with its file when
    two files share the key."""
    if key in row:
        return row[key]
    matches = [v for k, v in row.items() if k.endswith(":" + key)]
    return matches[0] if matches else None


def sweep_points(rows: list[dict], param: str) -> list[dict]:
    """One point per experiment (and the baseline) that has phase-1 metrics."""
    points = []
    for row in rows:
        values = {k: _value(row, k) for k in METRICS}
        if any(not isinstance(v, (int, float)) for v in values.values()):
            continue  # queued, failed, or run before the phase1 stage existed
        name = row.get("Experiment") or row.get("rev") or "workspace"
        points.append({"experiment": name, "rev": row.get("rev"), param: _value(row, param), **values,
                       "increase": values["hard_nll"] - values["dense_nll"],
                       "static_increase": values["static_pruning_nll"] - values["dense_nll"]})
    return sorted(points, key=lambda p: p["active_head_fraction"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--param", default="phase1.lambda_head", help="the param the experiments vary")
    parser.add_argument("--pareto", default="metrics/phase1_pareto.csv", help="the workspace's Pareto csv")
    parser.add_argument("--figure", default="metrics/phase1_sweep.png")
    parser.add_argument("--csv", default="metrics/phase1_sweep.csv")
    args = parser.parse_args()
    if not Path(args.pareto).is_file():
        sys.exit(f"{args.pareto} not found: run `dvc repro phase1` first")

    points = sweep_points(dvc.api.exp_show(), args.param)
    if not points:
        sys.exit("no experiment with phase-1 metrics: `dvc exp run --queue -S phase1.lambda_head=…`, then "
                 "`dvc queue start`, and wait for `dvc queue status` to show Success")
    with open(args.pareto) as f:
        rows = [{**r, "active_head_fraction": float(r["active_head_fraction"]), "nll": float(r["nll"])}
                for r in csv.DictReader(f)]
    extra = [{"label": f"{p['experiment']} ({args.param.split('.')[-1]}={p[args.param]})",
              "active_head_fraction": p["active_head_fraction"], "nll": p["hard_nll"]} for p in points]
    plot_pareto(rows, args.figure, extra_points=extra)
    write_csv(args.csv, points)
    print(f"| experiment | {args.param} | active heads | hard NLL − dense | static pruning − dense | ratio |")
    print("|---|---|---|---|---|---|")
    for p in points:
        ratio = p["increase"] / p["static_increase"] if p["static_increase"] > 0 else float("nan")
        print(f"| {p['experiment']} | {p[args.param]} | {p['active_head_fraction']:.3f} | {p['increase']:.4f} "
              f"| {p['static_increase']:.4f} | {ratio:.2f} |")
    print(f"wrote {args.figure} and {args.csv}")


if __name__ == "__main__":
    main()
