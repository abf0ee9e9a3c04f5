"""Each stage's fixed cost, the part that does not depend on its work: the interpreter and the imports
its script makes before any work (`stages/<s>.py --dry-run`, which parses and validates its params
too), MLflow (import, opening the SQLite store, the stage's child run opened and closed, on a copy of
this project's `mlflow.db`; and the same block with `LOOKAHEAD_TRACKING=off`, which imports no MLflow),
and DVC's own time per stage of `dvc repro` (a scratch repository of
stages whose command writes one small file: DVC's wall time less the commands').

    python benchmarks/stage_overhead.py [--repeats 3]

Prints one JSON line: the medians in seconds, per stage where they differ, and the sum over the
default pipeline's stages.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
MLFLOW_CHILD = """
import json, os, sys, time
t0 = time.perf_counter()
if os.environ["LOOKAHEAD_TRACKING"] == "on":
    import mlflow.tracking
t1 = time.perf_counter()
from lookahead.core.tracking import stage_run
with stage_run("overhead", {"section": {"key": 1}}, root=sys.argv[1]) as run:
    t2 = time.perf_counter()
    run.log_metrics({"figure": 1.0})
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "open": t2 - t1, "log_and_close": t3 - t2}))
"""
DVC_STAGES = 8


def wall(cmd: list[str], cwd: Path = REPO, env: dict | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def mlflow_cost(repeats: int, tracking: str = "on") -> dict[str, float]:
    """Median seconds of MLflow's import, store opening (+ the run's creation) and closing; with
    ``tracking`` "off" (``LOOKAHEAD_TRACKING``) the stage's block alone (the import figure: 0)."""
    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            store = Path(tmp) / "mlflow.db"
            if (REPO / "mlflow.db").is_file():
                shutil.copy(REPO / "mlflow.db", store)
            env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{store}", "LOOKAHEAD_TRACKING": tracking}
            out = subprocess.run([sys.executable, "-c", MLFLOW_CHILD, tmp], env=env, check=True,
                                 capture_output=True, text=True).stdout
            figures.append(json.loads(out.strip().splitlines()[-1]))
    return {k: statistics.median(f[k] for f in figures) for k in figures[0]}


def dvc_cost(repeats: int) -> dict[str, float]:
    """DVC's own seconds per stage of `dvc repro` (and of a no-op `dvc repro`), from a scratch repository."""
    dvc = str(Path(sys.executable).with_name("dvc"))
    per_stage, noop = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            subprocess.run(["git", "init", "-q"], cwd=root, check=True)
            subprocess.run([dvc, "init", "-q"], cwd=root, check=True)
            (root / ".dvc" / "config").write_text("\n".join(
                line for line in (REPO / ".dvc" / "config").read_text().splitlines() if "html_template" not in line))
            write = "import sys; open(sys.argv[1], 'w').write(sys.argv[1])"
            stages = {f"s{i}": {"cmd": f"{sys.executable} -c \"{write}\" out{i}.txt",
                                "deps": [f"out{i - 1}.txt"] if i else [], "outs": [f"out{i}.txt"]}
                      for i in range(DVC_STAGES)}
            (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
            command = statistics.median(wall([sys.executable, "-c", write, "probe.txt"], root) for _ in range(3))
            per_stage.append(wall([dvc, "repro", "-q"], root) / DVC_STAGES - command)
            noop.append(wall([dvc, "repro", "-q"], root))
    return {"dvc_per_stage": statistics.median(per_stage), "dvc_noop_repro": statistics.median(noop)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    stages = list(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"])
    python = statistics.median(wall([sys.executable, "-c", "pass"]) for _ in range(args.repeats))
    startup = {s: statistics.median(wall([sys.executable, f"stages/{s}.py", "--dry-run"]) for _ in range(args.repeats))
               for s in stages}
    mlflow = mlflow_cost(args.repeats)
    untracked = mlflow_cost(args.repeats, "off")
    dvc = dvc_cost(args.repeats)
    mlflow_total = sum(mlflow.values())
    print(json.dumps({
        "python_s": round(python, 3),
        "startup_s": {s: round(v, 3) for s, v in startup.items()},
        "mlflow_s": {k: round(v, 3) for k, v in mlflow.items()},
        "tracking_off_s": round(sum(untracked.values()), 3),
        **{f"{k}_s": round(v, 3) for k, v in dvc.items()},
        "stages": len(stages),
        "per_stage_s": round(statistics.mean(startup.values()) + mlflow_total + dvc["dvc_per_stage"], 3),
        "pipeline_total_s": round(sum(startup.values()) + len(stages) * (mlflow_total + dvc["dvc_per_stage"]), 2),
    }))


if __name__ == "__main__":
    main()
