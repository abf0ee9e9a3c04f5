"""The phase-1 stage's plot data (DVC plots, csv) and figures (PNG): training and evaluation
curves, the Pareto picture (NLL against active-head fraction) and the active fraction per layer."""

from __future__ import annotations

from pathlib import Path

from lookahead.core.atomic import write_csv
from lookahead.train.figures import fraction_twin, pyplot, save_png

EVAL_COLUMNS = ["step", "dense_nll", "soft_nll", "hard_nll", "active_head_fraction", "active_edge_fraction",
                "below_dense_fraction", "static_pruning_nll", "random_heads_nll", "oracle_nll", "dynamic_fraction",
                "gate_entropy_bits", "context_shuffle_dnll", "tau"]


def pareto_rows(eval_curve: list[dict], static_curve: list[dict]) -> list[dict]:
    """Rows (kind, step, active_head_fraction, nll): static pruning at every whole-head count, the
    dense model, random heads and the hard predictor at each evaluation."""
    rows = [{"kind": "static pruning", "step": "", "active_head_fraction": r["active_head_fraction"], "nll": r["nll"]}
            for r in static_curve]
    final = eval_curve[-1]
    rows.append({"kind": "dense", "step": "", "active_head_fraction": 1.0, "nll": final["dense_nll"]})
    rows += [{"kind": "predictor (hard)", "step": r["step"], "active_head_fraction": r["active_head_fraction"],
              "nll": r["hard_nll"]} for r in eval_curve]
    rows.append({"kind": "random heads", "step": final["step"], "active_head_fraction": final["active_head_fraction"],
                 "nll": final["random_heads_nll"]})
    if final.get("oracle_nll") is not None:
        rows.append({"kind": "oracle (label-free)", "step": final["step"],
                     "active_head_fraction": final["active_head_fraction"], "nll": final["oracle_nll"]})
    return rows


def plot_curves(train_curve: list[dict], eval_curve: list[dict], path: str | Path) -> None:
    """Left: training loss and NLL; right: val NLL (dense, soft, hard, baselines) and active fraction."""
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4), dpi=110)
    steps = [r["step"] for r in train_curve]
    ax.plot(steps, [r["loss"] for r in train_curve], lw=1, label="loss (the objective: weighted NLL, distillation, penalties)")
    ax.plot(steps, [r["nll"] for r in train_curve], lw=1, label="train NLL (soft execution)")
    for key, label in (("distill", "oracle distillation"), ("finetune_kl", "fine-tune: KL(dense ‖ routed)")):
        rows = [r for r in train_curve if r.get(key) is not None]
        if rows:
            ax.plot([r["step"] for r in rows], [r[key] for r in rows], lw=1, label=label)
    ax.set(xlabel="step", ylabel="nats / token", title="phase 1 - training")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    gx = ax.twinx()
    gx.plot(steps, [r["head_gate"] for r in train_curve], color="gray", lw=1, ls=":", label="mean gate")
    gx.set(ylabel="mean gate", ylim=(0, 1.05))
    steps = [r["step"] for r in eval_curve]
    for key, style in (("dense_nll", "k--"), ("soft_nll", "o-"), ("hard_nll", "s-"),
                       ("static_pruning_nll", "v:"), ("random_heads_nll", "x:"), ("oracle_nll", "d:")):
        if all(r.get(key) is not None for r in eval_curve):
            bx.plot(steps, [r[key] for r in eval_curve], style, lw=1.2, ms=4, label=key.replace("_", " "))
    bx.set(xlabel="step", ylabel="val nats / token", title="phase 1 - validation (baselines at the same fraction)")
    bx.grid(alpha=0.3)
    bx.legend(fontsize=8, loc="upper left")
    fraction_twin(bx, steps, [r["active_head_fraction"] for r in eval_curve])
    save_png(fig, path, tight=True)


def plot_pareto(rows: list[dict], path: str | Path, extra_points: list[dict] | None = None) -> None:
    """NLL against active-head fraction: static pruning at every fraction, random heads, dense, the
    predictor's points (its final point highlighted), and any ``extra_points`` (label, fraction, nll)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 5), dpi=110)
    static = [r for r in rows if r["kind"] == "static pruning"]
    ax.plot([r["active_head_fraction"] for r in static], [r["nll"] for r in static], "v-", color="tab:red",
            lw=1.2, ms=4, label="static pruning (probe importance)")
    pred = [r for r in rows if r["kind"] == "predictor (hard)"]
    ax.plot([r["active_head_fraction"] for r in pred], [r["nll"] for r in pred], ".-", color="tab:blue", alpha=0.4,
            lw=0.8, label="predictor during training")
    ax.plot(pred[-1]["active_head_fraction"], pred[-1]["nll"], "*", color="tab:blue", ms=14, label="predictor (hard, final)")
    for kind, marker, color in (("random heads", "X", "tab:orange"), ("dense", "o", "black"),
                                ("oracle (label-free)", "D", "tab:green")):
        for r in (r for r in rows if r["kind"] == kind):
            ax.plot(r["active_head_fraction"], r["nll"], marker, color=color, ms=9, label=kind)
    for i, p in enumerate(extra_points or []):
        ax.plot(p["active_head_fraction"], p["nll"], "P", ms=10, color=f"C{4 + i % 6}", label=p["label"])
    ax.set(xlabel="active-head fraction (mean over head, position)", ylabel="val NLL (nats / token)",
           title="phase 1 - NLL against heads kept")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_png(fig, path, tight=True)


def write_phase1_reports(result, module, metrics: dict, outputs: dict) -> None:
    """Write every plot file of the phase1 stage (paths in ``outputs``)."""
    columns = list(dict.fromkeys(k for row in result.train_curve for k in row))  # fine-tune rows add their KL
    write_csv(outputs["train_curve"], result.train_curve, columns)
    write_csv(outputs["eval_curve"], [{k: r[k] for k in EVAL_COLUMNS} for r in result.eval_curve])
    rows = pareto_rows(result.eval_curve, module.static_curve)
    write_csv(outputs["pareto"], rows)
    write_csv(outputs["layers"], [{"layer": i, "active_head_fraction": f}
                                  for i, f in enumerate(module.last_eval["active_head_fraction_per_layer"])])
    plot_curves(result.train_curve, result.eval_curve, outputs["figure"])
    plot_pareto(rows, outputs["pareto_figure"])
