"""The reliability suite (issue 17): faults injected into the tiny pipeline, each checked to end with
nothing lost and, where it stops a command, an error that names the file or key and the fix.

The repository tests start from `reproduced` (tests/conftest.py): one copy per session of a tiny
pipeline run, whose dvc.lock records the outputs of runs never interrupted; each test leaves it as
it found it. Their wider sweep (every training
stage, both signals, several points, the default profile's keys) is `benchmarks/faults.py`.
"""

from __future__ import annotations

from pathlib import Path

from mlflow.tracking import MlflowClient

from tests.conftest import lock_outs, sh  # noqa: F401  (lock_outs: used by the fault modules)


def data_outs(outs: dict[str, str], stage_prefixes: tuple[str, ...]) -> dict[str, str]:
    """The model and data outputs among ``outs`` under the given paths (metrics hold timings)."""
    return {p: md5 for p, md5 in outs.items() if p.startswith(stage_prefixes)}


def assert_up_to_date(repo: Path, env: dict) -> None:
    out = sh(["dvc", "status"], repo, env)
    assert "Data and pipelines are up to date" in out, out


def latest_stage_run(repo: Path, stage: str):
    """The newest MLflow child run of ``stage`` in ``repo``'s local store."""
    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("lookahead")
    (run,) = client.search_runs([experiment.experiment_id], filter_string=f"tags.`lookahead.stage` = '{stage}'",
                                order_by=["attributes.start_time DESC"], max_results=1)
    return run
