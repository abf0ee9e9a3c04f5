"""The diffusion stage's plot data (DVC plots, csv) and figures (PNG): the training curve with the
held-out BCE, and the samplers side by side (NLL against density, diversity, mode recall)."""

from __future__ import annotations

from pathlib import Path

from lookahead.core.atomic import write_csv
from lookahead.train.figures import pyplot, save_png

SAMPLER_LABELS = {"diffusion": "diffusion head", "baseline": "predictor noise (baseline)",
                  "explore": "predictor + flips (made the pairs)"}


def sampler_rows(report: dict) -> list[dict]:
    """One row per sampler (and the reference points) for ``metrics/diffusion_samplers.csv``."""
    rows = []
    for name, s in report["samplers"].items():
        rows.append({"sampler": SAMPLER_LABELS.get(name, name), "sample_nll": s["sample_nll"],
                     "best_of_k_nll": s["best_of_k_nll"], "density": s["density"],
                     "active_head_fraction": s["active_head_fraction"],
                     "within_context_hamming": s["within_context_hamming"],
                     "across_context_hamming": s["across_context_hamming"], "mode_recall": s["mode_recall"]})
    for label, nll, heads in (("dense", report["dense_nll"], 1.0),
                              ("predictor deterministic", report["deterministic_nll"],
                               report["deterministic_active_head_fraction"])):
        rows.append({"sampler": label, "sample_nll": nll, "best_of_k_nll": nll, "density": "",
                     "active_head_fraction": heads, "within_context_hamming": 0.0, "across_context_hamming": "",
                     "mode_recall": ""})
    return rows


def plot_curves(train_curve: list[dict], eval_curve: list[dict], path: str | Path) -> None:
    """Training BCE and the held-out BCE against step."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot([r["step"] for r in train_curve], [r["loss"] for r in train_curve], lw=1, label="train BCE (a_0 | a_t)")
    ax.plot([r["step"] for r in eval_curve], [r["val_bce"] for r in eval_curve], "o-", lw=1.5,
            label="held-out pairs BCE (fixed noisy draws)")
    ax.set(xlabel="step", ylabel="BCE per edge (nats)", title="diffusion head - training")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_png(fig, path, tight=True)


def plot_comparison(report: dict, path: str | Path) -> None:
    """Left: val NLL (one sample and best-of-K) against edge density for each sampler, with dense and
    the deterministic topology; right: diversity within vs across contexts and mode recall."""
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8), dpi=110)
    k = report["eval_samples"]
    for i, (name, s) in enumerate(report["samplers"].items()):
        color = f"C{i}"
        ax.plot(s["density"], s["sample_nll"], "o", color=color, ms=9, label=f"{SAMPLER_LABELS[name]}: one sample")
        ax.plot(s["density"], s["best_of_k_nll"], "*", color=color, ms=13, label=f"{SAMPLER_LABELS[name]}: best of {k}")
    ax.axhline(report["dense_nll"], color="black", ls="--", lw=1, label="dense")
    ax.axhline(report["deterministic_nll"], color="gray", ls=":", lw=1.2, label="predictor deterministic")
    ax.axvline(report["pairs_density"], color="tab:green", ls="-.", lw=1, label="pair set density")
    ax.set(xlabel="edge density of samples (active edges / allowed edges)", ylabel="val NLL (nats / token)",
           title="held-out LM NLL under sampled topologies")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    names = list(report["samplers"])
    x = range(len(names))
    within = [report["samplers"][n]["within_context_hamming"] for n in names]
    across = [report["samplers"][n]["across_context_hamming"] for n in names]
    bx.bar([i - 0.2 for i in x], within, width=0.4, label="Hamming within a context")
    bx.bar([i + 0.2 for i in x], across, width=0.4, label="Hamming across contexts")
    bx.set_xticks(list(x), [SAMPLER_LABELS[n].replace(" (", "\n(") for n in names], fontsize=8)
    bx.set(ylabel="mean Hamming distance (bits)", title=f"diversity and mode recall (K = {k}, radius "
           f"{report['recall_radius']}, {report['recall_positions']} held-out positions)")
    rx = bx.twinx()
    rx.plot(list(x), [report["samplers"][n]["mode_recall"] or 0.0 for n in names], "kD-", ms=8, label="mode recall")
    rx.set(ylabel="mode recall (black)", ylim=(0, 1.05))
    bx.legend(fontsize=8, loc="upper left")
    bx.grid(alpha=0.3, axis="y")
    save_png(fig, path, tight=True)


def write_diffusion_reports(result, report: dict, outputs: dict) -> None:
    """Write every plot file of the diffusion stage (paths in ``outputs``)."""
    write_csv(outputs["train_curve"], result.train_curve)
    write_csv(outputs["eval_curve"], result.eval_curve)
    write_csv(outputs["samplers"], sampler_rows(report))
    plot_curves(result.train_curve, result.eval_curve, outputs["figure"])
    plot_comparison(report, outputs["comparison_figure"])
