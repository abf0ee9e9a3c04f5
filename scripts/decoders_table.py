"""The README's decoder table (issue: a structure decoder that captures several good topologies),
generated from the diffusion stage's report: every decoder and its nulls × recall@1/4/8 of the val
windows' ε-good keep sets, one-sample NLL and best-of-K NLL (chosen by KL to dense, no label), mean
± sd over the stage's seeds, then the research targets against the figures.

    python scripts/decoders_table.py [metrics/diffusion_report.json]
    python scripts/decoders_table.py --exps d45-default d45-sharp ...   # DVC experiments side by side

``--exps`` reads each experiment's report from the DVC cache (as its dvc.lock records it) and prints
one row per experiment: the params it changed against the first, and for the MLP router's sampler,
the autoregressive decoder and the diffusion head recall@8, one-sample NLL and label-free best of K.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROWS = (("router", "MLP router, top-K (deterministic)"), ("static", "static: the K heads most often eps-good"))
DECODERS = (("baseline", "MLP router's sampler (keep logits + logistic noise)"),
            ("autoregressive", "autoregressive keep-set decoder"), ("diffusion", "diffusion head"))
NULLS = (("marginals", "its per-context marginals"), ("frequency", "its global head frequencies"),
         ("shuffled", "fed shuffled contexts"))


def cell(report: dict, key: str, digits: int) -> str:
    value, sd = report[key], report.get(f"{key}_sd")
    return f"{value:.{digits}f}" + (f" ± {sd:.{digits}f}" if sd is not None else "")


def table(report: dict) -> str:
    k = report["eval_samples"]
    lines = [f"| sampler | recall@1 | recall@4 | recall@{k} | one-sample NLL | best of {k}, least KL (no label) |",
             "|---|---:|---:|---:|---:|---:|"]
    rows = [(name, label) for name, label in ROWS]
    for name, label in DECODERS:
        rows.append((name, f"**{label}**"))
        rows += [(f"{name}_{null}", f"  null: {text}") for null, text in NULLS]
    for name, label in rows:
        lines.append(f"| {label} | " + " | ".join(
            [cell(report, f"{name}_recall_at_{n}", 4) for n in (1, 4, 8)]
            + [cell(report, f"{name}_sample_nll", 3), cell(report, f"{name}_best_of_k_label_free_nll", 3)]) + " |")
    lines.append(f"| dense | | | | {report['dense_nll']:.3f} | |")
    return "\n".join(lines)


def targets(report: dict) -> str:
    ratio = report["recall_at_8"] / max(report["baseline_recall_at_8"], 1e-12)
    out = [f"- diffusion recall@8 / MLP sampler's: {ratio:.2f} (target >= 2)",
           f"- diffusion one-sample NLL {report['sample_nll']:.3f} vs router top-K {report['deterministic_nll']:.3f} "
           f"(target <=)"]
    for name, _ in DECODERS:
        gap = report[f"{name}_frequency_best_of_k_label_free_nll"] - report[f"{name}_best_of_k_label_free_nll"]
        sd = max(report.get(f"{name}_best_of_k_label_free_nll_sd", 0.0),
                 report.get(f"{name}_frequency_best_of_k_label_free_nll_sd", 0.0))
        out.append(f"- {name}: best-of-8 below its frequency null by {gap:+.3f} = {gap / sd if sd else float('inf'):.1f} sd "
                   "(target > 3 sd)")
    return "\n".join(out)


def experiments(names: list[str]) -> str:
    from connectivity_table import cached  # this directory: python puts a script's own directory on sys.path
    from phase2_table import resolve, show

    import yaml

    def flat(d: dict, prefix: str = "") -> dict:
        out = {}
        for key, value in d.items():
            out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
        return out

    params = [flat({k: v for k, v in yaml.safe_load(show(resolve(n), "params.yaml")).items()
                    if k in ("pairs", "diffusion")}) for n in names]
    lines = ["| experiment | changed | " + " | ".join(f"{label}: recall@8 / one-sample NLL / best of K"
                                                       for label in ("router's sampler", "autoregressive", "diffusion"))
             + " |", "|---|---|---:|---:|---:|"]
    for name, p in zip(names, params):
        report = json.loads(cached(resolve(name), "metrics/diffusion_report.json").read_text())
        # a param the reference's revision did not have yet counts as changed only when it is on
        changed = ", ".join(f"{k}={v}" for k, v in p.items()
                            if (params[0][k] != v if k in params[0] else v not in (False, None))) or "(reference)"
        cells = [f"{cell(report, f'{d}_recall_at_8', 4)} / {cell(report, f'{d}_sample_nll', 3)} / "
                 f"{cell(report, f'{d}_best_of_k_label_free_nll', 3)}" for d, _ in DECODERS]
        lines.append(f"| `{name}` | {changed} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--exps"]:
        print(experiments(argv[1:]))
        return
    report = json.loads(Path(argv[0] if argv else "metrics/diffusion_report.json").read_text())
    print(table(report))
    print()
    print(targets(report))


if __name__ == "__main__":
    main(sys.argv[1:])
