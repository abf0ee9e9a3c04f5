"""Studies made of DVC experiments (``make head-scaling``, ``make bases``): run a chain of stages as a
named experiment in a temporary directory, read back what it wrote, commit what a study keeps.

An experiment runs as ``dvc exp run --temp -n <name> -S key=value … [targets]``. Its refs live in
this clone only and its outputs in this clone's DVC cache, which git does not carry: a study
commits each piece's figures to git as it finishes. An interrupted experiment is run again under the
same name: the stages it finished come back from DVC's run cache (no ``--force`` unless asked), so it
resumes at the stage it was in. Stage times come from the MLflow runs the stages log
(:mod:`lookahead.core.tracking`), grouped by the experiment's name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


DVC = [sys.executable, "-m", "dvc"]  # the DVC of this environment, whatever PATH holds (make runs without the venv on it)


class StudyError(RuntimeError):
    """A study cannot go on: a command failed, or an experiment left nothing to read."""


def sh(*argv: str, cwd: str | Path | None = None) -> str:
    """A command's stdout; :class:`StudyError` with its stderr where it fails."""
    proc = subprocess.run(argv, text=True, capture_output=True, cwd=cwd)
    if proc.returncode != 0:
        raise StudyError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr.strip()[-2000:]}")
    return proc.stdout


def experiment_rev(name: str) -> str | None:
    """The newest experiment commit named ``name`` in this clone (DVC writes it when the experiment
    succeeds), or None."""
    refs = sh("git", "for-each-ref", "--sort=-committerdate", "--format=%(objectname) %(refname)", "refs/exps")
    for line in refs.splitlines():
        sha, ref = line.split(" ", 1)
        if ref.rsplit("/", 1)[-1] == name:
            return sha
    return None


def run_experiment(name: str, overrides: dict, log_dir: Path, targets: tuple[str, ...] = (),
                   rerun: bool = False, tag: str = "study") -> tuple[str, dict[str, float]]:
    """The experiment ``name`` (params ``overrides``, stages ``targets``; none: every stage): its
    commit and each stage's seconds. An experiment of that name already in this clone (one that
    succeeded: its figures not yet collected) is used as it is, unless ``rerun``."""
    rev = None if rerun else experiment_rev(name)
    if rev is not None:
        print(f"[{tag}] experiment {name} found ({rev[:12]}): collecting it", flush=True)
        return rev, stage_seconds(name)
    log_dir.mkdir(parents=True, exist_ok=True)
    # a bool as YAML writes it (DVC parses each value as YAML)
    sets = [arg for key, value in overrides.items()
            for arg in ("-S", f"{key}={str(value).lower() if isinstance(value, bool) else value}")]
    # no -f unless rerun: -f (--force) reruns every stage, where a resumed or partial run (an
    # interrupted experiment's finished stages) should come back from DVC's run cache
    cmd = [*DVC, "exp", "run", "--temp", *(["-f"] if rerun else []), "-n", name, *sets, *targets]
    log = log_dir / f"{name}.log"
    print(f"[{tag}] {' '.join(cmd)}  (log: {log})", flush=True)
    with open(log, "w", encoding="utf-8") as out:
        if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
            raise StudyError(f"experiment {name} failed: see {log}")
    rev = experiment_rev(name)
    if rev is None:
        raise StudyError(f"experiment {name} ran but no experiment ref holds it: see {log}")
    return rev, stage_seconds(name)


def stage_seconds(experiment: str) -> dict[str, float]:
    """Each stage's wall seconds in the experiment, from the MLflow runs its stages logged (the
    project's store: the stage's work, without interpreter start-up); a stage restored from DVC's
    run cache logs none and is left out. The newest finished run per stage."""
    from mlflow.tracking import MlflowClient

    from lookahead.core.tracking import TAG_PIPELINE, TAG_ROLE, TAG_STAGE, tracking_uri

    client = MlflowClient(tracking_uri=tracking_uri(Path.cwd()))
    found = client.get_experiment_by_name(os.environ.get("MLFLOW_EXPERIMENT_NAME", "lookahead"))
    if found is None:
        return {}
    runs = client.search_runs([found.experiment_id], max_results=1000, order_by=["attributes.start_time ASC"],
                              filter_string=f"tags.`{TAG_PIPELINE}` = '{experiment}' and tags.`{TAG_ROLE}` = 'stage' "
                                            "and attributes.status = 'FINISHED'")
    return {run.data.tags[TAG_STAGE]: round((run.info.end_time - run.info.start_time) / 1000, 1) for run in runs}


def read_json(rev: str | None, path: str) -> dict:
    """A JSON file of the workspace (rev None) or of an experiment commit, in git or DVC's cache."""
    if rev is None:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    from dvc.api import DVCFileSystem

    return json.loads(DVCFileSystem(".", rev=rev).read_text(path, encoding="utf-8"))


def output_file(rev: str | None, path: str, tmp: Path) -> Path:
    """A DVC-tracked file of the workspace (rev None) or of an experiment commit, as a local path."""
    if rev is None:
        return Path(path)
    import dvc.api

    local = tmp / Path(path).name
    with dvc.api.open(path, rev=rev, mode="rb") as src:
        local.write_bytes(src.read())
    return local


def read_params(rev: str | None) -> dict:
    """``params.yaml`` of the workspace (rev None) or of an experiment commit."""
    import yaml

    return yaml.safe_load(Path("params.yaml").read_text(encoding="utf-8") if rev is None
                          else sh("git", "show", f"{rev}:params.yaml"))


def commit(paths: list[Path], message: str) -> None:
    """Commit ``paths`` (and nothing else staged) with ``message``."""
    sh("git", "add", *map(str, paths))
    sh("git", "commit", "-q", "-m", message, "--", *map(str, paths))


def fail(error: Exception) -> None:
    """End a study's command line with the error's message (exit 1)."""
    sys.exit(f"error: {error}")
