"""MLflow tracking: one parent run per pipeline run, one child run per stage (docs/tracking.md).

- Store: ``MLFLOW_TRACKING_URI`` when set; else a SQLite file ``mlflow.db`` at the project root,
  addressed by an absolute URI. Inside a DVC experiment workspace (``.dvc/tmp/exps/<tmp>/`` of
  ``dvc exp run --temp``/``--queue``) the project root is the repository that owns that
  workspace, so queued experiments land in the same store as ``dvc repro``.
- Experiment: ``lookahead`` (``MLFLOW_EXPERIMENT_NAME`` overrides).
- Pipeline id: ``DVC_EXP_NAME`` inside ``dvc exp run``; else the git revision plus a hash of
  params.yaml. Stages of one pipeline run attach to the parent run carrying that id.
- Params are logged prefixed by the stage name; a tracking failure warns and never fails a stage.
- Under ``accelerate launch`` only the main process (``RANK`` 0) opens runs.
- ``LOOKAHEAD_TRACKING=off``: no run at all, and MLflow is not imported (about 2 s of a stage's
  start-up on 2 cores: ``benchmarks/stage_overhead.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lookahead.core.config import flatten
from lookahead.core.environment import as_tags, environment
from lookahead.core.paths import project_root

# MLflow must work offline: no telemetry, no pip look-ups.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_SKIP_PIP_REQUIREMENTS_CHECK", "true")

EXPERIMENT = "lookahead"
TAG_PIPELINE = "lookahead.pipeline_id"
TAG_ROLE = "lookahead.role"
TAG_STAGE = "lookahead.stage"
TAG_FAILED = "lookahead.failed_stages"
EXP_WORKSPACE = os.path.join(".dvc", "tmp", "exps")
SWITCH = "LOOKAHEAD_TRACKING"  # "off": stages run untracked, without importing MLflow


def home_root(root: str | Path) -> Path:
    """The repository that owns ``root``: itself, or the repo above a DVC experiment workspace."""
    root = Path(root).resolve()
    text = str(root)
    marker = os.sep + EXP_WORKSPACE + os.sep
    if marker in text + os.sep:
        return Path(text[: (text + os.sep).index(marker)])
    return root


def tracking_uri(root: str | Path) -> str:
    """``MLFLOW_TRACKING_URI`` or the absolute SQLite URI of the project's local store."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return f"sqlite:///{home_root(root) / 'mlflow.db'}"


def pipeline_id(root: str | Path, params_file: str | Path = "params.yaml") -> str:
    """``DVC_EXP_NAME``, or ``<git revision>-<params hash>`` grouping the stages of one run."""
    exp = os.environ.get("DVC_EXP_NAME")
    if exp:
        return exp
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, timeout=30
        ).stdout.strip() or "norev"
    except (OSError, subprocess.SubprocessError):
        rev = "norev"
    params = Path(root) / params_file
    digest = hashlib.sha256(params.read_bytes()).hexdigest()[:10] if params.is_file() else "noparams"
    return f"{rev}-{digest}"


@contextlib.contextmanager
def _interrupt_deferred() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) that arrives inside the block until the block ends, then raise it.

    A KeyboardInterrupt inside an MLflow client call stops the SQL store mid-transaction: the
    database stays locked for this process, and the stage's run can no longer be marked FAILED.
    Only the main thread may set a handler; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield  # (None: a handler set outside Python, which Python cannot put back)
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(signal.SIGINT, None)  # Python's default handler raises KeyboardInterrupt
            elif previous == signal.SIG_DFL:
                os.kill(os.getpid(), signal.SIGINT)


class StageRun:
    """A child MLflow run for one stage. Every method warns instead of raising."""

    def __init__(self, client, run_id: str | None, stage: str):
        self._client = client
        self.run_id = run_id
        self.stage = stage

    @property
    def active(self) -> bool:
        return self.run_id is not None

    def _safely(self, what: str, call) -> None:
        """Run ``call()`` (a client call) if tracking is active; on failure warn and go inactive."""
        if not self.active:
            return
        try:
            with _interrupt_deferred():
                call()
        except Exception as err:  # tracking must never fail a stage (docs/tracking.md)
            warnings.warn(f"MLflow {what} failed for stage {self.stage!r}: {err}; tracking disabled for this stage", stacklevel=3)
            self.run_id = None

    def log_params(self, params: dict[str, Any]) -> None:
        """Log ``{section: config}`` as ``<stage>/<section>.<key>`` (MLflow refuses to change a
        logged param, so each stage's keys stay its own)."""
        if not self.active:
            return
        from mlflow.entities import Param

        flat = flatten(params)
        batch = [Param(f"{self.stage}/{k}", str(v)[:6000]) for k, v in flat.items()]
        for i in range(0, len(batch), 100):
            chunk = batch[i : i + 100]
            self._safely("log_params", lambda: self._client.log_batch(self.run_id, params=chunk))

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Log every number in a nested dict of figures: ``a.b`` keys; a list of numbers (or of
        dicts of numbers) as a step series over its index; strings are left to the report artifact."""
        if not self.active:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, v, now, s) for k, v, s in _numbers(metrics, step or 0)]
        for i in range(0, len(items), 1000):  # MLflow takes at most 1000 metrics per batch
            chunk = items[i : i + 1000]
            self._safely("log_metrics", lambda: self._client.log_batch(self.run_id, metrics=chunk))

    def log_artifact(self, path: str | Path) -> None:
        if Path(path).exists():
            self._safely("log_artifact", lambda: self._client.log_artifact(self.run_id, str(path)))

    def set_tag(self, key: str, value: str) -> None:
        self._safely("set_tag", lambda: self._client.set_tag(self.run_id, key, value))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _metric_key(name: str) -> str:
    """MLflow allows letters, digits, ``_ - . / :`` and spaces in metric names."""
    return re.sub(r"[^\w\-./: ]", "_", name)[:250]


def _numbers(figures: dict[str, Any], step: int, prefix: str = "") -> Iterator[tuple[str, float, int]]:
    """``(key, value, step)`` for every number of a nested dict; lists become series over their index."""
    for key, value in figures.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            yield from _numbers(value, step, name)
        elif _is_number(value):
            yield _metric_key(name), float(value), step
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                if _is_number(item):
                    yield _metric_key(name), float(item), index
                elif isinstance(item, dict):
                    yield from _numbers(item, index, name)
                elif isinstance(item, (list, tuple)):
                    yield from _numbers({str(index): item}, step, name)


def _experiment_id(client, root: Path, uri: str) -> str:
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME", EXPERIMENT)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    # With the local store, keep artifacts beside it (a relative default would land in DVC's temp
    # experiment workspace and be lost with it); a server decides for itself.
    location = (home_root(root) / "mlartifacts").as_uri() if uri.startswith("sqlite:") else None
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:
        exp = client.get_experiment_by_name(name)  # created concurrently by a parallel stage
        if exp is None:
            raise
        return exp.experiment_id


def _parent_run(client, experiment_id: str, pid: str) -> str:
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{TAG_PIPELINE}` = '{pid}' and tags.`{TAG_ROLE}` = 'pipeline'",
        max_results=1,
    )
    if runs:
        return runs[0].info.run_id
    run = client.create_run(
        experiment_id, run_name=f"pipeline {pid}", tags={TAG_PIPELINE: pid, TAG_ROLE: "pipeline"}
    )
    return run.info.run_id


def tracking_on() -> bool:
    """False where ``LOOKAHEAD_TRACKING`` is ``off`` (any other value, or none: on)."""
    return os.environ.get(SWITCH, "on").strip().lower() != "off"


def is_main_process() -> bool:
    """False in the worker processes of a multi-process launch (``accelerate launch`` and torchrun
    set ``RANK``): the main process alone tracks a stage."""
    return int(os.environ.get("RANK", "0")) == 0


@contextlib.contextmanager
def stage_run(stage: str, config: dict[str, Any], root: str | Path | None = None) -> Iterator[StageRun]:
    """Open the stage's child run under its pipeline's parent run; yields a :class:`StageRun`.

    The child ends FINISHED, or FAILED if the block raises (the exception propagates). In a
    worker process of a multi-process launch, or with tracking off (``LOOKAHEAD_TRACKING=off``), it
    yields an inactive run.
    """
    if not is_main_process() or not tracking_on():
        yield StageRun(None, None, stage)
        return
    root = Path(root) if root else project_root()
    client = run = None
    try:
        from mlflow.tracking import MlflowClient

        with _interrupt_deferred():  # a run half-created by Ctrl-C would stay RUNNING
            uri = tracking_uri(root)
            client = MlflowClient(tracking_uri=uri)
            experiment_id = _experiment_id(client, root, uri)
            pid = pipeline_id(root)
            parent = _parent_run(client, experiment_id, pid)
            run = client.create_run(
                experiment_id,
                run_name=stage,
                tags={
                    "mlflow.parentRunId": parent,
                    TAG_PIPELINE: pid,
                    TAG_ROLE: "stage",
                    TAG_STAGE: stage,
                    "dvc.exp_name": os.environ.get("DVC_EXP_NAME", ""),
                    **as_tags(environment()),  # the library versions and the CPU the floats depend on
                },
            )
    except KeyboardInterrupt:  # held until the run existed: close it before stopping
        if run is not None:
            StageRun(client, run.info.run_id, stage)._safely("set_terminated", lambda: client.set_terminated(run.info.run_id, "FAILED"))
        raise
    except Exception as err:
        warnings.warn(f"MLflow tracking unavailable for stage {stage!r}: {err}; the stage runs untracked", stacklevel=3)
    tracker = StageRun(client, run.info.run_id if run else None, stage)
    parent_run = StageRun(client, parent if run else None, "pipeline")
    tracker.log_params(config)
    status = "FAILED"
    try:
        yield tracker
        status = "FINISHED"
    finally:
        tracker._safely("set_terminated", lambda: client.set_terminated(tracker.run_id, status))
        parent_run._safely("set_terminated", lambda: _close_parent(client, parent_run.run_id, stage, status == "FAILED"))


def _close_parent(client, parent_id: str, stage: str, failed: bool) -> None:
    """The parent run is FAILED while any of its stages' latest run failed (tag
    ``lookahead.failed_stages``), even when a later stage succeeds; rerunning the failed stage
    successfully clears it."""
    tags = client.get_run(parent_id).data.tags
    failed_stages = {s for s in tags.get(TAG_FAILED, "").split(",") if s}
    failed_stages = failed_stages | {stage} if failed else failed_stages - {stage}
    client.set_tag(parent_id, TAG_FAILED, ",".join(sorted(failed_stages)))
    client.set_terminated(parent_id, "FAILED" if failed_stages else "FINISHED")
