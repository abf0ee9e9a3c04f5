"""Figures a researcher can open (PNG), rendered with matplotlib's non-interactive backend."""

from __future__ import annotations

from pathlib import Path

from lookahead.core.atomic import atomic_file


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: str | Path, close: bool = True, tight: bool = False) -> None:
    """Write ``fig`` to ``path`` as PNG, atomically (a killed run leaves no half figure), after
    ``tight_layout`` when ``tight``; close it."""
    if tight:
        fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png")
    if close:
        pyplot().close(fig)


def plot_training_curves(train_curve: list[dict], eval_curve: list[dict], path: str | Path, title: str,
                         reference: dict[str, float] | None = None) -> None:
    """Training loss and validation NLL against step, with optional horizontal reference lines."""
    fig, ax = pyplot().subplots(figsize=(7, 4), dpi=120)
    if train_curve:
        ax.plot([r["step"] for r in train_curve], [r["loss"] for r in train_curve], label="train loss", lw=1, alpha=0.8)
    if eval_curve:
        ax.plot([r["step"] for r in eval_curve], [r["val_nll"] for r in eval_curve], "o-", label="val NLL", lw=1.5)
    for label, value in (reference or {}).items():
        ax.axhline(value, ls="--", lw=1, color="gray")
        ax.annotate(label, (0, value), textcoords="offset points", xytext=(4, 3), fontsize=8, color="gray")
    ax.set_xlabel("step")
    ax.set_ylabel("nats / token")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    save_png(fig, path, tight=True)


def fraction_twin(ax, steps: list, fractions: list) -> None:
    """The active-head fraction against step on a right-hand axis of ``ax`` (green, dash-dot)."""
    fx = ax.twinx()
    fx.plot(steps, fractions, color="tab:green", lw=1, ls="-.")
    fx.set(ylabel="active-head fraction (hard, green)", ylim=(0, 1.05))
