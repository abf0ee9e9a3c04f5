"""The head-scaling study's tables, headline, figure and page (``scripts/head_scaling.py`` runs the
points and collects them; :mod:`lookahead.tools.scaling_fit` fits them): rendered from the committed
point files, so ``--collect-only`` and the docs test rebuild them without running anything."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lookahead.tools.experiments import read_params
from lookahead.tools.scaling_fit import LEG
from lookahead.tools.verdicts import interval_cell

TABLE = Path("metrics/head_scaling.json")
REPORT = Path("metrics/head_scaling_report.json")
CSV = Path("metrics/head_scaling.csv")
FIGURE = Path("docs/figures/head_scaling.png")
PAGE = Path("docs/research/head-scaling.md")
BASES_REPORT = Path("metrics/bases_report.json")  # the between-base spread at 4 x 4 (make bases), where committed
BEGIN, END = "<!-- head-scaling table: begin (scripts/head_scaling.py) -->", "<!-- head-scaling table: end -->"
STAGES = ("corpus", "tokenizer", "wordnet", "base", "probe", "init", "contexts", "oracle", "static_baselines", "phase1", "score_phase1", "phase2",
          "control", "static_control", "score_phase2", "score_control")


# (key, label) of the claims the table and the figure show, each with _ci_low/_ci_high
CLAIMS = (
    ("deployed_minus_static_pruning", "phase 1: deployed router − static pruning (nats)"),
    ("deployed_minus_static_at_equal_macs", "phase 1: deployed router − static pruning at equal MACs (nats)"),
    ("greedy_capture", "phase 1: greedy capture (share of the oracle's gain)"),
    ("deployed_ratio", "phase 1: ratio (router's NLL increase / static's)"),
    ("phase2_minus_static_control", "phase 2 − static control (nats)"),
    ("phase2_minus_control", "phase 2 − dense control (nats)"),
    ("static_twin_gap", "static twin gap (nats; seeds only)"),
    ("context_shuffle_dnll", "context-shuffle ΔNLL (nats; seeds only)"),
)


FIT_CLAIMS = ("deployed_minus_static_pruning", "deployed_minus_static_at_equal_macs", "phase2_minus_static_control",
              "phase2_minus_control")
"""The claims fitted across points: paired differences per position, so per window (greedy capture and the
ratio are ratios of sums, the twin gap and shuffle ΔNLL have no per-position scores)."""


def quarter_rows(rows: list[dict]) -> list[dict]:
    """The points' 75 % rows that keep per-window NLLs, as points of their own (what :func:`fits` reads)."""
    return [{**r["off_75"], "point": r["point"], "log2_heads": r["log2_heads"]} for r in rows
            if "windows" in r.get("off_75", {})]


def fits(rows: list[dict], scoring, claims: tuple[str, ...] = FIT_CLAIMS) -> dict:
    """Each per-window claim's slope over the heads-per-layer leg and its adjacent-point differences
    (:mod:`lookahead.tools.scaling_fit`), from the points that keep per-window NLLs (``windows``); the
    between-base spread ``make bases`` measured at 4 × 4 (50 % off) added to every point, where committed."""
    from lookahead.tools import bases
    from lookahead.tools.scaling_fit import fit

    spread = json.loads(BASES_REPORT.read_text(encoding="utf-8")) if BASES_REPORT.is_file() else {}
    out = {}
    for claim in (c for c in bases.CLAIMS if c.name in claims):
        across = spread.get("claims", {}).get(claim.name, {}).get("across")
        base_sd, count = (across["sd"], spread["bases"]) if across else (0.0, 0)
        result = fit(rows, lambda r: bases.claim_differences(r, claim)
                     if "windows" in r and bases.measured(r, claim) else None,
                     base_sd, count, scoring.resamples, scoring.confidence, scoring.bootstrap_seed)
        out[claim.name] = {**result, "base_sd": base_sd, "bases": count}
    return out


# what metrics/head_scaling.json keeps (DESIGN §1: a few keys a researcher compares across experiments;
# the intervals in metrics/head_scaling_ci.json): two claims at the largest point and their slope over the
# heads-per-layer leg, and phase 1's claim at 75 % off the same way (`<claim>_75_…`: the one regime where
# the per-token advantage grew with the heads); every point, claim and fit is in the report
HEADLINE_CLAIMS = ("deployed_minus_static_pruning", "phase2_minus_static_control")
QUARTER_HEADLINE_CLAIM = "deployed_minus_static_pruning"
# the claims phase 1 at 75 % off has (no phase 2 there), and those of them fitted across points
QUARTER_KEYS = ("deployed_minus_static_pruning", "deployed_minus_static_at_equal_macs", "greedy_capture",
                "deployed_ratio")
QUARTER_FIT_CLAIMS = tuple(k for k in QUARTER_KEYS if k in FIT_CLAIMS)


def headline(study: dict) -> dict:
    """metrics/head_scaling.json (with metrics/head_scaling_ci.json): the study's headline, read from its report."""
    rows = study["points"]
    largest = max(rows, key=lambda r: r["heads"])
    window_sets = {r["window_set"] for r in rows}
    out = {"points": ",".join(r["point"] for r in rows), "largest_point": largest["point"],
           "window_set": window_sets.pop() if len(window_sets) == 1 else None}
    claims = [(k, k, largest, study["fits"]) for k in HEADLINE_CLAIMS]
    if QUARTER_HEADLINE_CLAIM in study.get("fits_75", {}):  # the 75 % rows (`make head-scaling SCALING_ARGS=--quarter`)
        claims.append((QUARTER_HEADLINE_CLAIM, f"{QUARTER_HEADLINE_CLAIM}_75", largest.get("off_75") or {}, study["fits_75"]))
    for k, name, at_largest, fitted in claims:
        out.update({f"{name}_at_largest{suffix}": at_largest.get(k + suffix) for suffix in ("", "_ci_low", "_ci_high")})
        slope = fitted.get(k, {}).get("slope_per_doubling") or {}
        out.update({f"{name}_slope": slope.get("estimate"), f"{name}_slope_ci_low": slope.get("ci_low"),
                    f"{name}_slope_ci_high": slope.get("ci_high")})
    return out


def pending_shapes(study: dict) -> str:
    """The points committed under earlier rules, as shapes (``4 × 8, 4 × 16``; empty where none): the page's
    and the results page's one wording of them."""
    return ", ".join(name.replace("x", " × ") for name in study.get("pending", ()))


def markdown(study: dict) -> str:
    """The page's tables, rendered from ``metrics/head_scaling_report.json`` (a test compares them)."""
    rows = study["points"]
    lines = ["What differs between points besides heads: head dim, depth, parameters, training tokens, the "
             "oracle, the dense NLL and the greedy static mask's search (columns 3–9).", "",
             "| shape | heads | head dim | what changes | parameters (M) | train tokens (M) | oracle | dense NLL | "
             "static mask | static pruning | router as deployed | greedy oracle | MACs as deployed / dense | "
             "window at 0.8× dense MACs |",
             "|---|---:|---:|---|---:|---:|---|---:|---|---:|---:|---:|---:|---:|"]
    millions = lambda v: "–" if v is None else f"{v / 1e6:.2f}"  # noqa: E731
    for r in rows:
        window = r["window_at_0_8_dense_macs"]
        lines.append(f"| {r['n_layers']} × {r['n_heads']} | {r['heads']} | {r['head_dim']} | {r['changes']} | "
                     f"{millions(r.get('parameters'))} | {millions(r.get('train_tokens'))} | {r['oracle']} | "
                     f"{r['phase1_dense_nll']:.3f} | {r['static_mask']} | {r['phase1_static_pruning_nll']:.3f} | "
                     f"{r['phase1_deployed_nll']:.3f} | "
                     f"{r['phase1_greedy_oracle_nll']:.3f} | {r['phase1_deployed_macs_over_dense']:.3f} | "
                     f"{'never' if window is None else f'{window:,.0f}'} |")
    lines += ["", "| shape | " + " | ".join(label for _, label in CLAIMS) + " |",
              "|---|" + "---|" * len(CLAIMS)]
    for r in rows:
        lines.append(f"| {r['n_layers']} × {r['n_heads']} | " + " | ".join(
            interval_cell(r.get(k), r.get(f"{k}_ci_low"), r.get(f"{k}_ci_high")) for k, _ in CLAIMS) + " |")
    if pending := pending_shapes(study):
        lines += ["", "Not yet rescored under these rules (kept out of every table and fit here; their earlier figures "
                  f"are in the history of `metrics/head_scaling/<point>.json`): {pending}."]
    lines += fit_lines(study["fits"])
    quarter = [r for r in rows if r.get("off_75")]
    if quarter:
        keys = QUARTER_KEYS
        # a row whose dense NLL is not its point's stands on another base LM (retrained to other bits)
        other = [r["point"].replace("x", " × ") for r in quarter if r["off_75"]["phase1_dense_nll"] != r.get("phase1_dense_nll")]
        base = "the point's base LM" + (f", but for {', '.join(other)}: a retrain of its recipe and seed to other bits "
                                        "(its dense NLL below)" if other else "")
        lines += ["", f"Phase 1 at 75 % of heads off (its own oracle and phase-1 run, {base}):", "",
                  "| shape | heads kept | dense NLL | static pruning | router as deployed | greedy oracle | "
                  + " | ".join(label for k, label in CLAIMS if k in keys) + " |",
                  "|---|---:|---:|---:|---:|---:|" + "---|" * len(keys)]
        for r in quarter:
            q = r["off_75"]
            lines.append(f"| {r['n_layers']} × {r['n_heads']} | {q['heads_kept']} | {q['phase1_dense_nll']:.3f} | "
                         f"{q['phase1_static_pruning_nll']:.3f} | {q['phase1_deployed_nll']:.3f} | "
                         f"{q['phase1_greedy_oracle_nll']:.3f} | "
                         + " | ".join(interval_cell(q.get(k), q.get(f"{k}_ci_low"), q.get(f"{k}_ci_high"))
                                      for k, _ in CLAIMS if k in keys) + " |")
        if pending := [r["point"].replace("x", " × ") for r in quarter if not r["off_75"].get("per_window")]:
            lines += ["", f"Kept out of the fits at 75 % off (recorded before the rows kept their per-window NLLs: "
                      f"they await their rerun): {', '.join(pending)}."]
        lines += fit_lines(study.get("fits_75", {}), "at 75 % off")
    checked = [r for r in rows if r.get("oracle_validation")]
    if checked:
        lines += ["", "| shape | windows | exact greedy NLL | static pruning NLL | oracle | trial forwards (exact) | "
                  "speed-up | NLL − exact [95 % CI] | capture of the exact gain [CI] | recall of the exact set |",
                  "|---|---:|---:|---:|---|---:|---:|---|---|---:|"]
        for r in checked:
            v = r["oracle_validation"]
            for name in (k for k in v if isinstance(v[k], dict)):
                x = v[name]
                lines.append(f"| {r['n_layers']} × {r['n_heads']} | {v['windows']} | {v['exact_nll']:.3f} | "
                             f"{v['static_nll']:.3f} | {variant_label(name, v)} | {x['trials_per_window']} ({v['exact_trials_per_window']}) | "
                             f"{x['speedup']:.1f}× | {interval_cell(x['nll_minus_exact'], *x['nll_minus_exact_ci'], digits=4)} | "
                             f"{interval_cell(x['capture'], *x['capture_ci'])} | {x['recall_of_exact']:.3f} |")
    times = [r for r in rows if r.get("stage_seconds")]
    if times:
        stages = [s for s in STAGES if any(s in r["stage_seconds"] for r in times)]
        lines += ["", "| shape | " + " | ".join(stages) + " | total (min) |", "|---|" + "---:|" * (len(stages) + 1)]
        for r in times:
            t = r["stage_seconds"]
            lines.append(f"| {r['n_layers']} × {r['n_heads']} | " + " | ".join(
                f"{t[s]:.0f}" if s in t else "–" for s in stages) + f" | {sum(t.values()) / 60:.1f} |")
    return "\n".join(lines)


def variant_label(name: str, check: dict) -> str:
    """An oracle variant of benchmarks/greedy_rounds.py as the page names it: ``r<K>`` (every head dropped in one
    step, K the heads kept) is the leave-one-out null the benchmark always runs."""
    return f"{name}: one step, leave-one-out (null)" if name == f"r{check['heads_kept']}" else name


def fit_lines(fitted: dict, where: str = "") -> list[str]:
    """The slopes over the heads-per-layer leg and the adjacent differences, or why there are none
    (``where``: which rows, where not the 50 % ones)."""
    slopes = {k: f["slope_per_doubling"] for k, f in fitted.items() if f.get("slope_per_doubling")}
    pairs = list(dict.fromkeys(pair for f in fitted.values() for pair in f.get("adjacent", {})))  # in order of heads
    if not slopes and not pairs:
        return ["", f"No slope and no differences between points{' ' + where if where else ''} yet: both need two or "
                "more points scored under these rules (each keeps its per-window NLLs); `make head-scaling` reruns the rest."]
    labels = dict(CLAIMS)
    out = ["", f"How the claims{' ' + where if where else ''} change between shapes (every point on the same test "
           "windows: window bootstrap "
           "resamples shared by the points; seeds per point; Student's t at the Welch–Satterthwaite degrees of freedom"
           + ("; the between-base sd measured at 4 × 4 with half of the heads off added to every point, an assumption"
              if any(f.get("bases", 0) > 1 for f in fitted.values()) else "; no between-base component: none committed")
           + "). No value past the largest point:", "",
           "| contrast | " + " | ".join(labels[k] for k in fitted) + " |", "|---|" + "---|" * len(fitted)]
    out.append("| slope per doubling of heads, " + " → ".join(LEG) + " | " + " | ".join(
        interval_cell(s["estimate"], s["ci_low"], s["ci_high"]) if (s := slopes.get(k)) else "–" for k in fitted) + " |")
    out.append("| overdispersion of that line (χ² / 1 df) | " + " | ".join(
        f"{f['overdispersion']:.1f}" if f.get("overdispersion") is not None else "–" for f in fitted.values()) + " |")
    for pair in pairs:
        out.append(f"| {pair} | " + " | ".join(
            interval_cell(d["estimate"], d["ci_low"], d["ci_high"]) if (d := f["adjacent"].get(pair)) else "–"
            for f in fitted.values()) + " |")
    return out


def without_windows(value):
    """A point's field as the report keeps it: a 75 % row without its per-window NLLs (the point files hold
    them), ``per_window`` saying whether it has them (whether the fits read it)."""
    if not isinstance(value, dict) or "keep" not in value:
        return value
    return {**{k: v for k, v in value.items() if k != "windows"}, "per_window": "windows" in value}


def update_page(study: dict) -> None:
    """Rewrite the generated block of docs/research/head-scaling.md."""
    from lookahead.core.atomic import atomic_file

    text = PAGE.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        sys.exit(f"error: {PAGE} lacks the markers {BEGIN!r} … {END!r}")
    head, rest = text.split(BEGIN, 1)
    fresh = head + BEGIN + "\n" + markdown(study) + "\n" + END + rest.split(END, 1)[1]
    with atomic_file(PAGE) as tmp:
        tmp.write_text(fresh, encoding="utf-8")

def write(rows: list[dict], pending: list[str] = ()) -> None:
    """The report, headline, CSV, figure and page from the points scored under the study's rules;
    ``pending``: the points committed under earlier rules, named in the report and on the page."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lookahead.artifacts.val_scores import scoring_from_params
    from lookahead.core.atomic import atomic_file, write_csv, write_json
    from lookahead.core.report import sibling_path, split_headline

    sets = {r["window_set"] for r in rows}
    if len(sets) > 1:
        sys.exit(f"error: the points score different windows ({', '.join(sorted(sets))}): one window set per table")
    scoring = scoring_from_params(read_params(None))
    study = {"points": [{k: without_windows(v) for k, v in r.items() if k != "windows"} for r in rows],
             "fits": fits(rows, scoring), "fits_75": fits(quarter_rows(rows), scoring, QUARTER_FIT_CLAIMS),
             "claims": {key: label for key, label in CLAIMS}, "pending": list(pending)}
    write_json(REPORT, study)
    parts = split_headline(headline(study))
    write_json(TABLE, parts.pop(""))
    for part, figures in parts.items():  # the intervals, and the window set (lookahead.core.report)
        write_json(sibling_path(TABLE, part), figures)
    update_page(study)
    flat = [{k: v for k, v in r.items() if not isinstance(v, dict)} for r in study["points"]]
    write_csv(CSV, flat, list(dict.fromkeys(k for r in flat for k in r)))  # every point's columns
    fig, axes = plt.subplots(2, 4, figsize=(18, 8), dpi=100)
    for ax, (key, label) in zip(axes.flat, CLAIMS):
        pts = [r for r in rows if r.get(key) is not None]
        x = [r["log2_heads"] for r in pts]
        y = [r[key] for r in pts]
        lo = [r[key] - r[f"{key}_ci_low"] if r.get(f"{key}_ci_low") is not None else 0 for r in pts]
        hi = [r[f"{key}_ci_high"] - r[key] if r.get(f"{key}_ci_high") is not None else 0 for r in pts]
        ax.errorbar(x, y, yerr=[lo, hi], fmt="o-", capsize=4, color="tab:blue", label="50 % off")
        quarter = [(r["log2_heads"], r["off_75"]) for r in rows if r.get("off_75", {}).get(f"{key}_ci_low") is not None]
        if quarter:
            ax.errorbar([q[0] + 0.05 for q in quarter], [q[1][key] for q in quarter],
                        yerr=[[q[1][key] - q[1][f"{key}_ci_low"] for q in quarter],
                              [q[1][f"{key}_ci_high"] - q[1][key] for q in quarter]],
                        fmt="^--", capsize=4, color="tab:orange", label="75 % off (phase 1)")
            ax.legend(fontsize=8)
        if "minus" in key or "gap" in key or "dnll" in key:
            ax.axhline(0, color="grey", lw=0.8, ls="--")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("log2(heads)")
        ax.set_xticks(sorted(set(x)))  # the measured points only: nothing past the largest
        if x:  # half a doubling of margin: the 75 % markers sit just right of their point
            ax.set_xlim(min(x) - 0.5, max(x) + 0.5)
    fig.suptitle("per-token routing against the number of heads (each point's 95 % interval: its windows and seeds, "
                 f"one base LM; test windows {next(iter(sets))})")
    fig.tight_layout()
    FIGURE.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(FIGURE) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    print(f"{'point':>6} {'heads':>5}  " + "  ".join(f"{key[:22]:>22}" for key, _ in CLAIMS[:4]))
    for r in rows:
        print(f"{r['point']:>6} {r['heads']:>5}  " + "  ".join(
            f"{r[key]:+22.4f}" if r.get(key) is not None else f"{'-':>22}" for key, _ in CLAIMS[:4]))
    print(f"written: {TABLE}, {REPORT}, {CSV}, {FIGURE} and the tables of {PAGE}")


