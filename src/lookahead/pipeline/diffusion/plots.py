"""The diffusion stage's plot data (DVC plots, csv) and figures (PNG): the training curve with the
held-out BCE, and the samplers side by side (on ε-good pairs: every decoder and null's recall and
NLL; on beats_dense pairs: NLL against density, diversity, mode recall)."""

from __future__ import annotations

from pathlib import Path

from lookahead.core.atomic import write_csv
from lookahead.pipeline.diffusion.decoders import SAMPLERS
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


KEEPSET_FIGURES = ("recall_at_1", "recall_at_4", "recall_at_8", "sample_nll", "best_of_k_label_free_nll",
                   "best_of_k_target_nll", "distinct_per_position")


def keepset_samplers(report: dict) -> list[str]:
    """The samplers a keep-set report holds, in the table's order (the references, then each decoder
    and its nulls)."""
    return [name for name in SAMPLERS if f"{name}_recall_at_8" in report]


def keepset_rows(report: dict) -> list[dict]:
    """One row per sampler for ``metrics/diffusion_samplers.csv`` (ε-good pairs): each figure and its sd."""
    rows = []
    for name in keepset_samplers(report):
        row = {"sampler": name}
        for fig in KEEPSET_FIGURES:
            row[fig] = report.get(f"{name}_{fig}")
            row[f"{fig}_sd"] = report.get(f"{name}_{fig}_sd", "")
        rows.append(row)
    return rows


def plot_keepsets(report: dict, path: str | Path) -> None:
    """Left: recall@1/4/8 of the val ε-good sets per sampler; right: one-sample and label-free
    best-of-K NLL per sampler, with dense and the router's deterministic NLL (bars: mean, whiskers: sd
    over seeds)."""
    plt = pyplot()
    names = keepset_samplers(report)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 5), dpi=110)
    x = list(range(len(names)))
    for i, n in enumerate((1, 4, 8)):
        ax.bar([j + (i - 1) * 0.27 for j in x], [report[f"{s}_recall_at_{n}"] for s in names], width=0.27,
               yerr=[report.get(f"{s}_recall_at_{n}_sd", 0.0) for s in names], label=f"recall@{n}")
    ax.set_xticks(x, names, rotation=60, ha="right", fontsize=8)
    ax.set(ylabel="share of a position's eps-good sets recovered",
           title=f"recall of the eps-good keep sets ({report['truth_positions']} val positions)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    k = report["eval_samples"]
    for off, fig_key, label in ((-0.2, "sample_nll", "one sample"),
                                (0.2, "best_of_k_label_free_nll", f"best of {k} by KL to dense (no label)")):
        bx.bar([j + off for j in x], [report[f"{s}_{fig_key}"] for s in names], width=0.4,
               yerr=[report.get(f"{s}_{fig_key}_sd", 0.0) for s in names], label=label)
    bx.axhline(report["dense_nll"], color="black", ls="--", lw=1, label="dense")
    bx.axhline(report["deterministic_nll"], color="gray", ls=":", lw=1.2, label="router top-K")
    low = min(report["dense_nll"], *(report[f"{s}_best_of_k_label_free_nll"] for s in names))
    bx.set_ylim(low - 0.1, max(report[f"{s}_sample_nll"] for s in names) + 0.1)
    bx.set_xticks(x, names, rotation=60, ha="right", fontsize=8)
    bx.set(ylabel="val NLL (nats / token)", title=f"LM NLL under the samplers' keep sets (K = {report['heads_kept']} heads)")
    bx.grid(alpha=0.3, axis="y")
    bx.legend(fontsize=8)
    save_png(fig, path, tight=True)


def write_diffusion_reports(result, report: dict, outputs: dict) -> None:
    """Write every plot file of the diffusion stage (paths in ``outputs``)."""
    write_csv(outputs["train_curve"], result.train_curve)
    write_csv(outputs["eval_curve"], result.eval_curve)
    if "samplers" in report:
        write_csv(outputs["samplers"], sampler_rows(report))
        plot_comparison(report, outputs["comparison_figure"])
    else:  # the decoders on eps-good pairs
        write_csv(outputs["samplers"], keepset_rows(report))
        plot_keepsets(report, outputs["comparison_figure"])
    plot_curves(result.train_curve, result.eval_curve, outputs["figure"])
