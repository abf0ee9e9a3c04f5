"""Kills: `dvc repro` of a training stage interrupted (SIGKILL of the whole process group, or
Ctrl-C's SIGINT) at a random point after a checkpoint, then run again, resumes from the checkpoint
and ends with the bytes of a run never interrupted (the reference: the lock file of the tiny
pipeline run). A non-training stage killed while it writes leaves no half output, and `dvc status`
says it must run again. The other training stages and more points: benchmarks/faults.py."""

from __future__ import annotations

import random
import re
import signal

import pytest

from lookahead.tools.faults import after_checkpoints, file_digests, interrupt, while_writing
from tests.conftest import sh
from tests.reliability.conftest import assert_up_to_date, data_outs, latest_stage_run, lock_outs

STAGE_OUTPUTS = {"base": ("models/base",), "phase1": ("models/phase1",), "contexts": ("data/contexts",)}

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("stage, sig, saves", [("base", signal.SIGKILL, 2), ("phase1", signal.SIGINT, 1)],
                         ids=["base-SIGKILL", "phase1-SIGINT"])
def test_killed_training_stage_resumes_to_the_same_bytes(reproduced, stage, sig, saves):
    repo, env = reproduced
    lock, reference = (repo / "dvc.lock").read_bytes(), data_outs(lock_outs(repo), STAGE_OUTPUTS[stage])
    delay = random.Random(f"{stage}{sig}").uniform(0.0, 0.02)  # a random point after the checkpoint
    run = interrupt(["dvc", "repro", "-f", "-s", stage], repo, env, sig,
                    when=after_checkpoints(repo / "checkpoints" / stage, saves), delay=delay)
    assert run["signalled"] and run["returncode"] != 0, run["output"][-2000:]
    assert (repo / "dvc.lock").read_bytes() == lock  # the lock is written only after a stage succeeds
    for path in reference:  # DVC removed the outputs before running; nothing half-written took their place
        assert not (repo / path).exists(), path
    status = sh(["dvc", "status", stage], repo, env)  # must run again
    assert f"{stage}:\n\tchanged outs:" in status and all(f"deleted:            {p}" in status for p in reference), status
    if sig == signal.SIGINT:  # Ctrl-C reaches the stage's code, which closes its MLflow run (a SIGKILL cannot)
        assert latest_stage_run(repo, stage).info.status == "FAILED"

    out = sh(["dvc", "repro", "-f", "-s", stage], repo, env)
    resumed = re.search(rf"{stage}: resuming from step (\d+)", out)
    assert resumed and int(resumed.group(1)) > 0, out[-2000:]
    assert data_outs(lock_outs(repo), STAGE_OUTPUTS[stage]) == reference  # bitwise: the same md5s
    assert_up_to_date(repo, env)  # nothing downstream needs to run again
    assert not any((repo / "checkpoints" / stage).iterdir())  # the checkpoint is gone after success
    assert latest_stage_run(repo, stage).info.status == "FINISHED"


def test_stage_killed_while_writing_leaves_no_half_output(reproduced):
    repo, env = reproduced
    reference = data_outs(lock_outs(repo), STAGE_OUTPUTS["contexts"])
    whole = file_digests(repo / "data" / "contexts")
    run = interrupt(["dvc", "repro", "-f", "-s", "contexts"], repo, env, signal.SIGKILL,
                    when=while_writing(repo / "data" / "contexts"))
    assert run["signalled"], run["output"][-2000:]
    # not half a directory: none (DVC removed it before the run), or the whole new one when the
    # signal came just after the rename, which still lacks its lock entry
    assert not (repo / "data" / "contexts").exists() or file_digests(repo / "data" / "contexts") == whole
    assert not sh(["git", "status", "--porcelain", "data"], repo, env).strip()
    status = sh(["dvc", "status"], repo, env)
    assert "contexts:" in status and "deleted:            data/contexts" in status, status
    out = sh(["dvc", "repro"], repo, env)  # the last good outputs come back from the cache
    assert "Running stage" not in out, out
    assert data_outs(lock_outs(repo), STAGE_OUTPUTS["contexts"]) == reference
    assert_up_to_date(repo, env)  # (the leftover temporary goes with the next write: test_resources)
