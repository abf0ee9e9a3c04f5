"""Every stage of a profile in its own lasting workspace, resumable across sessions (``make smollm2-run``).

    python -m lookahead.tools.profile_run profiles/smollm2-135m.yaml --commit   # run or resume every stage
    python -m lookahead.tools.profile_run profiles/smollm2-135m.yaml --until oracle
    python -m lookahead.tools.profile_run profiles/smollm2-135m.yaml --plan     # what is done, what is left

A run of a pretrained LM takes longer than one sitting. ``dvc exp run --temp`` (the studies') throws
its directory away when it stops, and with it the checkpoints a cut-off stage resumes from, so a
profile runs in ``runs/<profile>/`` instead (git- and DVC-ignored): this checkout's tracked files
with the profile as ``params.yaml``, and its own DVC cache, lock, ``checkpoints/`` and MLflow store.

Each call first syncs the code: every tracked file but ``params.yaml``, ``dvc.lock`` and the outputs
(``data/``, ``models/``, ``metrics/``), so the run is of this checkout's code; stages then run one at a
time in ``dvc.yaml``'s order with ``dvc repro``. DVC decides what runs: a stage already done is up to
date (or comes back from the run cache), one whose code or params changed runs again, and one cut
off mid-way resumes from its checkpoints (the oracle's windows, the static search's steps, the
trainers' steps) and writes the same bytes as an uncut run.

What each stage leaves is kept in git as it finishes (``--commit``), as ``make bases`` does, since no
DVC cache travels with a clone: ``metrics/<profile>/<stage>*.json`` (its headline, ``_sd``, ``_ci`` and
report) and ``metrics/<profile>/run.json``: each stage's wall seconds on this machine, summed over the
calls that ran it (a call cut off counts up to its last heartbeat, a minute at most before the cut),
and the code revision it finished at. Once the scoring stages have run, the claims are collected as
``make bases`` collects one base (:func:`collect`): ``windows.json`` (every score file's per-window
means and the stages' headlines), ``report.json`` (each claim's figure, interval and verdict, over the
seeds and the test windows of this one pretrained LM) and ``headline.json`` (the claims in short).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from lookahead.core.atomic import atomic_file
from lookahead.tools.experiments import StudyError, commit, fail, sh

RUNS = Path("runs")
OUTPUTS = ("data/", "models/", "metrics/", "checkpoints/", "runs/", "logs/")
"""Paths of a workspace that are the run's own, never synced from the checkout."""
OWN = ("params.yaml", "dvc.lock")
HEARTBEAT_S = 60.0
HEADLINE_SUFFIXES = ("", "_sd", "_ci", "_report")


def stage_names(dvc_yaml: Path) -> list[str]:
    """The stages of ``dvc.yaml`` in file order (the pipeline's order: each after what it reads)."""
    return list(yaml.safe_load(dvc_yaml.read_text(encoding="utf-8"))["stages"])


def source_files(project: Path) -> list[str]:
    """The checkout's tracked and unignored files a workspace mirrors."""
    out = sh("git", "ls-files", "--cached", "--others", "--exclude-standard", cwd=project).split("\n")
    return [n for n in out if n and not n.startswith(OUTPUTS) and n not in OWN and (project / n).is_file()]


def run_env(work: Path) -> dict[str, str]:
    """The environment stages run in: this interpreter's python and dvc, the workspace's own code
    first on the import path (the code its lock hashes), nothing of the caller's MLflow or DVC settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(work.resolve() / "src")
    env["DVC_NO_ANALYTICS"] = "true"
    return env


def sync(project: Path, work: Path, params: bytes) -> list[str]:
    """Make ``work`` hold ``project``'s code and ``params`` as params.yaml (created where missing, with
    its own git and DVC repository); the files it changed."""
    fresh = not (work / ".dvc").is_dir()
    work.mkdir(parents=True, exist_ok=True)
    wanted = source_files(project)
    changed = []
    for name in wanted:
        src, dst = project / name, work / name
        if not dst.is_file() or dst.read_bytes() != src.read_bytes():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
            changed.append(name)
    if not fresh:  # files the checkout no longer has (a stale file would change a directory dep's hash)
        have = set(wanted)
        for name in sh("git", "ls-files", cwd=work).split("\n"):
            if name and name not in have and not name.startswith(OUTPUTS) and name not in OWN:
                (work / name).unlink(missing_ok=True)
                changed.append(name)
    if not (work / "params.yaml").is_file() or (work / "params.yaml").read_bytes() != params:
        (work / "params.yaml").write_bytes(params)
        changed.append("params.yaml")
    env = run_env(work)
    if fresh:
        for cmd in (["git", "init", "-q"], ["git", "config", "user.email", "run@localhost"],
                    ["git", "config", "user.name", "profile run"]):
            subprocess.run(cmd, cwd=work, env=env, check=True)
    if changed:
        # the changed files by name: an exclude pathspec naming an ignored directory that exists (logs/)
        # makes git add fail
        subprocess.run(["git", "add", "-A", "--pathspec-from-file=-"], input="\n".join(changed), text=True,
                       cwd=work, env=env, check=True)
        subprocess.run(["git", "commit", "-qm", f"sync from {revision(project)}"], cwd=work, env=env, check=True)
    return changed


def revision(project: Path) -> str:
    """The checkout's commit (12 digits), ``+`` where its tracked files differ from it."""
    rev = sh("git", "rev-parse", "HEAD", cwd=project).strip()[:12]
    dirty = sh("git", "status", "--porcelain", "--untracked-files=no", cwd=project).strip()
    return rev + ("+" if dirty else "")


def up_to_date(work: Path, stage: str, env: dict) -> bool:
    """Whether DVC would skip ``stage`` (its deps, params, command and outputs as its lock says)."""
    proc = subprocess.run([sys.executable, "-m", "dvc", "status", "--json", stage], cwd=work, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise StudyError(f"dvc status {stage} failed in {work}:\n{proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout or "{}") == {}


class Record:
    """``metrics/<profile>/run.json``: each stage's seconds, calls and state; a heartbeat file in the
    workspace carries a running stage's seconds over to the next call when this one is cut off (counted
    in ``seconds`` and apart in ``cut_seconds``: a stage without checkpoints redoes that work)."""

    def __init__(self, path: Path, work: Path, profile: Path, order: list[str]):
        self.path, self.beat, self.order = path, work / ".stage_heartbeat.json", order
        self.data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        self.data.setdefault("profile", profile.as_posix())
        self.data.setdefault("stages", {})
        if self.beat.is_file():  # a stage the last call was running when it was cut off
            beat = json.loads(self.beat.read_text(encoding="utf-8"))
            entry = self.stage(beat["stage"])
            entry["seconds"] = round(entry["seconds"] + beat["seconds"], 1)
            # work redone where no checkpoint held it
            entry["cut_seconds"] = round(entry.get("cut_seconds", 0.0) + beat["seconds"], 1)
            entry["calls"] += 1
            self.beat.unlink()
            self.save()

    def stage(self, name: str) -> dict:
        return self.data["stages"].setdefault(name, {"seconds": 0.0, "calls": 0, "done": False})

    def save(self) -> None:
        """The record, its stages in the pipeline's order."""
        stages = self.data["stages"]
        self.data["stages"] = {s: stages[s] for s in sorted(stages, key=lambda s: (s not in self.order,
                                                                                  self.order.index(s) if s in self.order else 0, s))}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(self.path) as tmp:
            tmp.write_text(json.dumps(self.data, indent=1) + "\n", encoding="utf-8")

    def run(self, name: str, argv: list[str], cwd: Path, env: dict, log: Path) -> float:
        """Run ``argv`` for stage ``name``, its output to ``log``; its seconds (the heartbeat keeps them
        if this process is killed first)."""
        start, done = time.monotonic(), threading.Event()

        def beat() -> None:
            while not done.wait(HEARTBEAT_S):
                self.beat.write_text(json.dumps({"stage": name, "seconds": round(time.monotonic() - start, 1)}))

        thread = threading.Thread(target=beat, daemon=True)
        thread.start()
        log.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(log, "a", encoding="utf-8") as out:
                code = subprocess.run(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
        finally:
            done.set()
            thread.join()
            self.beat.unlink(missing_ok=True)
        seconds = time.monotonic() - start
        entry = self.stage(name)
        entry["seconds"] = round(entry["seconds"] + seconds, 1)
        entry["calls"] += 1
        if code != 0:
            self.save()
            raise StudyError(f"stage {name} failed ({code}) after {seconds:.0f} s: see {log}")
        return seconds


def logged_seconds(work: Path, stage: str) -> float | None:
    """The wall seconds of the newest finished run of ``stage`` in the workspace's MLflow store (a
    stage run before this driver timed it), or None."""
    if not (work / "mlflow.db").is_file():
        return None
    from mlflow.tracking import MlflowClient

    from lookahead.core.tracking import TAG_ROLE, TAG_STAGE

    client = MlflowClient(tracking_uri=f"sqlite:///{(work / 'mlflow.db').resolve()}")
    ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(ids, max_results=1, order_by=["attributes.start_time DESC"],
                              filter_string=f"tags.`{TAG_STAGE}` = '{stage}' and tags.`{TAG_ROLE}` = 'stage' "
                                            "and attributes.status = 'FINISHED'") if ids else []
    return round((runs[0].info.end_time - runs[0].info.start_time) / 1000, 1) if runs else None


def keep_figures(work: Path, stage: str, dest: Path) -> list[Path]:
    """Copy the stage's headline files (``metrics/<stage>.json``, ``_sd``, ``_ci``, ``_report``) and its
    Pareto rows (``<stage>_pareto.csv``: phase 1's static curve is the redundancy curve) to ``dest``."""
    kept = []
    for name in [f"{stage}{suffix}.json" for suffix in HEADLINE_SUFFIXES] + [f"{stage}_pareto.csv"]:
        src = work / "metrics" / name
        if src.is_file():
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest / src.name)
            kept.append(dest / src.name)
    return kept


SCORED = ("phase1", "phase2", "control", "static_control")
"""The scoring stages' score files (``data/val_nll/<name>.safetensors``) the claims read."""
HEADLINE_KEYS = ("mean", "ci_low", "ci_high")
"""A claim's figures in the headline (its sd, verdict and the rest in the report)."""


def collect(work: Path, dest: Path, seconds: dict[str, float]) -> list[Path]:
    """The claims of the run in ``work`` (:mod:`lookahead.tools.bases`' tables of one base: each claim's
    per-window differences over the seeds and test windows, its interval and verdict) written to
    ``dest``: ``windows.json``, ``report.json`` and ``headline.json``; the files written (none before
    every score file exists)."""
    from lookahead.artifacts.val_scores import scoring_from_params
    from lookahead.core.report import write_metrics
    from lookahead.tools.bases import base_record, tables, write_record

    if not all((work / "data" / "val_nll" / f"{name}.safetensors").is_file() for name in SCORED):
        return []
    cwd = Path.cwd()
    try:
        os.chdir(work)  # the record reads the workspace's outputs, as bases reads its workspace's
        record = base_record(0, None, seconds)
        params = yaml.safe_load(Path("params.yaml").read_text(encoding="utf-8"))
    finally:
        os.chdir(cwd)
    record["model"] = params["base"]["model"]
    report = tables([record], scoring_from_params(params))
    dest.mkdir(parents=True, exist_ok=True)
    write_record(dest / "windows.json", record)
    keys = {"window_set": ("window_set",)}  # each claim: its figure and interval over this LM's seeds and windows
    for name in report["claims"]:
        keys.update({f"{name}{'' if k == 'mean' else '_' + k}": ("claims", name, "per_base", "0", k)
                     for k in HEADLINE_KEYS})
    write_metrics(report, keys, dest / "headline.json", dest / "report.json")
    (dest / "headline_timing.json").unlink(missing_ok=True)  # no timings: the stage seconds are in run.json
    return sorted(p for p in dest.glob("headline*.json")) + [dest / "windows.json", dest / "report.json"]


def render_results(project: Path) -> list[Path]:
    """The results page, README's summary and the pretrained LM's research page rendered afresh (``make
    results``: their sections on the pretrained LM read what this run committed); the files, or none in a
    project without the results page."""
    from lookahead.tools.results import PAGE, main as results
    from lookahead.tools.results_pretrained import PAGE as RESEARCH

    if not (project / PAGE).is_file():
        return []
    with contextlib.redirect_stdout(io.StringIO()):
        if results(["--repo", str(project)]) != 0:
            raise StudyError("the results page could not be rendered: run `make results` to see why")
    return [PAGE, Path("README.md")] + ([RESEARCH] if (project / RESEARCH).is_file() else [])


def cell_params(profile: Path, sets: list[str]) -> bytes:
    """The profile with ``key.path=value`` overrides (values read as YAML), as params.yaml bytes."""
    params = yaml.safe_load(profile.read_text(encoding="utf-8"))
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise StudyError(f"--set {item!r}: not key=value")
        node, *path = key.split(".")
        section = params
        for part in [node, *path][:-1]:
            if not isinstance(section.get(part), dict):
                raise StudyError(f"--set {item!r}: the profile has no section {part!r}")
            section = section[part]
        if key.split(".")[-1] not in section:
            raise StudyError(f"--set {item!r}: the profile has no key {key!r}")
        section[key.split(".")[-1]] = yaml.safe_load(value)
    return yaml.safe_dump(params, sort_keys=False).encode()


def start_cell(work: Path, source: Path, cache: Path, before: list[str], env: dict) -> None:
    """A cell's workspace starts from ``source``'s run: its lock, and the outputs of the stages
    ``before`` its own checked out of the main run's DVC ``cache`` (shared, not copied)."""
    if (work / "dvc.lock").is_file():
        return
    if not (source / "dvc.lock").is_file():
        raise StudyError(f"a cell starts from a run's outputs: {source} has none yet (run it first)")
    subprocess.run([sys.executable, "-m", "dvc", "config", "--local", "cache.dir", str(cache.resolve())], cwd=work,
                   env=env, check=True, capture_output=True)
    shutil.copyfile(source / "dvc.lock", work / "dvc.lock")
    proc = subprocess.run([sys.executable, "-m", "dvc", "checkout", *before], cwd=work, env=env, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise StudyError(f"dvc checkout in {work} failed (has {source} run the stages before the cell's?):\n"
                         f"{proc.stderr.strip()[-2000:]}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", type=Path, help="a parameter set, e.g. profiles/smollm2-135m.yaml")
    parser.add_argument("--until", help="the last stage to run (default: every stage)")
    parser.add_argument("--plan", action="store_true", help="print each stage's state and seconds, run nothing")
    parser.add_argument("--commit", action="store_true", help="git-commit each stage's figures as it finishes")
    parser.add_argument("--workspace", type=Path, help="the run's directory (default runs/<profile name>)")
    parser.add_argument("--metrics", type=Path, help="where its figures are kept (default metrics/<profile name>)")
    parser.add_argument("--cell", help="a cell of the study: the profile with --set overrides, only --stages rerun "
                                       "(dvc repro -s) from the main run's outputs, in runs/<profile>-<cell>/")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a cell's override (repeatable)")
    parser.add_argument("--stages", help="a cell's stages, comma-separated, in order")
    parser.add_argument("--after", help="the cell whose outputs this cell starts from (default: the main run)")
    args = parser.parse_args(argv)
    project = Path.cwd()
    if not (project / "dvc.yaml").is_file():
        parser.error("run from the repository root (dvc.yaml not found)")
    if not args.profile.is_file():
        parser.error(f"no profile {args.profile}")
    stages = stage_names(project / "dvc.yaml")
    if args.until is not None and args.until not in stages:
        parser.error(f"--until {args.until!r}: no such stage (stages: {', '.join(stages)})")
    name = args.profile.stem
    work = args.workspace or RUNS / name
    dest = args.metrics or Path("metrics") / name
    # the profile's parameters are checked before any work, as a stage would
    sh(sys.executable, "-m", "lookahead.tools.params", str(args.profile))
    params = args.profile.read_bytes()
    cell_stages = None
    if args.cell is not None:
        if not args.stages:
            parser.error("--cell needs --stages")
        cell_stages = [s.strip() for s in args.stages.split(",") if s.strip()]
        unknown = [s for s in cell_stages if s not in stages]
        if unknown:
            parser.error(f"--stages: no such stage {', '.join(unknown)}")
        try:
            params = cell_params(args.profile, args.set)
        except StudyError as error:
            parser.error(str(error))
        with tempfile.TemporaryDirectory() as tmp:  # the cell's params checked before any work
            (Path(tmp) / "params.yaml").write_bytes(params)
            sh(sys.executable, "-m", "lookahead.tools.params", str(Path(tmp) / "params.yaml"))
        main_work, work = work, RUNS / f"{name}-{args.cell}"
        source = main_work if args.after is None else RUNS / f"{name}-{args.after}"
        dest = dest / "cells" / args.cell
        name = f"{name} cell {args.cell}"
    elif args.set or args.stages or args.after:
        parser.error("--set, --stages and --after go with --cell")
    record = Record(dest / "run.json", work, args.profile, stages)
    if args.plan:
        for stage in stages:
            entry = record.data["stages"].get(stage)
            state = ("done" if entry["done"] else "started") if entry else "to run"
            print(f"{stage:18s} {state:8s} {entry['seconds'] if entry else 0:9.0f} s")
        return
    changed = sync(project, work, params)
    rev = revision(project)
    print(f"[run] {work}: the code of {rev}" + (f" ({len(changed)} files synced)" if changed else ""), flush=True)
    env = run_env(work)
    todo = stages[: stages.index(args.until) + 1 if args.until else None]
    if cell_stages is not None:
        start_cell(work, source, main_work / ".dvc" / "cache", stages[: stages.index(cell_stages[0])], env)
        todo = cell_stages
    for stage in todo:
        entry = record.stage(stage)
        if up_to_date(work, stage, env):
            status = "up to date"
        else:
            print(f"[run] {stage}: running (log: {work / 'logs' / (stage + '.log')})", flush=True)
            single = ["-s"] if cell_stages is not None else []  # a cell reruns its stages alone
            seconds = record.run(stage, [sys.executable, "-m", "dvc", "repro", *single, stage], work, env,
                                 work / "logs" / f"{stage}.log")
            status = f"{seconds:.0f} s"
        if status == "up to date" and entry["calls"] == 0 and not entry.get("logged"):  # done before this driver ran
            entry.update(seconds=logged_seconds(work, stage) or 0.0, logged=True)
        entry.update(done=True, code=entry.get("code", rev) if status == "up to date" else rev)
        record.save()
        kept = [record.path, *keep_figures(work, stage, dest)]
        kept += render_results(project)
        print(f"[run] {stage}: {status}, {entry['seconds']:.0f} s in all", flush=True)
        if args.commit and sh("git", "status", "--porcelain", "--", *map(str, kept)).strip():
            commit(kept, f"{name}: stage {stage} ({entry['seconds']:.0f} s on this machine)")
    if cell_stages is not None:
        return
    collected = collect(work, dest, {s: e["seconds"] for s, e in record.data["stages"].items()})
    if collected:
        collected += render_results(project)
        print(f"[run] claims: {dest / 'headline.json'}, {dest / 'report.json'}", flush=True)
        if args.commit and sh("git", "status", "--porcelain", "--", *map(str, collected)).strip():
            commit(collected, f"{name}: the claims, from its per-window test NLLs")


if __name__ == "__main__":
    try:
        main()
    except StudyError as error:
        fail(error)
