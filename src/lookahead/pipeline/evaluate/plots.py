"""The evaluate stage's outputs besides its metrics: the table as markdown, the DVC plot data
(Pareto: NLL against active-head fraction for every row; active fraction per layer) and the
explainer figure — a PNG and a self-contained HTML page holding the same figure as inline SVG (text
drawn as paths: no script, style sheet or font is fetched)."""

from __future__ import annotations

import html
import io
from pathlib import Path

import numpy as np

from lookahead.core.atomic import write_csv, write_text
from lookahead.train.figures import pyplot, save_png

LABELS = {
    "dense_base": ("base", "dense"),
    "phase1_soft": ("base", "phase-1 predictor, soft"),
    "phase1_hard": ("base", "phase-1 predictor, hard"),
    "diffusion_sample": ("base", "diffusion, one sample"),
    "diffusion_best_of_k": ("base", "diffusion, best of K (oracle)"),
    "phase2_soft": ("phase 2", "its predictor, soft"),
    "phase2_hard": ("phase 2", "its decoder, hard"),
    "dense_control": ("control", "dense"),
    "static_control": ("static control", "static pruning (importance), trained under it"),
    "static_pruning": ("control", "static pruning (importance)"),
    "random_heads": ("control", "random per-token heads"),
    "static_pruning_phase2": ("phase 2", "static pruning (importance)"),
    "random_heads_phase2": ("phase 2", "random per-token heads"),
    "random_sample": ("base", "random heads at the diffusion fraction, one of K (null)"),
    "random_best_of_k": ("base", "random heads, best of K (null of the oracle choice)"),
}


def _num(value, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def table_markdown(report: dict) -> str:
    """The final table (one row per LM and topology) with a short legend."""
    lines = [
        "| row | LM | topology | val NLL | PPL | active heads | active edges | heads per layer | attention FLOPs / dense |",
        "|---|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for name, row in report["table"].items():
        if name not in LABELS:
            raise KeyError(f"evaluate row {name!r} has no label: add it to lookahead.pipeline.evaluate.plots.LABELS")
        lm, topology = LABELS[name]
        per_layer = " ".join(f"{f:.2f}" for f in row["active_head_fraction_per_layer"])
        lines.append(f"| `{name}` | {lm} | {topology} | {_num(row['nll'])} | {_num(row['ppl'], 1)} | "
                     f"{_num(row['active_head_fraction'])} | {_num(row['active_edge_fraction'])} | {per_layer} | "
                     f"{_num(row['attention_only_flops_over_dense'])} |")
    c = report["causality"]
    lines += [
        "",
        f"{report['val_positions']} val positions; decoder of phase 2: `{report['decoder']}`; baselines at the phase-2 "
        f"hard row's active-head fraction ({report['phase2_active_head_fraction']:.3f}). Soft rows: mean gate and edge "
        "weight (every head is computed). Tokens/s of each row's forward over the stock dense forward of the same "
        f"batch ({report['timing_device']}): `metrics/evaluate_timing.json` (timings are not results: see "
        "`lookahead.core.report`). Causality (§4.5): largest change at <= t "
        f"{c['max_change']:.3g} over {c['windows']} windows x {len(c['cuts'])} cuts, "
        f"{'passed' if c['passed'] else 'FAILED'}.",
    ]
    return "\n".join(lines) + "\n"


def pareto_rows(report: dict, static_curve: list[dict]) -> list[dict]:
    rows = [{"row": name, "active_head_fraction": r["active_head_fraction"], "nll": r["nll"]}
            for name, r in report["table"].items()]
    rows += [{"row": "static pruning curve (control)", "active_head_fraction": r["active_head_fraction"], "nll": r["nll"]}
             for r in static_curve]
    return rows


def layer_rows(report: dict) -> list[dict]:
    rows = []
    for name in ("phase1_hard", "diffusion_sample", "phase2_hard", "static_pruning"):
        if name in report["table"]:
            for layer, f in enumerate(report["table"][name]["active_head_fraction_per_layer"]):
                rows.append({"series": name, "layer": layer, "active_head_fraction": f})
    return rows


# ------------------------------------------------------------------------------ the explainer


def _box(ax, xy, text, color):
    ax.text(*xy, text, ha="center", va="center", fontsize=9, transform=ax.transAxes,
            bbox={"boxstyle": "round,pad=0.5", "fc": color, "ec": "0.3"})


def _flow(ax, info: dict) -> None:
    """Panel a: the data flow, annotated with the run's real shapes."""
    ax.axis("off")
    if info.get("router_input", "cache") == "cache":
        reads = f"context encoder\n{info['encoder']} ({info['context_dim']}-d)\nsees tokens <= t only"
    else:  # the LM's own states (lookahead.graph.router_inputs)
        reads = {"lm": "router input: the LM's\ntoken embedding at t +\nfinal state at t-1",
                 "embedding": "router input: the LM's\ntoken embedding at t"}[info["router_input"]]
    if info.get("gate", "cascade") == "head":
        routes = (f"structure predictor\nMLP -> keep logits ({info['nodes'] - 1})\ntop {info['kept']} per token"
                  + (f", {info['shared']} shared" if info.get("shared") else ""))
    else:
        routes = f"structure predictor\nMLP -> U, V ({info['nodes']} x {info['rank']})\nZ = U V' + B"
    boxes = [
        ((0.07, 0.5), f"val text\n(window of {info['context_length']} tokens)", "0.93"),
        ((0.24, 0.5), reads, "#dbe9f6"),
        ((0.43, 0.5), routes, "#fde2c8"),
        ((0.62, 0.5), f"gated head graph\nA ({info['nodes']} x {info['nodes']}), gates g\n"
                      f"{info['n_layers']} layers x {info['n_heads']} heads", "#d9f0d3"),
        ((0.80, 0.5), "OLMo2 LM (phase 2)\nhead j reads\nx_j = sum_i A[i,j] o_i + MLPs", "#e5dcf0"),
        ((0.95, 0.5), "next-token\nlogits", "0.93"),
    ]
    for xy, text, color in boxes:
        _box(ax, xy, text, color)
    xs = [b[0][0] for b in boxes]
    half = [0.06, 0.07, 0.07, 0.07, 0.075, 0.035]  # half-widths of the boxes (axes fraction)
    for i in range(len(xs) - 1):
        ax.annotate("", xy=(xs[i + 1] - half[i + 1], 0.5), xytext=(xs[i] + half[i], 0.5), xycoords="axes fraction",
                    arrowprops={"arrowstyle": "->", "lw": 1.4, "color": "0.25"})
    _box(ax, (0.43, 0.1), "token's geometric features\n(WordNet eigen-embedding, init stage)", "#fff6bf")
    ax.annotate("", xy=(0.43, 0.3), xytext=(0.43, 0.2), xycoords="axes fraction",
                arrowprops={"arrowstyle": "->", "lw": 1.2, "color": "0.25"})
    ax.set_title("a  data flow: a per-token head graph predicted from the context alone", loc="left", fontsize=11)


def _token_grid(ax, data: dict, n_layers: int, n_heads: int) -> None:
    """Panel b: each shown token's hard gates as a layer x head block."""
    gates = np.asarray(data["gates"])[:, 1:].reshape(-1, n_layers, n_heads)  # (T', L, H)
    t = gates.shape[0]
    image = np.full((n_layers, t * (n_heads + 1)), np.nan)
    for i in range(t):
        image[:, i * (n_heads + 1) : i * (n_heads + 1) + n_heads] = gates[i]
    cmap = pyplot().get_cmap("Blues").with_extremes(bad="white")
    ax.imshow(image, origin="lower", cmap=cmap, vmin=-0.25, vmax=1, aspect="auto", interpolation="nearest")
    ax.set_xticks([i * (n_heads + 1) + (n_heads - 1) / 2 for i in range(t)])
    ax.set_xticklabels([repr(p)[1:-1] for p in data["tokens"]], rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(n_layers))
    ax.set_ylabel("layer")
    token = data["token"]
    ax.axvspan(token * (n_heads + 1) - 0.5, token * (n_heads + 1) + n_heads - 0.5, fill=False, ec="tab:red", lw=1.5)
    ax.set_title(f"b  one val sentence (window {data['window']}): heads that run at each token (dark = on; "
                 f"columns = heads of a layer; red = the token drawn in c)", loc="left", fontsize=11)


def _dag(ax, data: dict, n_layers: int, n_heads: int) -> None:
    """Panel c: the chosen token's head graph, nodes by layer, edge widths from A; free connectivity
    (weights of either sign or above 1): widths from |A|, colour = sign (blue +, red −)."""
    from matplotlib.collections import LineCollection

    a = np.asarray(data["adjacency"])
    g = np.asarray(data["graph_gates"])
    hard = np.asarray(data["hard_gates_of_token"])
    free = bool((a < 0).any() or (a > 1).any())
    pos = [((n_heads - 1) / 2, -1.0)] + [(h, layer) for layer in range(n_layers) for h in range(n_heads)]
    scale = max(float(np.abs(a).max()), 1e-9) if free else 1.0
    segments, widths, colors = [], [], []
    src, dst = np.nonzero(np.abs(a) > 0.02 * scale)
    for i, j in zip(src, dst):
        segments.append([pos[i], pos[j]])
        widths.append(0.3 + 3.0 * abs(a[i, j]) / scale)
        colors.append("tab:blue" if a[i, j] > 0 else "tab:red")
    ax.add_collection(LineCollection(segments, linewidths=widths, colors=colors, alpha=0.35))
    xs, ys = zip(*pos)
    on = hard > 0.5
    on[0] = True
    ax.scatter(np.array(xs)[on], np.array(ys)[on], s=140, c="tab:blue", edgecolors="k", zorder=3, label="runs")
    ax.scatter(np.array(xs)[~on], np.array(ys)[~on], s=140, facecolors="white", edgecolors="0.5", zorder=3, label="off")
    ax.set_yticks(range(-1, n_layers))
    ax.set_yticklabels(["embedding"] + [f"layer {i}" for i in range(n_layers)], fontsize=8)
    ax.set_xticks(range(n_heads))
    ax.set_xlabel("head")
    ax.set_xlim(-0.7, n_heads - 0.3)
    ax.set_ylim(-1.6, n_layers - 0.4)
    ax.legend(fontsize=8, loc="upper right")
    word = repr(data["tokens"][data["token"]])[1:-1]
    how = "widths |A|, blue +, red −" if free else "widths = A"
    ax.set_title(f"c  head graph at '{word}' ({how})", loc="left", fontsize=11)
    ax.text(0.02, 0.02, f"mean gate {g[1:].mean():.2f}", transform=ax.transAxes, fontsize=8, color="0.3")


def _pareto(ax, report: dict, static_curve: list[dict]) -> None:
    """Panel d: NLL against active-head fraction, every row."""
    ax.plot([r["active_head_fraction"] for r in static_curve], [r["nll"] for r in static_curve], "v-", color="tab:red",
            lw=1, ms=3, alpha=0.6, label="static pruning (control), every head count")
    markers = {"dense": "o", "phase1": "s", "diffusion": "D", "phase2": "*", "static": "v", "random": "X"}
    for i, (name, row) in enumerate(report["table"].items()):
        marker = next((m for k, m in markers.items() if name.startswith(k)), "P")
        ax.plot(row["active_head_fraction"], row["nll"], marker, ms=13 if marker == "*" else 8, color=f"C{i % 10}",
                label=name)
    nlls = [row["nll"] for row in report["table"].values()]
    span = max(nlls) - min(nlls)
    ax.set_ylim(min(nlls) - 0.1 * span - 0.05, max(nlls) + 0.15 * span + 0.05)  # the rows; the curve may leave it
    ax.set(xlabel="active-head fraction (mean over head, position)", ylabel="val NLL (nats / token)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6.5, ncol=2, loc="upper left", bbox_to_anchor=(0.0, -0.16), frameon=False)
    ax.set_title("d  NLL against heads kept", loc="left", fontsize=11)


def _layers(ax, report: dict, n_layers: int) -> None:
    """Panel e: active-head fraction per layer."""
    rows = [n for n in ("phase1_hard", "diffusion_sample", "phase2_hard", "static_pruning") if n in report["table"]]
    width = 0.8 / len(rows)
    for i, name in enumerate(rows):
        values = report["table"][name]["active_head_fraction_per_layer"]
        ax.bar(np.arange(n_layers) + (i - (len(rows) - 1) / 2) * width, values, width, label=name)
    ax.set(xlabel="layer", ylabel="active-head fraction", ylim=(0, 1.05), xticks=range(n_layers))
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)
    ax.set_title("e  per-layer activity", loc="left", fontsize=11)


def explainer_figure(report: dict, static_curve: list[dict], data: dict, info: dict):
    """The five-panel explainer (a matplotlib Figure) from the evaluation's real figures."""
    plt = pyplot()
    fig = plt.figure(figsize=(16, 12.5), dpi=100)
    grid = fig.add_gridspec(3, 3, height_ratios=[0.55, 1.1, 1.5], hspace=0.5, wspace=0.3, top=0.95, bottom=0.17)
    _flow(fig.add_subplot(grid[0, :]), info)
    _token_grid(fig.add_subplot(grid[1, :]), data, info["n_layers"], info["n_heads"])
    _dag(fig.add_subplot(grid[2, 0]), data, info["n_layers"], info["n_heads"])
    _pareto(fig.add_subplot(grid[2, 1]), report, static_curve)
    _layers(fig.add_subplot(grid[2, 2]), report, info["n_layers"])
    p2 = report["table"]["phase2_hard"]
    fig.suptitle(f"Lookahead: phase-2 LM runs {p2['active_head_fraction']:.1%} of its heads per token at val NLL "
                 f"{p2['nll']:.3f} (dense control {report['dense_control_nll']:.3f}, static control "
                 f"{report['static_control_nll']:.3f}, base {report['dense_base_nll']:.3f})",
                 fontsize=13, y=0.99)
    return fig


def write_explainer(report: dict, static_curve: list[dict], data: dict, info: dict, png: str | Path,
                    page: str | Path, table_md: str) -> None:
    """The explainer as PNG and as a self-contained HTML page (inline SVG, text as paths, and the table)."""
    import matplotlib

    plt = pyplot()
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "lookahead"}):
        fig = explainer_figure(report, static_curve, data, info)
        save_png(fig, png, close=False)
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", metadata={"Date": None})
        plt.close(fig)
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg"):]  # drop the XML prolog and DOCTYPE (inline SVG needs neither)
    write_text(page, _page(svg, table_md))


def _page(svg: str, table_md: str) -> str:
    rows = [line for line in table_md.splitlines() if line.startswith("|")]
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    body = [[c.strip().strip("`") for c in line.strip("|").split("|")] for line in rows[2:]]
    table = "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>" + "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body) + "</table>"
    note = html.escape(" ".join(line for line in table_md.splitlines() if line and not line.startswith("|")))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Lookahead - evaluation</title>\n"
            "<style>body{font-family:sans-serif;margin:1em;max-width:1650px}svg{width:100%;height:auto}"
            "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #bbb;padding:2px 6px;text-align:right}"
            "td:first-child,th:first-child{text-align:left}</style></head><body>\n"
            f"<h1>Lookahead - evaluation</h1>\n{svg}\n<h2>The table</h2>\n{table}\n<p>{note}</p>\n</body></html>\n")


def write_evaluate_outputs(evaluation, outputs: dict) -> None:
    """Every file of the evaluate stage besides the metrics (paths in ``outputs``)."""
    report = evaluation.report
    table_md = table_markdown(report)
    write_text(outputs["table"], table_md)
    write_csv(outputs["pareto"], pareto_rows(report, evaluation.static_curve))
    write_csv(outputs["layers"], layer_rows(report))
    write_explainer(report, evaluation.static_curve, evaluation.explainer, evaluation.info, outputs["figure"], outputs["page"],
                    table_md)
