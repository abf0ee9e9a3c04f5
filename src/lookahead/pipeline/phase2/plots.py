"""The phase-2 and control stages' plot data (DVC plots, csv) and the phase-2 figure (PNG): training
loss and NLL, and validation NLL of the phase-2 LM (hard and soft topologies, and run dense)."""

from __future__ import annotations

from pathlib import Path

from lookahead.core.atomic import write_csv
from lookahead.train.figures import fraction_twin, pyplot, save_png

TRAIN_COLUMNS = ["step", "loss", "nll", "kl", "replay_nll", "head_gate", "lr", "grad_norm"]
EVAL_COLUMNS = ["step", "hard_nll", "soft_nll", "dense_nll", "active_head_fraction"]


def _rows(curve: list[dict], columns: list[str]) -> list[dict]:
    return [{k: r.get(k, "") if r.get(k) is not None else "" for k in columns} for r in curve]


def plot_curves(train: list[dict], evals: list[dict], path: str | Path) -> None:
    """Left: training loss and NLL; right: val NLL (hard, soft, dense) and the active-head fraction."""
    plt = pyplot()

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4), dpi=110)
    steps = [r["step"] for r in train]
    for key, label in (("loss", "loss (NLL + penalties)"), ("nll", "NLL, trained windows (topologies)"),
                       ("kl", "KL from the dense base (distill)"),
                       ("replay_nll", "NLL, replay windows (dense)")):
        values = [r[key] for r in train]
        if all(v != "" for v in values):
            ax.plot(steps, values, lw=1, label=label)
    ax.set(xlabel="step", ylabel="train nats / token", title="phase 2 - training")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    steps = [r["step"] for r in evals]
    for key, style, label in (("hard_nll", "s-", "hard topologies"), ("soft_nll", "o-", "soft topologies"),
                              ("dense_nll", "^:", "the same LM run dense")):
        values = [r[key] for r in evals]
        if all(v != "" for v in values):
            bx.plot(steps, values, style, lw=1.2, ms=4, label=label)
    bx.set(xlabel="step", ylabel="val nats / token", title="phase 2 - validation (step 0: base + phase-1 decoder)")
    bx.grid(alpha=0.3)
    bx.legend(fontsize=8, loc="upper right")
    fraction_twin(bx, steps, [r["active_head_fraction"] for r in evals])
    save_png(fig, path, tight=True)


def write_phase2_reports(result, outputs: dict) -> None:
    """Every plot file of the phase2 stage (paths in ``outputs``)."""
    train, evals = _rows(result.train_curve, TRAIN_COLUMNS), _rows(result.eval_curve, EVAL_COLUMNS)
    write_csv(outputs["train_curve"], train)
    write_csv(outputs["eval_curve"], evals)
    plot_curves(train, evals, outputs["figure"])


def write_control_reports(result, outputs: dict) -> None:
    """A control stage's curves: training loss and val NLL per step (the static control's: under its
    mask, with the same LM run dense beside)."""
    write_csv(outputs["train_curve"], _rows(result.train_curve, ["step", "loss", "nll", "kl", "replay_nll", "lr"]))
    write_csv(outputs["eval_curve"], [{"step": r["step"], "val_nll": r.get("hard_nll", r["dense_nll"]),
                                       **({"dense_nll": r["dense_nll"]} if "hard_nll" in r else {})}
                                      for r in result.eval_curve])
