"""A replicate that emulates a second machine (docs/reproducibility.md): ``make replicate``.

    python -m lookahead.tools.replicate                          # the default: 1e-4 of the base's init
    python -m lookahead.tools.replicate --report metrics/replicate.md
    python -m lookahead.tools.replicate --perturbation 1e-3 --workdir /tmp/rep --keep

Two machines of the same kind give base LMs that differ in their bits (float rounding of another
CPU), and everything downstream moves with them: a component of the spread that no single run's
seeds see. This reruns, in a scratch copy of the workspace, every stage from the base onwards with
the base's initial weights moved by one float32 ulp in a seeded share of their entries
(``base.init_perturbation``), which makes pretraining diverge as it does between CPUs; then it
compares every figure of the replicate with the workspace's, as ``make verify`` does (claims by
their intervals: verdict, sign and overlap; research headlines by the spread between base LMs where
``make bases`` measured it, else by their seed spread), and prints the table.

The workspace must hold a complete run (``dvc status`` clean). The scratch copy is the working
tree's files (``git ls-files``: committed or not, ignored ones left out), the outputs of the stages
upstream of the base copied from the workspace (and committed to the copy's own DVC cache, so that
DVC does not rerun them) and its project-local WordNet, its own checkpoints and MLflow store;
``dvc repro --no-commit`` runs there, and the copy is removed at the end (``--keep``: kept). Nothing
in the workspace is written, except the ``--report`` file where one is asked for.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lookahead.semantics.wordnet_source import LOCAL_DATA_DIR
from lookahead.tools.verify import Row, render, verify

PERTURBATION = 1e-4
FIRST_STAGE = "base"
# what the emulation must move as much as another machine does (issue 41's table): name -> figure
EMULATION_CHECKS = ("base.val_nll", "phase1.dense_nll", "probe.base_contextual_spearman")


DVC = [sys.executable, "-m", "dvc"]  # the DVC of this environment, whatever PATH holds


class ReplicateError(RuntimeError):
    """The workspace cannot be replicated as it stands."""


def _run(cmd: list[str], cwd: Path, env: dict | None = None, quiet: bool = False) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env=env, text=True, capture_output=quiet)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout or "").strip()[-2000:] if quiet else ""
        raise ReplicateError(f"`{' '.join(cmd)}` failed in {cwd} (exit {done.returncode}){': ' + detail if detail else ''}")
    return done


def downstream_stages(lock: dict, first: str = FIRST_STAGE) -> set[str]:
    """The stages of a dvc.lock that ``first`` feeds, itself included: a stage is downstream where one
    of its deps is (or lies under) an output of a downstream stage."""
    stages = lock.get("stages", {})
    if first not in stages:
        raise ReplicateError(f"dvc.lock has no stage {first!r}: run `dvc repro` first")
    outs = {name: [o["path"] for o in spec.get("outs", [])] for name, spec in stages.items()}
    down, grew = {first}, True
    while grew:
        grew = False
        made = [path for name in down for path in outs[name]]
        for name, spec in stages.items():
            if name in down:
                continue
            if any(dep["path"] == out or dep["path"].startswith(out.rstrip("/") + "/")
                   for dep in spec.get("deps", []) for out in made):
                down.add(name)
                grew = True
    return down


def set_perturbation(params: str, fraction: float) -> str:
    """``params.yaml``'s text with ``base.init_perturbation`` set to ``fraction`` (comments kept)."""
    pattern = re.compile(r"^(base:\n(?:[ \t]+.*\n|\n)*?[ \t]+init_perturbation:[ \t]*)[^\s#]+", re.MULTILINE)
    import yaml

    value = yaml.safe_dump(float(fraction)).split("\n")[0]  # YAML's float (PyYAML reads "1e-07" as a string)
    text, count = pattern.subn(lambda m: m.group(1) + value, params)
    if count != 1:
        raise ReplicateError("params.yaml has no `base.init_perturbation` line to set")
    return text


def scratch_copy(root: Path, scratch: Path, fraction: float) -> list[str]:
    """The working tree's files, the outputs upstream of the base and a fresh git repository in
    ``scratch``, params set to ``fraction``; returns the stages that will rerun."""
    import yaml

    lock = yaml.safe_load((root / "dvc.lock").read_text(encoding="utf-8"))
    down = downstream_stages(lock)
    # the rerun's outputs are not copied, whether or not git sees them (a `cache: false` metrics file is in git)
    rebuilt = [out["path"].rstrip("/") for name in down for out in lock["stages"][name].get("outs", [])]
    files = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], root, quiet=True).stdout
    for rel in filter(None, files.split("\0")):
        src = root / rel
        if not src.is_file() or any(rel == out or rel.startswith(out + "/") for out in rebuilt):
            continue  # a deleted tracked file is listed too
        (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, scratch / rel)
    for out in rebuilt:  # where the rerun writes, as in the workspace
        (scratch / out).parent.mkdir(parents=True, exist_ok=True)
    for name, spec in lock["stages"].items():
        if name in down:
            continue
        for out in spec.get("outs", []):
            src, dst = root / out["path"], scratch / out["path"]
            if src.is_dir():
                shutil.copytree(src, dst, dirs_exist_ok=True)
            elif src.is_file():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
            else:
                raise ReplicateError(f"{out['path']} (an output of stage {name!r}) is missing: run `dvc repro` first")
    words = root / LOCAL_DATA_DIR  # the project-local WordNet (git-ignored; `make wordnet`)
    if words.is_dir():
        shutil.copytree(words, scratch / LOCAL_DATA_DIR, dirs_exist_ok=True)
    params = scratch / "params.yaml"
    params.write_text(set_perturbation(params.read_text(encoding="utf-8"), fraction), encoding="utf-8")
    for cmd in (["init", "-q"], ["add", "-A"],
                ["-c", "user.email=replicate@localhost", "-c", "user.name=replicate", "commit", "-qm", "replicate"]):
        _run(["git", *cmd], scratch, quiet=True)
    upstream = [name for name in lock["stages"] if name not in down]
    if upstream:  # into the scratch cache: DVC reruns a stage whose outputs are not in its cache
        _run([*DVC, "commit", "--force", "--quiet", *upstream], scratch, quiet=True)
    return sorted(down, key=list(lock["stages"]).index)


def check_workspace(root: Path, env: dict) -> None:
    """Refuse a workspace whose run is incomplete or stale (the comparison needs its figures)."""
    done = _run([*DVC, "status", "--json"], root, env, quiet=True)
    stale = json.loads(done.stdout or "{}")
    if stale:
        raise ReplicateError(f"the workspace's run is not up to date ({', '.join(sorted(stale))}): run `dvc repro` first")


def emulation_rows(rows: list[Row]) -> list[Row]:
    by_name = {row.figure: row for row in rows}
    return [by_name[name] for name in EMULATION_CHECKS if name in by_name]


def summary(rows: list[Row]) -> dict:
    claims = [r for r in rows if r.claim]
    research = [r for r in rows if r.research and not r.claim]
    return {"claims": len(claims), "claims_agree": sum(r.within for r in claims),
            "claims_failed": [r.figure for r in claims if not r.within],
            "sign_flipped": [r.figure for r in claims if r.sign_flipped],
            "research": len(research), "research_within": sum(r.within for r in research),
            "research_outside": [r.figure for r in research if not r.within]}


def report_text(rows: list[Row], fraction: float, wall_s: float, stages: list[str]) -> str:
    """The replicate's table as markdown: claims, then research headlines, then the emulation check."""
    s = summary(rows)
    claims = [r for r in rows if r.claim]
    research = [r for r in rows if r.research and not r.claim]
    lines = [
        "# Replicate: the default run against a base LM that differs as another machine's does",
        "",
        f"Written by `python -m lookahead.tools.replicate --report` (`make replicate`): the stages {', '.join(stages)} "
        f"rerun with `base.init_perturbation: {fraction:g}` (one float32 ulp in that share of the base's initial "
        f"weights) in {wall_s / 60:.1f} min. `committed` is this workspace's run, `here` the replicate's; claims carry "
        "their 95 % interval (docs/reproducibility.md).",
        "",
        f"- claims agreeing in verdict, sign and interval: {s['claims_agree']} of {s['claims']}"
        + (f" (failed: {', '.join(s['claims_failed'])})" if s["claims_failed"] else ""),
        f"- research headlines within their spread (between base LMs where `make bases` measured it, else 3 seed sd): "
        f"{s['research_within']} of {s['research']}"
        + (f" (outside: {', '.join(s['research_outside'])})" if s["research_outside"] else ""),
        "",
        "## Claims", "", "```", render(claims), "```", "",
        "## Research headlines (the spread between base LMs, or the seeds')", "", "```", render(research), "```", "",
        "## How far the emulation moved the base", "", "```", render(emulation_rows(rows)), "```", "",
        "## Every other figure (reported, not judged: 2 %)", "", "```",
        render([r for r in rows if not r.research]), "```", "",
    ]
    return "\n".join(lines)


def replicate(root: Path, fraction: float = PERTURBATION, workdir: Path | None = None, keep: bool = False,
              env: dict | None = None) -> tuple[list[Row], float, list[str]]:
    """Run the replicate; return (rows as verify compares them, wall seconds, stages rerun)."""
    root = root.resolve()
    env = dict(os.environ if env is None else env)
    check_workspace(root, env)
    made = workdir is None
    scratch = Path(tempfile.mkdtemp(prefix="lookahead-replicate-")) if made else workdir.resolve()
    if not made:
        if scratch.exists() and any(scratch.iterdir()):
            raise ReplicateError(f"--workdir {scratch} is not empty")
        scratch.mkdir(parents=True, exist_ok=True)
    if scratch == root or root in scratch.parents:
        raise ReplicateError(f"the scratch copy {scratch} must lie outside the workspace {root}")
    try:
        stages = scratch_copy(root, scratch, fraction)
        print(f"replicate: {scratch}; rerunning {', '.join(stages)} with base.init_perturbation {fraction:g}",
              file=sys.stderr, flush=True)
        env.update({"MLFLOW_TRACKING_URI": f"sqlite:///{scratch / 'mlflow.db'}",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(scratch / "src"), env.get("PYTHONPATH")]))})
        env.pop("DVC_EXP_NAME", None)
        start = time.perf_counter()
        _run([*DVC, "repro", "--no-commit"], scratch, env)
        wall = time.perf_counter() - start
        return verify(scratch, "HEAD", against=root), wall, stages
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--perturbation", type=float, default=PERTURBATION,
                        help=f"share of the base's initial weights moved one ulp (default {PERTURBATION:g})")
    parser.add_argument("--repo", type=Path, default=Path.cwd(), help="the workspace (default: here)")
    parser.add_argument("--workdir", type=Path, default=None, help="an empty folder for the scratch copy (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copy (it is printed)")
    parser.add_argument("--report", type=Path, default=None, help="also write the table as markdown to this file")
    args = parser.parse_args(argv)
    if not 0 < args.perturbation < 1:
        parser.error("--perturbation must be in (0, 1)")
    try:
        rows, wall, stages = replicate(args.repo, args.perturbation, args.workdir, args.keep)
    except ReplicateError as err:
        print(f"replicate: {err}", file=sys.stderr)
        return 2
    text = report_text(rows, args.perturbation, wall, stages)
    print(text)
    if args.report is not None:
        from lookahead.core.atomic import atomic_file

        with atomic_file(args.report) as tmp:
            Path(tmp).write_text(text, encoding="utf-8")
    s = summary(rows)
    return 1 if s["claims_failed"] or s["research_outside"] else 0


if __name__ == "__main__":
    sys.exit(main())
