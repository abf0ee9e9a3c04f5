"""Sharing through DVC remotes (docs/sharing.md), for real: a local-directory remote and an SSH remote
served by OpenSSH's sshd on a free loopback port (temporary host key, an authorised key of the
test's own; DVC's `dvc-ssh` plugin). Repository A (the tiny pipeline run, plus a params value it ran
and reverted) pushes outputs and its whole run-cache (`python -m lookahead.tools.share`); a fresh
`git clone` B pulls, has nothing to recompute, and restores the reverted value's run from the
run-cache. Experiments travel with `dvc exp push`/`pull` through a bare git remote. A refused key
and an unreachable server give DVC's error and leave cache and workspace as they were.
"""

from __future__ import annotations

import getpass
import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from lookahead.tools.faults import free_port
from tests.conftest import QUEUED_EXPERIMENTS, sh

pytestmark = pytest.mark.slow


def cache_files(repo: Path) -> set[str]:
    return {str(p.relative_to(repo)) for p in (repo / ".dvc" / "cache").rglob("*") if p.is_file()}


def set_eval_seed(repo: Path, seed: int) -> None:
    """``evaluate.seed`` (the last stage: only it reruns)."""
    head, _, rest = (repo / "params.yaml").read_text().partition("\nevaluate:\n")
    section, _, tail = rest.partition("\n\n")  # the evaluate section only (other sections have seeds too)
    section = re.sub(r"(?m)^  seed: \d+", f"  seed: {seed}", section)
    (repo / "params.yaml").write_text(head + "\nevaluate:\n" + section + ("\n\n" + tail if tail else ""))


@pytest.fixture(scope="module")
def pushed_repo(pipeline_repo) -> tuple[Path, dict, bytes]:
    """A with its pipeline run, committed, after running `evaluate.seed: 1` and reverting it; and the
    evaluation report that seed gave."""
    path, env = pipeline_repo
    sh(["dvc", "repro"], path, env)  # a no-op after the pipeline tests
    sh(["git", "add", "-A"], path, env)
    sh(["git", "commit", "-qm", "pipeline outputs", "--allow-empty"], path, env)
    set_eval_seed(path, 1)
    out = sh(["dvc", "repro"], path, env)
    assert "Running stage 'evaluate'" in out and out.count("Running stage") == 1
    seed1_report = (path / "metrics/evaluate_report.json").read_bytes()
    sh(["git", "checkout", "--", "params.yaml"], path, env)
    assert "Running stage" not in sh(["dvc", "repro"], path, env)  # restored from A's own run-cache
    assert not sh(["git", "status", "--porcelain"], path, env).strip()
    return path, env, seed1_report


def share_round_trip(a: Path, env: dict, seed1_report: bytes, remote_args: list[list[str]], tmp: Path) -> dict:
    """Configure the remote in A (committed), push outputs + run-cache, clone B, pull, check B,
    restore the reverted run in B; return the timings."""
    for args in remote_args:
        sh(["dvc", "remote", *args], a, env)
    sh(["git", "commit", "-qam", "remote"], a, env)
    timings = {}
    t = time.perf_counter()
    sh(["dvc", "push"], a, env)
    timings["push_s"] = time.perf_counter() - t
    t = time.perf_counter()
    sh(["dvc", "push", "--run-cache"], a, env)
    timings["push_run_cache_s"] = time.perf_counter() - t
    t = time.perf_counter()
    out = sh(["python", "-m", "lookahead.tools.share"], a, env)  # + the objects of every run record
    timings["share_s"] = time.perf_counter() - t
    assert re.search(r"run records, whose \d+ objects are on the remote \([1-9]\d* sent now\)", out), out

    b = tmp / "b"
    sh(["git", "clone", "-q", str(a), str(b)], tmp, env)
    for args in remote_args:  # local settings (keys) are not in git: as a teammate would, set them
        if "--local" in args:
            sh(["dvc", "remote", *args], b, env)
    t = time.perf_counter()
    sh(["dvc", "pull", "--run-cache"], b, env)
    timings["pull_s"] = time.perf_counter() - t
    assert "Data and pipelines are up to date" in sh(["dvc", "status"], b, env)
    out = sh(["dvc", "repro"], b, env)
    assert "Running stage" not in out, out
    for name in ("models/base/model.safetensors", "data/pairs/pairs.safetensors", "metrics/probe_report.json"):
        assert (b / name).read_bytes() == (a / name).read_bytes(), name

    set_eval_seed(b, 1)  # the value A ran and reverted: restored, not rerun
    t = time.perf_counter()
    out = sh(["dvc", "repro", "--pull"], b, env)
    timings["restore_reverted_s"] = time.perf_counter() - t
    assert "Stage 'evaluate' is cached - skipping run" in out and "Running stage" not in out, out
    assert (b / "metrics/evaluate_report.json").read_bytes() == seed1_report

    c = tmp / "c"  # another fresh clone: `dvc repro --pull` fetches instead of recomputing
    sh(["git", "clone", "-q", str(a), str(c)], tmp, env)
    for args in remote_args:
        if "--local" in args:
            sh(["dvc", "remote", *args], c, env)
    t = time.perf_counter()
    out = sh(["dvc", "repro", "--pull"], c, env)
    timings["repro_pull_s"] = time.perf_counter() - t
    assert "Running stage" not in out, out
    assert (c / "models/phase1/predictor.safetensors").read_bytes() == (a / "models/phase1/predictor.safetensors").read_bytes()
    return timings


def test_local_directory_remote_round_trip(pushed_repo, tmp_path):
    a, env, seed1_report = pushed_repo
    store = tmp_path / "store"
    remote = [["add", "-f", "-d", "team", str(store)], ["modify", "team", "verify", "true"]]  # as docs/sharing.md says
    timings = share_round_trip(a, env, seed1_report, remote, tmp_path)
    print("local remote", json.dumps({k: round(v, 2) for k, v in timings.items()}))
    assert any(store.rglob("*")) and (store / "runs").is_dir()  # outputs and run records


def test_ssh_remote_round_trip_and_clean_failures(pushed_repo, sshd, tmp_path):
    port, key, stranger, home = sshd
    a, env, seed1_report = pushed_repo
    env = {**env, "HOME": str(home)}  # known_hosts with the server's temporary host key
    url = f"ssh://127.0.0.1:{port}{tmp_path / 'ssh-store'}"
    remote = [["add", "-f", "-d", "sshteam", url],
              ["modify", "sshteam", "verify", "true"],
              ["modify", "--local", "sshteam", "user", getpass.getuser()],
              ["modify", "--local", "sshteam", "keyfile", str(key)]]
    timings = share_round_trip(a, env, seed1_report, remote, tmp_path)
    print("ssh remote", json.dumps({k: round(v, 2) for k, v in timings.items()}))
    assert (tmp_path / "ssh-store" / "files").is_dir()

    # a refused key and an unreachable server: DVC's error, cache and workspace as they were
    before_cache, before_lock = cache_files(a), (a / "dvc.lock").read_bytes()
    before_out = (a / "data" / "pairs" / "pairs.safetensors").read_bytes()
    sh(["dvc", "remote", "modify", "--local", "sshteam", "keyfile", str(stranger)], a, env)
    proc = subprocess.run(["dvc", "push", "-r", "sshteam"], cwd=a, env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "ERROR" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    sh(["dvc", "remote", "modify", "--local", "sshteam", "keyfile", str(key)], a, env)
    sh(["dvc", "remote", "modify", "sshteam", "url", f"ssh://127.0.0.1:{free_port()}/nowhere"], a, env)
    sh(["dvc", "remote", "modify", "--local", "sshteam", "timeout", "5"], a, env)
    proc = subprocess.run(["dvc", "pull", "-r", "sshteam", "--force"], cwd=a, env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "ERROR" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert cache_files(a) == before_cache and (a / "dvc.lock").read_bytes() == before_lock
    assert (a / "data" / "pairs" / "pairs.safetensors").read_bytes() == before_out
    sh(["git", "checkout", "--", ".dvc/config"], a, env)
    # local settings of a remote that older commits lack make those commits' config invalid for DVC
    # (an experiment's, say): a teammate done with the remote removes them
    sh(["dvc", "remote", "remove", "--local", "sshteam"], a, env)


def test_experiments_travel_through_git_and_dvc_remotes(queued_experiments, tmp_path):
    """The session's two queued experiments (tests/conftest.py); `dvc exp push` to a bare git remote
    (+ the DVC remote of their commit); a clone pulls them, `dvc exp show` lists both with metrics,
    `dvc exp apply` gives outputs unrun."""
    a, env, baseline = queued_experiments
    names = list(QUEUED_EXPERIMENTS)
    origin = tmp_path / "origin.git"
    sh(["git", "init", "-q", "--bare", str(origin)], tmp_path, env)
    sh(["git", "remote", "add", "origin", str(origin)], a, env)
    sh(["git", "push", "-q", "origin", "HEAD"], a, env)
    t = time.perf_counter()
    sh(["dvc", "exp", "push", "origin", *names], a, env)
    exp_push_s = time.perf_counter() - t
    refs = _exp_refs(a, env)
    expected = {name: json.loads(sh(["git", "show", f"refs/exps/{refs[name]}:metrics/evaluate.json"], a, env))
                for name in names}
    assert expected[names[0]] != expected[names[1]]

    d = tmp_path / "d"
    sh(["git", "clone", "-q", str(origin), str(d)], tmp_path, env)
    t = time.perf_counter()
    sh(["dvc", "exp", "pull", "origin", *names], d, env)
    exp_pull_s = time.perf_counter() - t
    # experiments belong to the commit they were queued from (docs/sharing.md says so)
    shown = subprocess.run(["dvc", "exp", "show", "--json", "--rev", baseline], cwd=d, env=env, capture_output=True,
                           text=True, check=True)
    listed = {rev["name"]: rev for row in json.loads(shown.stdout) for exp in (row.get("experiments") or [])
              for rev in exp["revs"]}
    for name in names:
        metrics = listed[name]["data"]["metrics"]["metrics/evaluate.json"]["data"]
        assert metrics == expected[name], name
    sh(["dvc", "exp", "apply", "samples-3"], d, env)
    assert "Data and pipelines are up to date" in sh(["dvc", "status"], d, env)
    assert "Running stage" not in sh(["dvc", "repro"], d, env)
    assert json.loads((d / "metrics/evaluate.json").read_text()) == expected["samples-3"]
    assert (d / "metrics/evaluate_explainer.png").is_file()
    print("experiments", json.dumps({"exp_push_s": round(exp_push_s, 2), "exp_pull_s": round(exp_pull_s, 2)}))


def _exp_refs(repo: Path, env: dict) -> dict[str, str]:
    """{experiment name: ref under refs/exps/} of the experiments in ``repo``."""
    out = sh(["git", "for-each-ref", "--format=%(refname)", "refs/exps/"], repo, env)
    return {ref.rsplit("/", 1)[-1]: ref.removeprefix("refs/exps/") for ref in out.split() if ref.count("/") >= 4}
