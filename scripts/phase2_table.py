"""The phase-2 variants side by side: one markdown row per run (DVC experiments or commits) from
its committed ``metrics/evaluate.json``, ``metrics/phase2.json`` and ``params.yaml`` — the
shared/routed split, the fraction of heads off, the training steps, the router's refresh, distillation and gate weights,
phase 2's NLL (as deployed where the run scored it so), and its two paired claims (phase 2 − the dense control, phase 2 − the static control,
each mean ± sd over the paired seeds with its 95 % interval, as evaluate computed them), and how many
heads the static control kept (a comparison at equal heads has the routed run's kept count there).

    python scripts/phase2_table.py HEAD p2s-0 p2s-2 p2r-s0-e25-loo

Each argument is anything `git rev-parse` reads: an experiment's name (``refs/exps/…/<name>``), a
branch, a commit. Every run must score the selection set (``dvc exp run -S scoring.set=selection …``;
``--test`` reads the claims' windows knowingly). Nothing is typed by hand: rerun it after the
experiments change.
"""

from __future__ import annotations

import argparse
import json
import subprocess

import yaml

from lookahead.artifacts.val_scores import ScoresError, comparison_set
from lookahead.core.report import SIBLINGS


def resolve(name: str) -> str:
    refs = subprocess.run(["git", "for-each-ref", "--format=%(refname)", "refs/exps"], capture_output=True, text=True,
                          check=True).stdout.split()
    matches = [r for r in refs if r.rsplit("/", 1)[-1] == name]
    return matches[0] if matches else name


def show(rev: str, path: str) -> str:
    return subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True, check=True).stdout


def headline(rev: str, stage: str) -> dict:
    """A stage's headline at ``rev``: ``metrics/<stage>.json`` with its spreads and intervals, which
    revisions since the headline split keep in ``<stage>_sd.json`` and ``<stage>_ci.json``."""
    figures = json.loads(show(rev, f"metrics/{stage}.json"))
    for part in SIBLINGS:
        done = subprocess.run(["git", "show", f"{rev}:metrics/{stage}_{part}.json"], capture_output=True, text=True)
        if done.returncode == 0:
            figures.update(json.loads(done.stdout))
    return figures


def selection_runs(names: list[str], allow_test: bool) -> None:
    """Exit with the reason unless every run's evaluate headline scores the selection set (variants are
    compared there: the test set is the committed claims' alone; ``allow_test``: ``--test``)."""
    try:
        for name in names:
            comparison_set(headline(resolve(name), "evaluate").get("window_set"), name, allow_test)
    except ScoresError as err:
        raise SystemExit(str(err)) from None


def claim(ev: dict, name: str) -> str:
    return (f"{ev[name]:+.3f} ± {ev[name + '_sd']:.3f} [{ev[name + '_ci_low']:+.3f}, {ev[name + '_ci_high']:+.3f}]")


def row(name: str) -> str:
    rev = resolve(name)
    params = yaml.safe_load(show(rev, "params.yaml"))
    ev, p2, static = headline(rev, "evaluate"), headline(rev, "phase2"), headline(rev, "static_control")
    p, pred = params["phase2"], params["predictor"]
    heads = 16 if "n_heads" not in p2 else p2["n_heads"]
    kept = round(pred["keep"] * heads)
    shared = p.get("shared_heads", 0)
    refresh = ("–" if not p.get("refresh_every") else
               f"{p.get('refresh_oracle', 'greedy')} every {p['refresh_every']} ({p.get('refresh_windows')} windows)")
    distill = "–" if not p.get("distill") else f"{p['distill']}" + (f", top-{p['distill_top_k']}" if p.get("distill_top_k") else "")
    nll = p2.get("deployed_nll") or p2["hard_nll"]
    sd = p2.get("deployed_nll_sd") if p2.get("deployed_nll") else p2.get("hard_nll_sd")
    return (f"| `{name}` | {shared} + {kept - shared} | {1 - pred['keep']:.0%} | {p['train']['steps']} | {refresh} | {distill} | "
            f"{p.get('gate_weights', 'binary')} | {nll:.3f} ± {sd:.3f} | {claim(ev, 'phase2_minus_control')} | "
            f"{claim(ev, 'phase2_minus_static_control')} | {round(static['active_head_fraction'] * heads)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--test", action="store_true", help="allow runs scored on the test set (the claims' windows)")
    args = parser.parse_args()
    selection_runs(args.runs, args.test)
    print("| run | shared + routed | heads off | steps | router refresh | distill | gate weights | phase 2 NLL | "
          "− dense control [95 %] | − static control [95 %] | static control's heads |")
    print("|---|---|---:|---:|---|---|---|---:|---:|---:|---:|")
    for name in args.runs:
        print(row(name))


if __name__ == "__main__":
    main()
