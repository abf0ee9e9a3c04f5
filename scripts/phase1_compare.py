"""Paired comparison of two phase-1 runs (DVC experiments or commits) on the selection set: per-position
NLLs from each run's ``data/val_nll/phase1.safetensors`` (read from the local DVC cache by the md5
its dvc.lock records), seed i against seed i, with the 95 % interval of
:func:`lookahead.core.intervals.paired_interval` (windows bootstrapped, seeds combined).

    python scripts/phase1_compare.py p1l-r1 p1o-greedy-listwise            # as deployed (default)
    python scripts/phase1_compare.py p1o-greedy-listwise p1o-greedy-bce --kind hard

Each argument is anything `git rev-parse` reads: an experiment's name (``refs/exps/…/<name>``), a
branch, a commit. Both runs must score the selection set (``dvc exp run -S scoring.set=selection …``):
the test set is the committed claims' alone (``--test`` reads it knowingly). Prints one JSON line:
A − B (negative: A lower).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import yaml

from lookahead.artifacts.val_scores import ScoresError, comparison_set, load_scores, paired
from lookahead.core.intervals import paired_interval

SCORES = "data/val_nll/phase1.safetensors"


def resolve(name: str) -> str:
    refs = subprocess.run(["git", "for-each-ref", "--format=%(refname)", "refs/exps"], capture_output=True, text=True,
                          check=True).stdout.split()
    matches = [r for r in refs if r.rsplit("/", 1)[-1] == name]
    return matches[0] if matches else name


def scores(name: str) -> dict:
    lock = yaml.safe_load(subprocess.run(["git", "show", f"{resolve(name)}:dvc.lock"], capture_output=True, text=True,
                                         check=True).stdout)
    md5 = next(o["md5"] for o in lock["stages"]["phase1"]["outs"] if o["path"] == SCORES)
    return load_scores(f".dvc/cache/files/md5/{md5[:2]}/{md5[2:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--kind", default="deployed", choices=("deployed", "hard"),
                        help="the router as deployed (its own routed states) or on the dense pass's states")
    parser.add_argument("--window", type=int, default=128, help="positions per scoring window (the bootstrap's block)")
    parser.add_argument("--test", action="store_true", help="allow runs scored on the test set (the claims' windows)")
    args = parser.parse_args()
    a, b = scores(args.a), scores(args.b)
    try:
        for name, run in ((args.a, a), (args.b, b)):
            comparison_set(run.window_set, name, args.test)
    except ScoresError as err:
        sys.exit(str(err))
    if args.kind not in a or args.kind not in b:
        sys.exit(f"{args.kind!r} per-position NLLs are not in both runs' scores (older runs have only 'hard')")
    interval = paired_interval(paired(a[args.kind], b[args.kind], f"{args.a} − {args.b}", (a.window_set, b.window_set)),
                               args.window)
    print(json.dumps({"a": args.a, "b": args.b, "kind": args.kind,
                      **{k: interval[k] for k in ("mean", "sd", "se", "ci_low", "ci_high", "seeds", "positions")}}))


if __name__ == "__main__":
    main()
