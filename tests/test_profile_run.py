"""``lookahead.tools.profile_run`` (``make smollm2-run``): a profile's stages in a lasting workspace of
their own, each stage's figures and seconds committed as it finishes, a rerun that resumes.

A two-stage pipeline of plain commands stands in for the project's (its stages are the tiny run's to
test): what is under test is the driver — sync, DVC deciding what runs, the record, the commits."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # a dozen DVC commands

STAGES = """
stages:
  one:
    cmd: python src/one.py
    deps: [src/one.py, src/code.txt]
    params: [windows.per_role]
    outs: [data/one.txt]
    metrics: [{metrics/one.json: {cache: false}}]
  two:
    cmd: python src/two.py
    deps: [src/two.py, data/one.txt]
    params: [windows.seed]
    metrics: [{metrics/two.json: {cache: false}}]
"""
ONE = """import json, os, yaml
os.makedirs("metrics", exist_ok=True)  # outputs are the workspace's own: none is synced
os.makedirs("data", exist_ok=True)
os.makedirs("logs", exist_ok=True)  # an ignored directory a stage writes (the probe's log)
open("logs/one.log", "w").write("ran")
per_role = yaml.safe_load(open("params.yaml"))["windows"]["per_role"]
open("data/one.txt", "w").write(str(per_role))
json.dump({"per_role": per_role, "code": open("src/code.txt").read()}, open("metrics/one.json", "w"))
"""
TWO = """import json, os, yaml
os.makedirs("metrics", exist_ok=True)
seed = yaml.safe_load(open("params.yaml"))["windows"]["seed"]
json.dump({"twice": 2 * int(open("data/one.txt").read()), "seed": seed}, open("metrics/two.json", "w"))
"""


def git(*argv: str, cwd: Path) -> str:
    return subprocess.run(["git", *argv], cwd=cwd, check=True, capture_output=True, text=True).stdout


def drive(project: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lookahead.tools.profile_run", "profiles/p.yaml", "--commit", *argv],
                          cwd=project, capture_output=True, text=True)


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    p = tmp_path / "project"
    (p / "profiles").mkdir(parents=True)
    (p / "src").mkdir()
    (p / "metrics").mkdir()
    (p / "dvc.yaml").write_text(STAGES)
    (p / "src" / "code.txt").write_text("v1")
    (p / "src" / "one.py").write_text(ONE)
    (p / "src" / "two.py").write_text(TWO)
    (p / "src" / "stale.txt").write_text("removed later")
    shutil.copy(ROOT / "profiles" / "tiny.yaml", p / "profiles" / "p.yaml")
    (p / "params.yaml").write_text("unused: the workspace's params are the profile's\n")
    (p / ".gitignore").write_text("/runs/\n/logs/\n")
    git("init", "-q", cwd=p)
    git("config", "user.email", "t@example.com", cwd=p)
    git("config", "user.name", "test", cwd=p)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=p, check=True)
    git("add", "-A", cwd=p)
    git("commit", "-qm", "init", cwd=p)
    return p


def test_runs_commits_and_resumes(project: Path):
    work, record_file = project / "runs" / "p", project / "metrics" / "p" / "run.json"
    proc = drive(project)
    assert proc.returncode == 0, proc.stderr
    per_role = yaml.safe_load((project / "profiles" / "p.yaml").read_text())["windows"]["per_role"]
    # each stage ran in the workspace on the profile's params, its figures kept and committed
    assert json.loads((project / "metrics" / "p" / "one.json").read_text()) == {"per_role": per_role, "code": "v1"}
    seed = yaml.safe_load((project / "profiles" / "p.yaml").read_text())["windows"]["seed"]
    assert json.loads((project / "metrics" / "p" / "two.json").read_text()) == {"twice": 2 * per_role, "seed": seed}
    record = json.loads(record_file.read_text())
    assert [(s, e["done"], e["calls"]) for s, e in record["stages"].items()] == [("one", True, 1), ("two", True, 1)]
    assert all(e["seconds"] > 0 for e in record["stages"].values())
    log = git("log", "--format=%s", cwd=project).splitlines()
    assert [line.split(" (")[0] for line in log[:2]] == ["p: stage two", "p: stage one"]
    assert not git("status", "--porcelain", cwd=project).strip()  # runs/ is ignored, the rest committed

    # a rerun: nothing runs, nothing is committed
    assert drive(project).returncode == 0
    assert git("log", "--format=%s", cwd=project).splitlines() == log
    assert json.loads(record_file.read_text()) == record

    # a code change reaches the workspace (and a deleted file leaves it): the stage that reads it runs again
    (project / "src" / "code.txt").write_text("v2")
    (project / "src" / "stale.txt").unlink()
    git("commit", "-qam", "code v2", cwd=project)
    assert drive(project, "--until", "one").returncode == 0
    assert not (work / "src" / "stale.txt").exists()
    record = json.loads(record_file.read_text())
    assert record["stages"]["one"]["calls"] == 2 and json.loads((project / "metrics" / "p" / "one.json").read_text())["code"] == "v2"
    assert record["stages"]["two"]["calls"] == 1  # --until one: two not yet

    # a call cut off mid-stage: its heartbeat's seconds count at the next call
    (work / ".stage_heartbeat.json").write_text(json.dumps({"stage": "two", "seconds": 1000.0}))
    before = record["stages"]["two"]["seconds"]
    assert drive(project).returncode == 0
    two = json.loads(record_file.read_text())["stages"]["two"]
    assert two["calls"] == 2 and two["seconds"] >= before + 1000.0 and two["cut_seconds"] == 1000.0  # one's output did not change: two is up to date
    assert not (work / ".stage_heartbeat.json").exists()
    plan = drive(project, "--plan")
    assert plan.returncode == 0 and "two" in plan.stdout and "done" in plan.stdout


def test_a_cell_reruns_its_stages_alone_from_the_main_runs_outputs(project: Path):
    """``--cell``: the profile with overrides in a workspace of its own; its stages rerun alone
    (``dvc repro -s``) on the main run's upstream outputs, checked out of its DVC cache."""
    assert drive(project).returncode == 0
    per_role = yaml.safe_load((project / "profiles" / "p.yaml").read_text())["windows"]["per_role"]
    cell = drive(project, "--cell", "c", "--set", "windows.seed=7", "--set", "windows.per_role=3", "--stages", "two")
    assert cell.returncode == 0, cell.stderr
    # two ran with the cell's params on one's output as the main run made it (per_role not rerun: 3 unused)
    assert json.loads((project / "metrics" / "p" / "cells" / "c" / "two.json").read_text()) == {"twice": 2 * per_role,
                                                                                                   "seed": 7}
    record = json.loads((project / "metrics" / "p" / "cells" / "c" / "run.json").read_text())
    assert list(record["stages"]) == ["two"] and record["stages"]["two"]["calls"] == 1
    assert json.loads((project / "metrics" / "p" / "two.json").read_text())["seed"] != 7  # the main run's is its own
    log = git("log", "--format=%s", cwd=project).splitlines()
    assert drive(project, "--cell", "c", "--set", "windows.seed=7", "--set", "windows.per_role=3",
                 "--stages", "two").returncode == 0
    assert git("log", "--format=%s", cwd=project).splitlines() == log  # up to date: nothing reruns
    bad = drive(project, "--cell", "d", "--set", "windows.nokey=1", "--stages", "two")
    assert bad.returncode != 0 and "no key" in bad.stderr


def test_refuses_before_work(project: Path):
    bad = drive(project, "--until", "three")
    assert bad.returncode != 0 and "no such stage" in bad.stderr
    params = yaml.safe_load((project / "profiles" / "p.yaml").read_text())
    params["windows"]["per_role"] = -1
    (project / "profiles" / "p.yaml").write_text(yaml.safe_dump(params))
    bad = drive(project)
    assert bad.returncode != 0 and "per_role" in bad.stderr
    assert not (project / "runs").exists()
