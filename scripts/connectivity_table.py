"""Phase 2's connectivity variants side by side: one markdown row per run (DVC experiments or
commits) from what the run committed — ``params.yaml``, ``metrics/evaluate.json`` and, through the
DVC cache, ``metrics/phase2_report.json`` and the per-position NLLs phase 2 wrote for every seed.

Columns: the connectivity kind (or value residual, or the output adapter), the heads phase 2 runs,
whether the LM trained, the parameters added, phase 2's NLL (mean ± sd over seeds), the two paired
claims evaluate computed (phase 2 − the dense control, phase 2 − the static control; mean ± sd over
the paired seeds and the 95 % interval), and phase 2 − its own LM run dense, the same seeds and
positions (with the LM frozen: the frozen LM without the additions; interval by the same block
bootstrap, ``lookahead.core.intervals.paired_interval``), and how far the weights moved from 1.

    python scripts/connectivity_table.py HEAD p2c-both-all p2c-static-all
    python scripts/connectivity_table.py --pair p2f-dynamic p2f-lora    # A − B, phase 2's NLLs, paired

``--pair A B`` prints one more row: run A's phase-2 NLLs minus run B's, seed i with seed i on the same
positions (the runs must share seeds and the scoring set).

Each argument is anything `git rev-parse` reads (an experiment's name resolves to its ref). The DVC
cache must hold the runs' outputs (a `dvc exp pull` brings them). Every run must score the selection
set (``dvc exp run -S scoring.set=selection …``; ``--test`` reads the claims' windows knowingly).
Nothing is typed by hand.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml
from phase2_table import headline, resolve, selection_runs, show  # this directory: python puts a script's own directory on sys.path

from lookahead.artifacts.val_scores import load_scores
from lookahead.core.intervals import paired_interval


def cached(rev: str, path: str) -> Path:
    """The DVC cache's copy of output ``path`` as the run's dvc.lock records it."""
    lock = yaml.safe_load(show(rev, "dvc.lock"))
    for stage in lock["stages"].values():
        for out in stage.get("outs", []):
            if out["path"] == path:
                md5 = out["md5"]
                return Path(".dvc/cache/files/md5") / md5[:2] / md5[2:]
    raise SystemExit(f"{rev}: no output {path} in its dvc.lock")


def claim(ev: dict, name: str) -> str:
    return f"{ev[name]:+.4f} ± {ev[name + '_sd']:.4f} [{ev[name + '_ci_low']:+.4f}, {ev[name + '_ci_high']:+.4f}]"


def own_dense(rev: str, params: dict) -> str:
    scores = load_scores(cached(rev, "data/val_nll/phase2.safetensors"))
    s = params["scoring"]
    i = paired_interval(scores["hard"] - scores["dense"], params["base"]["arch"]["context_length"], s["resamples"],
                        s["confidence"], s["seed"])
    return f"{i['mean']:+.4f} ± {i['sd']:.4f} [{i['ci_low']:+.4f}, {i['ci_high']:+.4f}]"


def row(name: str) -> str:
    rev = resolve(name)
    params = yaml.safe_load(show(rev, "params.yaml"))
    p, pred = params["phase2"], params["predictor"]
    ev = headline(rev, "evaluate")
    report = json.loads(cached(rev, "metrics/phase2_report.json").read_text())
    keep = p.get("keep") if p.get("keep") is not None else pred["keep"]
    what = ("value residual" if p.get("value_residual") else f"adapter {p['adapter']}" if p.get("adapter", "none") != "none"
            else p.get("connectivity", "none"))
    added = report.get("added_parameters") or {}
    n_added = sum(v for k, v in added.items() if k in ("connectivity", "value_residual", "adapter"))
    moved = report.get("connectivity_weights")
    moved = "–" if not moved else f"{moved['mean_abs_change']:.3f} ({moved['min']:.2f} … {moved['max']:.2f})"
    nll = f"{report['hard_nll']:.4f} ± {report.get('hard_nll_sd', 0.0):.4f}"
    return (f"| `{name}` | {what} | {keep:.0%} | {'yes' if p.get('train_lm', True) else 'frozen'} | {n_added:,} | {nll} | "
            f"{claim(ev, 'phase2_minus_control')} | {claim(ev, 'phase2_minus_static_control')} | "
            f"{own_dense(rev, params)} | {moved} |")


def pair(a: str, b: str) -> str:
    runs = [resolve(a), resolve(b)]
    params = yaml.safe_load(show(runs[0], "params.yaml"))
    hard = [load_scores(cached(r, "data/val_nll/phase2.safetensors"))["hard"] for r in runs]
    s = params["scoring"]
    i = paired_interval(hard[0] - hard[1], params["base"]["arch"]["context_length"], s["resamples"], s["confidence"],
                        s["seed"])
    return f"`{a}` − `{b}`, phase 2's NLL: {i['mean']:+.4f} ± {i['sd']:.4f} [{i['ci_low']:+.4f}, {i['ci_high']:+.4f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*")
    parser.add_argument("--pair", nargs=2, action="append", default=[], metavar=("A", "B"))
    parser.add_argument("--test", action="store_true", help="allow runs scored on the test set (the claims' windows)")
    args = parser.parse_args()
    selection_runs(args.runs + [run for pair_ in args.pair for run in pair_], args.test)
    for a, b in args.pair:
        print(pair(a, b))
    if not args.runs:
        return
    print("| run | added | heads on | LM | parameters added | phase 2 NLL | − dense control [95 %] | "
          "− static control [95 %] | − its own LM dense [95 %] | weights: mean abs(W − 1) (min … max) |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for name in args.runs:
        print(row(name))


if __name__ == "__main__":
    main()
