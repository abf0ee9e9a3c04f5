"""Multi-process training (docs/scaling.md): the launcher from params, 2 CPU processes over gloo.

The base stage of the tiny profile, run as a DVC experiment with `launch.train` set to
`accelerate launch --multi_gpu --num_processes 2`, ends at the val NLL of the 1-process run
(same global batch: each process takes half of every batch); every seed of every seeded training
stage does too. And a NaN on one process stops both.
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
from lookahead.core.report import SIBLINGS, sibling_path
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


SEEDED_TRAINING = ("modulator", "phase1", "diffusion", "phase2", "control", "static_control")


def close(a, b, tol: float = 1e-4) -> bool:
    """Figures equal within ``tol`` (numbers, in dicts and lists too), or equal (anything else, None included)."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(a - b) <= tol or (a != a and b != b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, tol) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("stage", SEEDED_TRAINING)
def test_every_seed_of_a_seeded_stage_in_two_processes_ends_where_one_process_does(second_tiny_run, tmp_path, stage):
    """Each training stage with seeds (the tiny profile's 2: a worker trains every seed beside the
    main process, lookahead.core.seeds): its command from dvc.lock run under 2 processes, every output
    written elsewhere, ends with every seed's figures (the report's ``per_seed``) within 1e-4 of the
    1-process run's (the two differ in the order float32 gradients are summed; a real difference in
    data or schedule moves them far more, e.g. phase 2's hard NLL by 1e-2 between seeds). On the
    second tiny run (the first's bytes), whose worker has time to spare beside the first's."""
    import shlex

    import yaml

    repo, env = second_tiny_run
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"][stage]
    args = shlex.split(lock["cmd"])
    assert args[0] == "python"
    outs = {o["path"] for o in lock["outs"]}
    moved = {}
    for i in range(2, len(args)):
        if args[i - 1].startswith("--") and (args[i] in outs or args[i - 1] == "--checkpoints"):
            moved[args[i - 1]] = args[i] = str(tmp_path / args[i])
    # every output is an argument, but the headline's sibling files, which land beside --metrics
    siblings = {str(sibling_path(o, part)) for o in outs for part in SIBLINGS}
    report = "--training" if "--training" in args else "--report"  # a training stage's report: its scoring stage's input
    assert report in moved and len(moved) >= len(outs - siblings)
    one = json.loads((repo / lock["cmd"].split(f"{report} ")[1].split()[0]).read_text())
    assert one["seeds"] == 2, "the tiny profile runs 2 seeds per research stage"
    sh([*accelerate(2).split(), *args[1:]], repo, {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"})
    two = json.loads(Path(moved[report]).read_text())
    assert len(two["per_seed"]) == len(one["per_seed"]) == 2
    for seed, (a, b) in enumerate(zip(two["per_seed"], one["per_seed"])):
        assert a.keys() == b.keys()
        assert all(close(a[k], b[k]) for k in a), (stage, seed, {k: (a[k], b[k]) for k in a if not close(a[k], b[k])})


LINE = textwrap.dedent('''
    class Line:
        def __init__(self):
            torch.manual_seed(0)
            self.model = torch.nn.Linear(4, 1)
        def batch(self, step):
            g = torch.Generator().manual_seed(100 + step)
            return torch.randn(8, 5, generator=g)
        def loss(self, model, xy):
            return (model(xy[:, :4])[:, 0] - xy[:, 4]).pow(2).mean()
        def evaluate(self, model):
            return {}
        def tokens(self, xy):
            return len(xy)
''')

NAN_SCRIPT = textwrap.dedent('''
    """First, micro-batches: a toy trained with train.accumulate 1 and 2, each process counting the
    gradient all-reduces DDP makes (a comm hook); rank 0 saves the accumulated run's weights. Then
    rank 1's loss is NaN at step 3; each process records whether the guard stopped it."""
    import json, os, sys
    import accelerate
    import torch
    from lookahead.core import seeds
    from lookahead.train.loop import NonFiniteLoss, TrainConfig, train

''') + LINE + textwrap.dedent('''
    all_reduces = [0]
    prepare = accelerate.Accelerator.prepare

    def counted(self, *args):
        out = prepare(self, *args)
        def hook(state, bucket):
            all_reduces[0] += 1
            return torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook(None, bucket)
        out[0].register_comm_hook(None, hook)
        return out

    accelerate.Accelerator.prepare = counted
    seeds._FOLLOWING = True  # rank 1's trainings return, as in a stage's seed runs
    counts = {}
    for k in (1, 2):
        all_reduces[0] = 0
        line = Line()
        train(line, TrainConfig(steps=4, batch_size=8, accumulate=k, warmup_steps=1, eval_every=100, lr=0.1,
                                device="cpu"), stage="line")
        counts[k] = all_reduces[0]
    accelerate.Accelerator.prepare = prepare
    seeds._FOLLOWING = False
    with open(os.path.join(sys.argv[1], f"counts{os.environ['RANK']}.json"), "w") as f:
        json.dump({"counts": counts, "weight": line.model.weight.tolist(), "bias": line.model.bias.tolist()}, f)

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
    # micro-batches: one all-reduce per optimizer step whatever their count (none on a non-final
    # micro-batch), and the 2-process run with 2 micro-batches each ends where one process does in one pass
    import torch

    from lookahead.train.loop import TrainConfig, train

    runs = [json.loads((tmp_path / f"counts{rank}.json").read_text()) for rank in (0, 1)]
    assert all(run["counts"] == {"1": 4, "2": 4} for run in runs), runs
    namespace = {"torch": torch}
    exec(LINE, namespace)  # the script's toy
    line = namespace["Line"]()
    train(line, TrainConfig(steps=4, batch_size=8, warmup_steps=1, eval_every=100, lr=0.1, device="cpu"), stage="line")
    assert torch.allclose(line.model.weight, torch.tensor(runs[0]["weight"]), atol=1e-6)
    assert torch.allclose(line.model.bias, torch.tensor(runs[0]["bias"]), atol=1e-6)
