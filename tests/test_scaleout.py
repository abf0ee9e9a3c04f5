"""Multi-process training (DESIGN §9): the launcher from params, 2 CPU processes over gloo.

The base stage of the tiny profile, run as a DVC experiment with `launch.train` set to
`accelerate launch --multi_gpu --num_processes 2`, ends at the val NLL of the 1-process run
(same global batch: each process takes half of every batch). And a NaN on one process stops both.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lookahead.core.errors import ConfigError
from lookahead.tools.launch import LaunchConfig
from tests.conftest import sh

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate(n: int) -> str:
    return (f"accelerate launch --multi_gpu --num_processes {n} --num_machines 1 --mixed_precision no "
            f"--dynamo_backend no --main_process_port {free_port()}")


def test_launcher_is_validated():
    assert LaunchConfig().train == "python"
    LaunchConfig(train=accelerate(2))
    for bad, says in (("accelerate launch --num_processes 2", "--multi_gpu"), ("pythonx", "must start with"),
                      ("python -u", "just 'python'"), ("accelerate launch --multi_gpu --num_processes x", "count")):
        with pytest.raises(ConfigError, match=says):
            LaunchConfig(train=bad)


def test_training_stages_take_the_launcher_from_params(repo_root):
    import yaml

    stages = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]
    for name in ("base", "modulator", "phase1", "diffusion", "phase2", "control", "static_control"):
        assert stages[name]["cmd"].startswith("${launch.train} stages/"), name


def test_two_processes_end_at_the_one_process_val_nll(pipeline_repo):
    """Tolerance 1e-4 nats: the two runs see the same windows in the same steps from the same
    initialisation and differ only in the order float32 gradients are summed (two half-batch means
    averaged by the gloo all-reduce instead of one mean); measured 2e-7 after the 30 steps. A real
    difference in data or schedule moves this val NLL by far more (train seeds 0, 1, 2: 5.417, 5.392, 5.363)."""
    repo, env = pipeline_repo
    sh(["dvc", "repro", "base"], repo, env)  # the 1-process run (a no-op after the pipeline tests)
    one = json.loads((repo / "metrics/base_report.json").read_text())
    out = sh(["dvc", "exp", "run", "--temp", "base", "-n", "two-procs", "-S", f"launch.train={accelerate(2)}"], repo, env)
    assert "Running stage 'base'" in out and "accelerate launch" in out, out
    ref = next(r for r in sh(["git", "for-each-ref", "--format=%(refname)", "refs/exps/"], repo, env).split()
               if r.endswith("/two-procs"))
    two_headline = json.loads(sh(["git", "show", f"{ref}:metrics/base.json"], repo, env))
    lock = sh(["git", "show", f"{ref}:dvc.lock"], repo, env)
    assert "accelerate launch --multi_gpu --num_processes 2" in lock  # the command DVC ran and recorded
    assert two_headline["train_steps"] == one["train_steps"]
    assert abs(two_headline["val_nll"] - one["val_nll"]) < 1e-4, (two_headline["val_nll"], one["val_nll"])
    import dvc.api

    two = json.loads(dvc.api.read("metrics/base_report.json", repo=str(repo), rev=ref))
    assert two["val_nll"] == two_headline["val_nll"]
    # throughput is a timing (metrics/base_timing.json, not a DVC output): this run's only
    timing = json.loads((repo / "metrics/base_timing.json").read_text())
    print("1 vs 2 processes", json.dumps({"val_nll_1": one["val_nll"], "val_nll_2": two["val_nll"],
                                          "tokens_per_s_1": round(timing["train_tokens_per_s"])}))


def test_phase2_on_the_stream_in_two_processes_ends_where_one_process_does(pipeline_repo, tmp_path):
    """Phase 2 at the tiny default (stream windows, a router reading each process's own LM states,
    top-K gates with a shared head): its stage command from dvc.lock run under 2 processes for one
    seed, writing elsewhere, ends at the 1-process run's first seed, dense and hard val NLL
    (tolerance as above). (Not `dvc exp run -S launch.train=…`: that changes every training
    stage's command and reruns them all; one seed: under `accelerate launch` the worker processes
    exit when a training run ends, so a stage's later seeds need one process — README, Scaling out.)"""
    import shlex

    import yaml

    repo, env = pipeline_repo
    sh(["dvc", "repro", "phase2"], repo, env)  # a no-op after the pipeline tests
    one = json.loads((repo / "metrics/phase2_report.json").read_text())["primary"]
    assert json.loads((repo / "metrics/phase2.json").read_text())["passes_over_stream"] is not None  # the stream path
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["phase2"]["seeds"] = 1
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    args = shlex.split(yaml.safe_load((repo / "dvc.lock").read_text())["stages"]["phase2"]["cmd"])
    assert args[0] == "python"
    elsewhere = {"--out": tmp_path / "out", "--pruning": tmp_path / "pruning.json", "--metrics": tmp_path / "m.json",
                 "--report": tmp_path / "r.json", "--train-curve": tmp_path / "t.csv", "--eval-curve": tmp_path / "e.csv",
                 "--figure": tmp_path / "f.png", "--checkpoints": tmp_path / "ckpt"}
    args = [str(elsewhere[args[i - 1]]) if args[i - 1] in elsewhere else a for i, a in enumerate(args)]
    sh([*accelerate(2).split(), *args[1:], "--params", str(tmp_path / "params.yaml")], repo, env)
    two = json.loads((tmp_path / "m.json").read_text())
    for key in ("dense_nll", "hard_nll"):
        assert abs(two[key] - one[key]) < 1e-4, (key, two[key], one[key])
    assert two["active_head_fraction"] == one["active_head_fraction"]


NAN_SCRIPT = textwrap.dedent('''
    """Rank 1's loss is NaN at step 3; each process records whether the guard stopped it."""
    import os, sys
    import torch
    from lookahead.train.loop import NonFiniteLoss, TrainConfig, train

    class Toy:
        def __init__(self):
            torch.manual_seed(0)
            self.model = torch.nn.Linear(4, 1)
        def batch(self, step):
            g = torch.Generator().manual_seed(step)
            return torch.randn(4, 4, generator=g)
        def loss(self, model, x):
            loss = model(x).pow(2).mean()
            if step_of[0] == 3 and int(os.environ["RANK"]) == 1:
                loss = loss * float("nan")
            step_of[0] += 1
            return loss
        def evaluate(self, model):
            return {}
        def tokens(self, x):
            return len(x)

    step_of = [0]
    out = sys.argv[1]
    try:
        train(Toy(), TrainConfig(steps=8, batch_size=4, warmup_steps=1, eval_every=100, device="cpu"), stage="toy")
    except NonFiniteLoss as err:
        with open(os.path.join(out, f"rank{os.environ['RANK']}.txt"), "w") as f:
            f.write(str(err))
        raise
''')


def test_a_nan_on_one_process_stops_every_process(tmp_path):
    script = tmp_path / "nan_on_rank1.py"
    script.write_text(NAN_SCRIPT)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([*accelerate(2).split(), str(script), str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0
    for rank in (0, 1):  # both stopped by the guard at the same step, neither left waiting
        message = (tmp_path / f"rank{rank}.txt").read_text()
        assert message.startswith("toy: training loss is nan at step 3 on process 1 of 2 (lr "), message
