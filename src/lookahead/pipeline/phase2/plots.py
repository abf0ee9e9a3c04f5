"""The phase-2 stage's plot data (DVC plots, csv) and figures (PNG): training
loss and NLL, and validation NLL of the phase-2 LM (hard and soft topologies, and run dense)."""

from __future__ import annotations

from pathlib import Path

from lookahead.core.atomic import write_csv
from lookahead.pipeline.phase2.common import curve_rows
from lookahead.train.figures import fraction_twin, pyplot, save_png

TRAIN_COLUMNS = ["step", "loss", "nll", "kl", "replay_nll", "head_gate", "lr", "grad_norm"]
EVAL_COLUMNS = ["step", "hard_nll", "soft_nll", "dense_nll", "active_head_fraction"]


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
    train, evals = curve_rows(result.train_curve, TRAIN_COLUMNS), curve_rows(result.eval_curve, EVAL_COLUMNS)
    write_csv(outputs["train_curve"], train)
    write_csv(outputs["eval_curve"], evals)
    plot_curves(train, evals, outputs["figure"])


def plot_connectivity(mean, sd, n_layers: int, n_heads: int, path: str | Path, title: str) -> None:
    """The learned edge weights W (N, N) of free connectivity, one row per head that reads, one column
    per source (the embedding, then the heads of every earlier layer), coloured around 1 (the plain
    residual stream: white); blanks are edges the graph does not allow. ``sd`` (N, N) or None: beside
    it, the weights' spread over positions (dynamic weights). After DenseFormer's figure of its learned
    depth weights."""
    import textwrap

    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    plt = pyplot()
    n = 1 + n_layers * n_heads
    sources = 1 + (n_layers - 1) * n_heads  # the last layer's heads feed no head
    allowed = np.zeros((n, n), dtype=bool)
    layer = np.concatenate([[-1], np.repeat(np.arange(n_layers), n_heads)])
    allowed[layer[:, None] < layer[None, :]] = True
    panels = [("mean over val positions" if sd is not None else "static weights", np.asarray(mean), "RdBu_r")]
    if sd is not None:
        panels.append(("sd over val positions", np.asarray(sd), "viridis"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 5.0), dpi=110, squeeze=False)
    for ax, (label, w, cmap) in zip(axes[0], panels):
        shown = np.where(allowed, w, np.nan)[:sources, 1:].T  # rows: heads that read; columns: sources
        if cmap == "RdBu_r":
            lim = max(float(np.nanmax(np.abs(shown - 1))), 1e-3)
            im = ax.imshow(shown, cmap=cmap, norm=TwoSlopeNorm(1.0, 1.0 - lim, 1.0 + lim), aspect="auto")
        else:
            im = ax.imshow(shown, cmap=cmap, aspect="auto")
        fig.colorbar(im, ax=ax, fraction=0.046)
        for k in range(1, n_layers):  # layer boundaries: readers below, sources (after the embedding) across
            ax.axhline(k * n_heads - 0.5, color="0.4", lw=0.6)
            ax.axvline(1 + (k - 1) * n_heads - 0.5, color="0.4", lw=0.6)
        ax.set_yticks([l * n_heads + (n_heads - 1) / 2 for l in range(n_layers)], [f"layer {l}" for l in range(n_layers)])
        ax.set_xticks([0] + [1 + l * n_heads + (n_heads - 1) / 2 for l in range(n_layers - 1)],
                      ["emb"] + [f"L{l}" for l in range(n_layers - 1)])
        ax.set(xlabel="source (embedding, heads by layer)", ylabel="head that reads", title=label)
    fig.suptitle(textwrap.fill(title, 60 * len(panels)), fontsize=9)
    save_png(fig, path, tight=True)
