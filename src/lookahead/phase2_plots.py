"""The phase-2 stage's plot data (DVC plots, csv) and figure (PNG): the joint run's and the dense
control's training loss and validation NLL, step by step on one axis (they see the same windows)."""

from __future__ import annotations

from pathlib import Path

from lookahead.atomic import atomic_file, write_csv


def train_rows(joint: list[dict], control: list[dict]) -> list[dict]:
    """Rows of step, the joint run's loss parts and the control's loss (logged at the same steps)."""
    by_step = {r["step"]: r["loss"] for r in control}
    return [{"step": r["step"], "loss": r["loss"], "nll": r.get("nll", r["loss"]), "head_gate": r.get("head_gate", ""),
             "control_loss": by_step.get(r["step"], "")} for r in joint]


def eval_rows(joint: list[dict], control: list[dict]) -> list[dict]:
    """Rows of step, the phase-2 LM's val NLL (dense, soft, hard), its active fraction and the control's val NLL."""
    by_step = {r["step"]: r["dense_nll"] for r in control}
    return [{"step": r["step"], "hard_nll": r["hard_nll"], "soft_nll": r.get("soft_nll", ""),
             "dense_nll": r["dense_nll"], "control_nll": by_step.get(r["step"], ""),
             "active_head_fraction": r["active_head_fraction"]} for r in joint]


def plot_curves(train: list[dict], evals: list[dict], path: str | Path) -> None:
    """Left: training NLL of the joint run and of the control; right: val NLL and active fraction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4), dpi=110)
    steps = [r["step"] for r in train]
    ax.plot(steps, [r["nll"] for r in train], lw=1, label="phase 2 (its topologies)")
    ax.plot(steps, [r["control_loss"] for r in train], lw=1, label="dense control")
    ax.set(xlabel="step", ylabel="train nats / token", title="phase 2 - training NLL (same windows)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    steps = [r["step"] for r in evals]
    for key, style, label in (("hard_nll", "s-", "phase 2, hard topologies"), ("soft_nll", "o-", "phase 2, soft"),
                              ("dense_nll", "^:", "phase 2 LM run dense"), ("control_nll", "k--", "dense control")):
        values = [r[key] for r in evals]
        if all(v != "" for v in values):
            bx.plot(steps, values, style, lw=1.2, ms=4, label=label)
    bx.set(xlabel="step", ylabel="val nats / token", title="phase 2 - validation")
    bx.grid(alpha=0.3)
    bx.legend(fontsize=8, loc="upper right")
    fx = bx.twinx()
    fx.plot(steps, [r["active_head_fraction"] for r in evals], color="tab:green", lw=1, ls="-.")
    fx.set(ylabel="active-head fraction (hard, green)", ylim=(0, 1.05))
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def write_phase2_reports(result, outputs: dict) -> None:
    """Write every plot file of the phase2 stage (paths in ``outputs``)."""
    train = train_rows(result.joint.train_curve, result.control.train_curve)
    evals = eval_rows(result.joint.eval_curve, result.control.eval_curve)
    write_csv(outputs["train_curve"], train)
    write_csv(outputs["eval_curve"], evals)
    plot_curves(train, evals, outputs["figure"])
