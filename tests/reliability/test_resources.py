"""Resources: a disk that fills up while a stage writes its outputs, two `dvc repro` at once, a NaN
that reaches a training loss."""

from __future__ import annotations

import errno
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lookahead.core import atomic
from lookahead.core.cli import cli
from tests.conftest import sh
from tests.reliability.conftest import assert_up_to_date, latest_stage_run, lock_outs

INIT_OUTPUTS = {"out": "models/init/init.safetensors", "metrics": "metrics/init.json", "report": "metrics/init_report.json"}


def mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


@pytest.mark.slow
def test_full_disk_leaves_the_previous_output_intact(reproduced, tmp_path, monkeypatch, capsys):
    repo, env = reproduced
    disk = tmp_path / "disk"
    if not mount_tmpfs(disk, "2m"):
        # no permission to mount (not root): the same failure injected where the bytes are written
        target = tmp_path / "out.safetensors"
        save_file({"w": torch.ones(3)}, str(target))
        before = target.read_bytes()

        def stage():
            with atomic.atomic_file(target) as tmp:
                tmp.write_bytes(b"half")
                raise OSError(errno.ENOSPC, "No space left on device")

        with pytest.raises(SystemExit) as exit_:
            cli(stage)
        assert exit_.value.code == 2 and capsys.readouterr().err.startswith("error (DiskFull): no space left")
        assert target.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["disk", "out.safetensors"]
        return
    try:
        previous = {}
        for name, rel in INIT_OUTPUTS.items():  # the outputs of the last good run, on the small disk
            (disk / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(repo / rel, disk / rel)
            previous[name] = (disk / rel).read_bytes()
        free = shutil.disk_usage(disk).free
        with open(disk / "filler", "wb") as f:  # leave 8 KiB: less than init.safetensors needs
            f.write(b"\0" * (free - 8192))
        proc = subprocess.run(
            [sys.executable, "stages/init.py", "--base", "models/base", "--wordnet", "data/wordnet",
             "--heads", "data/probe/heads.safetensors", *[f"--{n}={disk / rel}" for n, rel in INIT_OUTPUTS.items()]],
            cwd=repo, env=env, capture_output=True, text=True)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        last = proc.stderr.strip().splitlines()[-1]
        expected = f"error (DiskFull): no space left on the device while writing {disk / INIT_OUTPUTS['out']}: "
        assert last.startswith(expected), last
        for name, rel in INIT_OUTPUTS.items():
            assert (disk / rel).read_bytes() == previous[name], rel
        assert not [p for p in disk.rglob("*") if p.name.endswith(".tmp")]
    finally:
        subprocess.run(["umount", str(disk)], check=False)
    assert_up_to_date(repo, env)  # the run wrote nothing of the repository's


def test_a_write_that_runs_out_of_space_is_a_disk_full_error_and_keeps_the_old_file(tmp_path):
    """Libraries report a full disk in their own ways; each becomes DiskFull, the temporary goes and
    the previous file stays. Other failures pass through unchanged."""
    target = tmp_path / "out.bin"
    target.write_bytes(b"previous")
    for failure in (OSError(errno.ENOSPC, "No space left on device"),
                    RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")):
        with pytest.raises(atomic.DiskFull, match=f"no space left on the device while writing {target}: nothing was"):
            with atomic.atomic_file(target) as tmp:
                tmp.write_bytes(b"half")
                raise failure
        assert target.read_bytes() == b"previous" and sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]
    with pytest.raises(ValueError, match="unrelated"):
        with atomic.atomic_dir(tmp_path / "d") as tmp:
            raise ValueError("unrelated")


def test_a_killed_writers_temporary_is_swept_by_the_next_write(tmp_path):
    leftovers = [tmp_path / ".out.abcd1234.tmp", tmp_path / ".d.wxyz9876.tmp"]
    leftovers[0].write_bytes(b"half")
    leftovers[1].mkdir()
    unrelated = tmp_path / ".out.bin.abcd1234.tmp"  # another output's temporary: not this one's to remove
    unrelated.write_bytes(b"other")
    atomic.write_text(tmp_path / "out", "whole")
    with atomic.atomic_dir(tmp_path / "d") as tmp:
        (tmp / "f").write_text("whole")
    assert not any(p.exists() for p in leftovers) and unrelated.exists()
    assert (tmp_path / "out").read_text() == "whole" and (tmp_path / "d" / "f").read_text() == "whole"


@pytest.mark.slow
def test_two_repros_at_once_get_the_lock_error_not_corruption(reproduced):
    repo, env = reproduced
    reference = lock_outs(repo)
    first = subprocess.Popen(["dvc", "repro", "-f", "-s", "contexts"], cwd=repo, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while (repo / "data" / "contexts").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # DVC removes a stage's outputs just before running it: the first holds the lock now
    second = subprocess.run(["dvc", "repro"], cwd=repo, env=env, capture_output=True, text=True)
    out_first = first.communicate(timeout=300)[0]
    assert first.returncode == 0, out_first[-2000:]
    # DVC's lock error: the repository lock, or its per-output read/write lock naming the holder
    assert second.returncode != 0 and "Traceback" not in second.stderr, second.stderr[-2000:]
    assert re.search(r"Unable to acquire lock|is busy, it is being blocked by:\n  \(PID \d+\): .*dvc repro -f -s contexts",
                     second.stderr), second.stderr[-2000:]
    assert {p: m for p, m in lock_outs(repo).items() if p.startswith("data/")} == \
        {p: m for p, m in reference.items() if p.startswith("data/")}
    assert_up_to_date(repo, env)


@pytest.mark.slow
def test_nan_in_a_training_loss_stops_the_stage_naming_the_step(reproduced):
    repo, env = reproduced
    lock = (repo / "dvc.lock").read_bytes()
    weights = repo / "models" / "base" / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["model.norm.weight"][0] = float("nan")  # a valid file whose model computes NaN
    weights.unlink()  # DVC may have linked it to its cache: never write through
    save_file(tensors, str(weights), metadata={"format": "pt"})
    out = sh(["dvc", "repro", "-s", "modulator"], repo, env, check=False)
    line = next((x for x in out.splitlines() if x.startswith("error (")), out[-2000:])
    assert line.startswith("error (NonFiniteLoss): modulator: training loss is nan at step 0"), line
    assert "Traceback" not in out and (repo / "dvc.lock").read_bytes() == lock
    assert latest_stage_run(repo, "modulator").info.status == "FAILED"  # tracked, and marked failed
    sh(["dvc", "checkout", "--force", "models/base"], repo, env)
    assert "Running stage" not in sh(["dvc", "repro"], repo, env)
    assert_up_to_date(repo, env)
