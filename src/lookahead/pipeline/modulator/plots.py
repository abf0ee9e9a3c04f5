"""The modulator stage's outputs besides the model and its metrics: plot data (DVC plots, csv) and
a PNG of training, α per layer and alignment."""

from __future__ import annotations

from pathlib import Path

from lookahead.core.atomic import write_csv
from lookahead.train.figures import pyplot, save_png


def band_rows(report: dict) -> list[dict]:
    """Mean contextual cosine per WordNet path-similarity band, before and after."""
    return [{"series": when, "band": b["band"], "n": b["n"], "mean_cosine": b["mean_cosine"]}
            for when in ("before", "after") for b in report[when]["bands"]]


def plot_modulator(train_curve: list[dict], eval_curve: list[dict], alpha_rows: list[dict], report: dict,
                   path: str | Path) -> None:
    """Four panels: training NLL and val NLL; α per layer against step; cosine by similarity band,
    and along hypernym chains, before and after."""
    plt = pyplot()

    fig, (ax, bx, cx, dx) = plt.subplots(1, 4, figsize=(19, 4), dpi=110)
    if train_curve:
        ax.plot([r["step"] for r in train_curve], [r["loss"] for r in train_curve], lw=1, label="train NLL (modulated)")
    if eval_curve:
        ax.plot([r["step"] for r in eval_curve], [r["val_nll"] for r in eval_curve], "o-", ms=4, label="val NLL (modulated)")
    ax.axhline(report["val_nll_before"], color="gray", ls="--", lw=1, label="val NLL, base model")
    ax.axhline(report["val_nll_before"] * 1.01, color="tab:red", ls=":", lw=1, label="+1 % (coherence limit)")
    ax.set(xlabel="step", ylabel="nats / token", title=f"modulator - NLL (LM frozen): {report['val_nll_before']:.3f} → "
                                                       f"{report['val_nll_after']:.3f}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    names = list(dict.fromkeys(r["series"] for r in alpha_rows))
    experts = list(dict.fromkeys(n.partition(", ")[2] for n in names))  # "k=1", … ("" for LERP)
    layers = list(dict.fromkeys(n.partition(", ")[0] for n in names))
    for series in names:  # the field modulator's: colour = layer, line style = expert
        rows = [r for r in alpha_rows if r["series"] == series]
        layer, _, expert = series.partition(", ")
        bx.plot([r["step"] for r in rows], [r["alpha"] for r in rows], marker="o" if len(rows) == 1 else None, lw=1.2,
                label=series, color=f"C{layers.index(layer) % 10}", ls=("-", "--", ":", "-.")[experts.index(expert) % 4])
    field = report["kind"] == "field"
    bx.set(xlabel="step", ylabel="α", title=f"{report['kind']} modulator - α per layer" + (" and expert" if field else "")
                                           + ("" if report["trained"] else " (fixed)"))
    bx.grid(alpha=0.3)
    bx.legend(fontsize=7 if field else 8, ncol=2 if field else 1)
    bands = band_rows(report)
    labels = list(dict.fromkeys(r["band"] for r in bands))
    for offset, when in ((-0.2, "before"), (0.2, "after")):
        values = [next((r["mean_cosine"] for r in bands if r["series"] == when and r["band"] == b), None) or 0.0
                  for b in labels]
        cx.bar([i + offset for i in range(len(labels))], values, width=0.4, label=when)
    cx.set_xticks(range(len(labels)), labels, fontsize=8)
    cx.set(xlabel="WordNet path similarity band", ylabel="mean cosine of gloss encodings",
           title=f"alignment - Spearman {report['spearman_before']:.3f} → {report['spearman_after']:.3f}")
    cx.grid(alpha=0.3, axis="y")
    cx.legend(fontsize=8)
    for when, style in (("before", "o--"), ("after", "s-")):
        decay = report[when]["chain_decay"]
        dx.plot(range(1, len(decay) + 1), decay, style, lw=1.2, ms=4, label=when)
    dx.set_xticks(range(1, len(report["before"]["chain_decay"]) + 1))
    dx.set(xlabel="k (hypernym steps up)", ylabel="cosine of gloss encodings",
           title="cosine to the k-th hypernym")
    dx.grid(alpha=0.3)
    dx.legend(fontsize=8)
    save_png(fig, path, tight=True)


def write_modulator_reports(result, alpha_rows: list[dict], report: dict, outputs: dict) -> None:
    """Every plot file of the modulator stage (paths in ``outputs``)."""
    train = [{"step": r["step"], "loss": r["loss"], "lr": r["lr"]} for r in (result.train_curve if result else [])]
    evals = [{"step": r["step"], "val_nll": r["val_nll"]} for r in (result.eval_curve if result else [])]
    if not evals:  # nothing trained (a fixed α): the curve is the two measurements
        evals = [{"step": 0, "val_nll": report["val_nll_after"]}]
    write_csv(outputs["train_curve"], train, fieldnames=["step", "loss", "lr"])
    write_csv(outputs["eval_curve"], evals, fieldnames=["step", "val_nll"])
    write_csv(outputs["alpha_curve"], alpha_rows, fieldnames=["step", "series", "alpha"])
    write_csv(outputs["bands"], band_rows(report), fieldnames=["series", "band", "n", "mean_cosine"])
    plot_modulator(train, evals if result else [], alpha_rows, report, outputs["figure"])
