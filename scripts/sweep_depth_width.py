"""Depth versus width at equal parameters and tokens, as DVC experiments of the base stage.

The seed study "Hidden Topology: Depth vs. Width" trained three ~5 M-parameter models (12 layers x
hidden 128, 6 x 192, 3 x 256; head dim 32) on one budget and found the shallow-wide one best. This
queues the same three shapes on this pipeline's corpus (`dvc exp run --queue base -S ...`), runs
the queue (one experiment at a time: they share the CPU), and writes the comparison:

    metrics/depth_width.json   one row per shape (+ the budget)
    metrics/depth_width.csv    the same rows, for `dvc plots` or a spreadsheet
    metrics/depth_width.png    val NLL curves, final val NLL and throughput

Usage: make sweep-depth-width [SWEEP_ARGS="--steps 300"]   (or python scripts/sweep_depth_width.py)
--collect-only rebuilds the table from experiments already run. Run it from the repository root.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
from pathlib import Path

SHAPES = ((12, 128), (6, 192), (3, 256))
HEAD_DIM = 32
OUT = Path("metrics")


def name(layers: int, hidden: int) -> str:
    return f"dw-{layers}x{hidden}"


def overrides(layers: int, hidden: int, args) -> list[str]:
    """`-S` values of one shape: heads of HEAD_DIM, a 4x SwiGLU width, the shared budget."""
    values = {
        "base.arch.n_layers": layers, "base.arch.hidden_size": hidden, "base.arch.n_heads": hidden // HEAD_DIM,
        "base.arch.intermediate_size": 4 * hidden, "base.train.steps": args.steps,
        "base.train.batch_size": args.batch_size, "base.train.warmup_steps": max(1, args.steps // 10),
        "base.train.eval_every": max(1, args.steps // 3), "base.train.checkpoint_every": max(1, args.steps // 3),
    }
    return [a for k, v in values.items() for a in ("-S", f"{k}={v}")]


def dvc(*argv: str, capture: bool = False) -> str:
    proc = subprocess.run(["dvc", *argv], text=True, capture_output=capture)
    if proc.returncode != 0:
        sys.exit(f"error: dvc {' '.join(argv)} failed ({proc.returncode})" + (f":\n{proc.stderr}" if capture else ""))
    return proc.stdout if capture else ""


def existing_experiments() -> set[str]:
    import dvc.api

    return {row.get("Experiment") for row in dvc.api.exp_show(force=True)}


def run(args) -> None:
    names = [name(*s) for s in SHAPES]
    clash = sorted(set(names) & existing_experiments())
    if clash and not args.replace:
        sys.exit(f"error: experiments {', '.join(clash)} exist: pass --replace to run them again, "
                 "or --collect-only to tabulate them")
    if clash:
        dvc("exp", "remove", *clash)
    for layers, hidden in SHAPES:
        dvc("exp", "run", "--queue", "base", "-n", name(layers, hidden), *overrides(layers, hidden, args))
    dvc("exp", "run", "--run-all", "-j", "1")  # one at a time: throughput is measured


def collect(args) -> list[dict]:
    """One row per shape, from the experiments' metrics (git) and base reports (DVC cache)."""
    import dvc.api

    found = {row.get("Experiment"): row for row in dvc.api.exp_show(force=True)}
    rows, curves = [], {}
    for layers, hidden in SHAPES:
        exp = found.get(name(layers, hidden))
        if exp is None:
            sys.exit(f"error: no experiment {name(layers, hidden)}: run the sweep first")
        rev = subprocess.run(["git", "rev-parse", exp["rev"]], capture_output=True, text=True, check=True).stdout.strip()
        report = json.loads(dvc.api.read("metrics/base_report.json", rev=rev))
        curves[name(layers, hidden)] = list(csv.DictReader(io.StringIO(dvc.api.read("metrics/base_val.csv", rev=rev))))
        base = dvc.api.params_show(rev=rev)["base"]
        tokens = base["train"]["steps"] * base["train"]["batch_size"] * base["arch"]["context_length"]
        rows.append({
            "experiment": name(layers, hidden), "n_layers": layers, "hidden_size": hidden,
            "n_heads": hidden // HEAD_DIM, "parameters": report["parameters"], "train_tokens": tokens,
            "val_nll": report["val_nll"], "val_ppl": report["val_ppl"],
            "train_tokens_per_s": report["train_tokens_per_s"], "train_wall_s": report["train_wall_s"],
            "rev": rev[:12],
        })
    return rows, curves


def write(rows: list[dict], curves: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sys.path.insert(0, "src")
    from lookahead.core.atomic import atomic_file, write_csv, write_json

    best = min(rows, key=lambda r: r["val_nll"])
    ordering = " < ".join(r["experiment"] for r in sorted(rows, key=lambda r: r["val_nll"]))
    write_json(OUT / "depth_width.json", {"rows": rows, "best": best["experiment"], "val_nll_order": ordering})
    write_csv(OUT / "depth_width.csv", rows)

    fig, axes = plt.subplots(1, 3, figsize=(14, 4), dpi=110)
    for exp, curve in curves.items():
        axes[0].plot([int(r["step"]) for r in curve], [float(r["val_nll"]) for r in curve], marker="o", label=exp)
    axes[0].set(title="val NLL during training", xlabel="step", ylabel="val NLL (nats/token)")
    axes[0].legend()
    labels = [f"{r['n_layers']}x{r['hidden_size']}\n{r['parameters'] / 1e6:.2f} M" for r in rows]
    axes[1].bar(labels, [r["val_nll"] for r in rows], color="tab:blue")
    axes[1].set(title="final val NLL (lower is better)", ylabel="nats/token",
                ylim=(min(r["val_nll"] for r in rows) - 0.2, max(r["val_nll"] for r in rows) + 0.1))
    axes[2].bar(labels, [r["train_tokens_per_s"] for r in rows], color="tab:green")
    axes[2].set(title="training throughput", ylabel="tokens/s")
    fig.suptitle(f"depth vs width at {rows[0]['train_tokens'] / 1e6:.2f} M train tokens each (head dim {HEAD_DIM})")
    fig.tight_layout()
    with atomic_file(OUT / "depth_width.png") as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    print(f"{'shape':>8} {'params':>9} {'val NLL':>8} {'val PPL':>8} {'tok/s':>7} {'wall s':>7}")
    for r in rows:
        print(f"{r['n_layers']:>3}x{r['hidden_size']:<4} {r['parameters']:>9,} {r['val_nll']:8.3f} {r['val_ppl']:8.1f} "
              f"{r['train_tokens_per_s']:7.0f} {r['train_wall_s']:7.0f}")
    print(f"val NLL order: {ordering}; written to {OUT}/depth_width.{{json,csv,png}}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps of each model (default 300)")
    parser.add_argument("--batch-size", type=int, default=32, help="windows per step (default 32)")
    parser.add_argument("--replace", action="store_true", help="remove earlier dw-* experiments and rerun")
    parser.add_argument("--collect-only", action="store_true", help="tabulate experiments already run")
    args = parser.parse_args(argv)
    if args.steps < 3 or args.batch_size < 1:
        parser.error("--steps must be >= 3 and --batch-size >= 1")
    if not Path("dvc.yaml").is_file():
        parser.error("run from the repository root (dvc.yaml not found)")
    if not args.collect_only:
        run(args)
    write(*collect(args))


if __name__ == "__main__":
    main()
