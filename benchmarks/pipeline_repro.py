"""`dvc repro` wall time of a profile (docs/development.md), in a fresh temporary copy of the repository.

Runs the stages one at a time in pipeline order (`dvc repro -s <stage>`, DVC's overhead included)
and prints one JSON line: the wall time of each stage and in all, the no-op repro time, the base
model's figures and, for params.yaml, how many of the run's outputs have the md5 the committed
dvc.lock records (every stage bitwise on rerun: all of them, on the machine that made the lock).

    python benchmarks/pipeline_repro.py                 # the embedded default (params.yaml)
    python benchmarks/pipeline_repro.py --profile tiny
    python benchmarks/pipeline_repro.py --profile graph16x16
    python benchmarks/pipeline_repro.py --lock-to run.lock   # also keep the dvc.lock the run wrote
    python benchmarks/pipeline_repro.py --keep DIR           # and the whole run (outputs, DVC cache) in DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lookahead.tools.faults import lock_outs

REPO = Path(__file__).resolve().parents[1]


def run(cmd: list[str], cwd: Path, env: dict) -> float:
    tic = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    return time.perf_counter() - tic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=None, help="profiles/<name>.yaml instead of params.yaml")
    parser.add_argument("--lock-to", type=Path, default=None, help="copy the dvc.lock the fresh run wrote here")
    parser.add_argument("--keep", type=Path, default=None,
                        help="move the run's repository here (outputs, cache: e.g. for scripts/rerun_table.py)")
    args = parser.parse_args()
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    with tempfile.TemporaryDirectory(prefix="lookahead-bench-") as tmp:
        dest = Path(tmp) / "repo"
        for name in files:
            if (REPO / name).is_file() and not name.startswith(("metrics/", "data/", "models/")) and name != "dvc.lock":
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, dest / name)
        if args.profile:
            shutil.copy(dest / "profiles" / f"{args.profile}.yaml", dest / "params.yaml")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        env["DVC_NO_ANALYTICS"] = "true"
        for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=b", "-c", "user.email=b@example.com", "commit", "-qm", "bench"]):
            run(cmd, dest, env)
        import yaml

        stages = list(yaml.safe_load((dest / "dvc.yaml").read_text())["stages"])  # written in pipeline order
        stage_s = {}
        for stage in stages:
            stage_s[stage] = round(run(["dvc", "repro", "-s", stage], dest, env), 1)
            print(f"{stage}: {stage_s[stage]} s", file=sys.stderr, flush=True)
        noop_s = run(["dvc", "repro"], dest, env)
        base = json.loads((dest / "metrics" / "base_report.json").read_text())
        base_timing = json.loads((dest / "metrics" / "base_timing.json").read_text())
        fresh = lock_outs(dest)
        if args.lock_to:
            shutil.copy(dest / "dvc.lock", args.lock_to)
        if args.keep:
            shutil.move(dest, args.keep)
    committed = lock_outs(REPO) if not args.profile and (REPO / "dvc.lock").is_file() else {}
    differing = sorted(p for p in fresh if p in committed and committed[p] != fresh[p])
    print(json.dumps({
        "profile": args.profile or "params.yaml",
        "cpu_count": os.cpu_count(),
        "repro_s": round(sum(stage_s.values()), 1),
        "stage_s": stage_s,
        "noop_repro_s": round(noop_s, 2),
        "base_val_nll": round(base["val_nll"], 4),
        "base_val_unigram_nll": round(base["val_unigram_nll"], 4),
        "base_val_nll_below_unigram": round(base["val_nll_below_unigram"], 4),
        "base_train_tokens_per_s": round(base_timing["train_tokens_per_s"], 1) if base_timing.get("train_tokens_per_s") else None,
        "base_layers_x_heads": f"{base['n_layers']}x{base['n_heads']}",
        **({"outs": len(fresh), "outs_as_committed": sum(committed.get(p) == m for p, m in fresh.items()),
            "outs_differing": differing} if committed else {}),
    }))


if __name__ == "__main__":
    main()
