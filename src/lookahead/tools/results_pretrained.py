"""The results page's section on the pretrained LM (``make smollm2-run``; docs/research/pretrained-lm.md):
its claims where collected (``metrics/smollm2/headline.json`` and ``report.json``), its dense NLL in nats
and bits per byte, and the run's progress (``metrics/smollm2/run.json``) until then; and the research
page's generated block: every claim on the toy beside the same claim on the pretrained LM, and the
redundancy curve of each (dense NLL, and what static pruning costs at each share of heads off)."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import yaml

from lookahead.core.report import read_headline
from lookahead.tools.verdicts import Figures, interval_cell, mean_verdict, replace_block, scored_on, table

PRETRAINED = Path("metrics/smollm2")
PROFILE = Path("profiles/smollm2-135m.yaml")
NAME = "SmolLM2-135M"
PAGE = Path("docs/research/pretrained-lm.md")
BEGIN, END = "<!-- pretrained: begin (make results) -->", "<!-- pretrained: end -->"
"""The research page's generated block sits between these markers; ``make results`` rewrites it."""

TOY_BASES = Path("metrics/bases_report.json")
CLAIMS = (  # the claims :mod:`lookahead.tools.bases` tabulates, per window over seeds: name, what it compares
    ("deployed_minus_static_pruning", "phase 1: router as deployed − the strongest static mask, equal heads (nats)"),
    ("deployed_minus_static_at_equal_macs", "phase 1: router as deployed − the strongest static mask, equal MACs (nats)"),
    ("router_minus_static_pruning", "phase 1: router on a dense pass's states − the strongest static mask, equal heads (nats)"),
    ("greedy_capture", "phase 1: share of the greedy oracle's gain over static the router captures"),
    ("oracle_recall_minus_static_recall", "phase 1: the oracle's heads − the static mask's, recalled by the router"),
    ("deployed_ratio", "phase 1: router as deployed over the router on dense states (its NLL gain)"),
    ("phase2_minus_static_control", "phase 2: routed LM − the static control, both trained as long (nats)"),
    ("phase2_minus_control", "phase 2: routed LM − the dense control, both trained as long (nats)"),
)
STAGE_CLAIMS = (  # a stage's own figure against a fixed bar: stage, key, what, claimed side, the bar
    ("diffusion", "best_of_k_minus_null", "decoders: the diffusion head's best of K − its null's (nats)", "below", 0.0),
    ("evaluate", "diffusion_best_of_k_minus_null", "decoders: best of K − random best of K, after phase 2 (nats)", "below", 0.0),
    ("modulator", "val_nll_change_pct", "modulator: NLL change, % (the seed's claim: within +1 %)", "below", 1.0),
    ("modulator", "spearman_gain_pct", "modulator: gloss-level Spearman gain with WordNet, %", "above", 0.0),
    ("probe", "base_contextual_spearman", "probe: the LM's contextual Spearman with WordNet", "above", 0.0),
)
SHARES_OFF = (0.25, 0.5, 0.75)
"""The redundancy curve's shares of heads off (the study's cells)."""


def bits_per_byte(nll: float, bytes_per_token: float) -> float:
    """A per-token NLL in nats as bits per byte of text (the level tokenizers can be compared on)."""
    return nll / math.log(2) / bytes_per_token


def _hours(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds / 3600:.2f}"


def pretrained_section(root: Path) -> list[str]:
    """Nothing before the run has started (its ``run.json``)."""
    d = root / PRETRAINED
    if not (d / "run.json").is_file():
        return []
    run = json.loads((d / "run.json").read_text(encoding="utf-8"))
    out = [f"## On a pretrained LM ({NAME})", "",
           f"`{PRETRAINED}/`, written by `make smollm2-run` ([pretrained LM](research/pretrained-lm.md)): every stage "
           f"on {NAME}-Instruct (Llama, 30 layers × 9 query heads sharing 3 key/value heads), its Q4_1 GGUF "
           "dequantized to fp32 — the same weights in every arm. One pretrained LM: every interval is over its "
           "seeds and test windows.", ""]
    if (d / "base.json").is_file() and (d / "tokenizer.json").is_file():
        base, tok = read_headline(d / "base.json"), read_headline(d / "tokenizer.json")
        out += [f"Dense val NLL {base['val_nll']:.3f} nats a token, "
                f"{bits_per_byte(base['val_nll'], tok['val_bytes_per_token']):.3f} bits a byte of gloss text "
                f"(`{PRETRAINED}/base.json`; {tok['val_bytes_per_token']:.2f} bytes a token).", ""]
    if (d / "headline.json").is_file() and (d / "report.json").is_file():
        report = json.loads((d / "report.json").read_text(encoding="utf-8"))
        rows = []
        for name, row in report["claims"].items():
            c = row["per_base"]["0"]
            rows.append((f"`{name}`", row["claimed"], interval_cell(c["mean"], c["ci_low"], c["ci_high"]), c["verdict"]))
        out += [scored_on(report.get("window_set")), ""]
        out += table(("claim", "claimed", f"{NAME} (95 % interval)", "verdict"), rows) + [""]
    stages = run["stages"]
    done = [s for s, e in stages.items() if e.get("done")]
    cut = sum(e.get("cut_seconds", 0.0) for e in stages.values())
    out += [f"The run: {len(done)} stages done, {_hours(sum(e['seconds'] or 0 for e in stages.values()))} h on "
            "2 cores so far (each stage's seconds, summed over the sessions that ran it; "
            f"{_hours(cut)} h of them in calls cut off mid-stage, which a stage without checkpoints redid):", ""]
    out += table(("stage", "hours", "cut off", "state"),
                 [(f"`{s}`", _hours(e.get("seconds")), _hours(e.get("cut_seconds", 0.0)),
                   "done" if e.get("done") else "started") for s, e in stages.items()])
    return out + [""]


def pretrained_line(root: Path) -> str | None:
    """README's lead line once the pretrained LM's claims are collected (``metrics/smollm2/report.json``)."""
    report = _json(root / PRETRAINED / "report.json")
    if not report:
        return None
    parts = []
    for name, what in (("deployed_minus_static_pruning", "router as deployed − the strongest static mask"),
                       ("deployed_minus_static_at_equal_macs", "at the same MACs"), ("greedy_capture", "greedy capture"),
                       ("phase2_minus_static_control", "phase 2 − static control"),
                       ("phase2_minus_control", "phase 2 − dense control")):
        entry = report["claims"].get(name, {}).get("per_base", {}).get("0")
        if entry:
            parts.append(f"{what} {interval_cell(entry['mean'], entry['ci_low'], entry['ci_high'])}: {entry['verdict']}")
    return (f"- **On a pretrained LM, {NAME}** (one LM, 270 query heads; test windows; 95 % intervals over its seeds "
            f"and windows; [pretrained LM](docs/research/pretrained-lm.md)): " + "; ".join(parts) + ".")


def _claim_cell(entry: dict | None) -> tuple[str, str]:
    """A tabulated claim (mean, interval, verdict) as a cell and its verdict; dashes where not measured."""
    if not entry:
        return "–", "–"
    return interval_cell(entry["mean"], entry["ci_low"], entry["ci_high"]), entry["verdict"]


def _stage_cell(f: Figures | None, key: str, claimed: str, bar: float) -> tuple[str, str]:
    """A stage's figure against ``bar``: its 95 % interval where it has one (else ``± sd (seeds)``), and
    the verdict of :func:`lookahead.tools.verdicts.mean_verdict` (holds where it lies on the claimed side)."""
    if f is None or not f.has(key):
        return "–", "–"
    interval = f.interval(key)
    side = mean_verdict(f.mean(key), f.sd(key), f.seeds, bar, 0.0, interval)
    cell = interval_cell(f.mean(key), *interval) if interval else f.show(key)
    return cell, "within noise" if side == "within noise" else ("holds" if side == claimed else "fails")


def _figures(path: Path, stage: str, params: Path) -> Figures | None:
    """A stage's headline; the probe's seeds (its ``_sd`` is over ``probe.seeds``, which its headline does
    not count) read from the run's ``params``."""
    if not path.is_file():
        return None
    values = read_headline(path)
    if stage == "probe" and "seeds" not in values and params.is_file():
        seeds = (yaml.safe_load(params.read_text(encoding="utf-8")) or {}).get("probe", {}).get("seeds")
        if isinstance(seeds, list):
            values["seeds"] = len(seeds)
    return Figures(stage, values)


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def toy_dense(root: Path) -> tuple[list[float], float] | None:
    """The toy's dense val NLLs (each base LM of ``make bases``, else the committed one) and its bytes a token."""
    tok = root / "metrics" / "tokenizer.json"
    if not tok.is_file():
        return None
    bases = sorted((root / "metrics" / "bases").glob("seed*.json"))
    nlls = [json.loads(p.read_text(encoding="utf-8"))["headlines"]["base"]["val_nll"] for p in bases]
    if not nlls and (root / "metrics" / "base.json").is_file():
        nlls = [read_headline(root / "metrics" / "base.json")["val_nll"]]
    return (nlls, read_headline(tok)["val_bytes_per_token"]) if nlls else None


def _level(nlls: list[float], bytes_per_token: float) -> str:
    bpb = [bits_per_byte(x, bytes_per_token) for x in nlls]
    if len(bpb) == 1:
        return f"{bpb[0]:.3f} ({nlls[0]:.3f} nats a token)"
    return (f"{statistics.mean(bpb):.3f} ± {statistics.stdev(bpb):.3f} ({len(bpb)}) "
            f"({statistics.mean(nlls):.3f} nats a token)")


def comparison_rows(root: Path) -> list[tuple[str, ...]]:
    """Every claim on the toy beside the same claim on the pretrained LM: the tabulated claims across the
    toy's base LMs (``make bases``) and on the one pretrained LM, each stage's own claims on each run's
    committed base LM; the dense level in bits a byte (the tokenizers differ, nats a token do not compare)."""
    toy_report, lm_report = _json(root / TOY_BASES), _json(root / PRETRAINED / "report.json")
    toy_count = toy_report["bases"] if toy_report else 0
    rows = []
    toy, lm = toy_dense(root), None
    if (root / PRETRAINED / "base.json").is_file() and (root / PRETRAINED / "tokenizer.json").is_file():
        lm = ([read_headline(root / PRETRAINED / "base.json")["val_nll"]],
              read_headline(root / PRETRAINED / "tokenizer.json")["val_bytes_per_token"])
    rows.append(("dense LM: val bits a byte", "–", _level(*toy) if toy else "–", "–", _level(*lm) if lm else "–", "–"))
    for name, what in CLAIMS:
        toy_row = (toy_report or {}).get("claims", {}).get(name)
        toy_entry = (toy_row or {}).get("across") if toy_count > 1 else (toy_row or {}).get("per_base", {}).get("0")
        lm_row = (lm_report or {}).get("claims", {}).get(name)
        claimed = (toy_row or lm_row or {}).get("claimed", "–")
        rows.append((f"{what} `{name}`", claimed, *_claim_cell(toy_entry),
                     *_claim_cell((lm_row or {}).get("per_base", {}).get("0"))))
    for stage, key, what, side, bar in STAGE_CLAIMS:
        claimed = f"{side} {bar:g}"
        rows.append((f"{what} `{stage}.{key}`", claimed,
                     *_stage_cell(_figures(root / "metrics" / f"{stage}.json", stage, root / "params.yaml"), key, side, bar),
                     *_stage_cell(_figures(root / PRETRAINED / f"{stage}.json", stage, root / PROFILE), key, side, bar)))
    return rows


def static_curve(path: Path) -> tuple[float, list[tuple[float, float]]] | None:
    """Phase 1's curve of static pruning by importance (``<stage>_pareto.csv``: the share of heads kept,
    its NLL on phase 1's evaluation windows) and the dense NLL there; None where not written."""
    if not path.is_file():
        return None
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    curve = sorted((float(r["active_head_fraction"]), float(r["nll"])) for r in rows if r["kind"] == "static pruning")
    dense = [float(r["nll"]) for r in rows if r["kind"] == "dense"]
    return (dense[0], curve) if dense and curve else None


def at_share(curve: list[tuple[float, float]], kept: float) -> float:
    """The curve's NLL at ``kept`` (a share of heads), read linearly between its two nearest counts."""
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x0 <= kept <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (kept - x0) / (x1 - x0)
    raise ValueError(f"share {kept} outside the curve's [{curve[0][0]}, {curve[-1][0]}]")


def redundancy_rows(root: Path) -> list[tuple[str, ...]]:
    """The redundancy curve, toy beside pretrained LM: what static pruning by importance (phase 1's curve,
    its evaluation windows) costs over dense at each share of heads off, in nats; and the strongest static
    mask's cost on the selection windows (``static_baselines``) where its report scores the dense model."""
    toy = static_curve(root / "metrics" / "phase1_pareto.csv")
    lm = static_curve(root / PRETRAINED / "phase1_pareto.csv")
    strongest = _strongest_static(_json(root / PRETRAINED / "static_baselines_report.json"))
    rows = []
    for off in SHARES_OFF:
        cells = [f"{at_share(c[1], 1 - off) - c[0]:+.3f}" if c else "–" for c in (toy, lm)]
        rows.append((f"{off:.0%}", *cells, strongest.get(round(1 - off, 6), "–")))
    return rows


def _strongest_static(report: dict | None) -> dict[float, str]:
    """Share kept → the stronger static mask's selection NLL − dense's (both on the selection windows)."""
    if not report:
        return {}
    by = {r["heads_kept"]: min(r[k] for k in r if k.startswith("selection_nll_")) for r in report["by_heads_kept"]}
    total = report["heads"]
    if total not in by:
        return {}
    return {round(k / total, 6): f"{v - by[total]:+.3f}" for k, v in by.items() if k != total}


def research_block(root: Path) -> str:
    """The research page's generated block: the toy-vs-pretrained table and the redundancy curve."""
    toy_report = _json(root / TOY_BASES)
    toy_count = toy_report["bases"] if toy_report else 0
    toy_where = (f"across {toy_count} base LMs (`{TOY_BASES}`)" if toy_count > 1 else "its committed base LM (`metrics/`)")
    lm_report = _json(root / PRETRAINED / "report.json")
    lines = ["<!-- Generated by `make results` (lookahead.tools.results_pretrained) from metrics/ and metrics/smollm2/: "
             "do not edit by hand. -->", "",
             "### Every claim, toy beside SmolLM2", "",
             f"The toy: the 2.1 M-parameter OLMo2 trained here; its tabulated claims {toy_where}, each stage's "
             f"own claims on its committed base LM. {NAME}: one pretrained LM (`{PRETRAINED}/`), its seeds and test "
             "windows. The tabulated claims are scored on the sets named below; each stage's own on the windows "
             "that stage scores, as on the [results page](../results.md). A cell shows a 95 % interval where the "
             "figure has one, else mean ± sd (seeds). NLL differences in nats a token; the dense levels in bits a "
             "byte of gloss text, since the tokenizers differ. A dash: not measured (yet).", ""]
    if toy_report:
        lines.append(f"Toy: {scored_on(toy_report.get('window_set'))}")
    if lm_report:
        lines.append(f"{NAME}: {scored_on(lm_report.get('window_set'))}")
    lines += [""] + table(("claim", "claimed", "toy", "verdict", NAME, "verdict"),
                          comparison_rows(root))
    lines += ["", "### Redundancy: what static pruning costs", "",
              "Static pruning of the heads least important by the probe (phase 1's curve, on its evaluation windows: "
              "`metrics/phase1_pareto.csv`, `metrics/smollm2/phase1_pareto.csv`), NLL − dense at each share of "
              "heads off, in nats; for SmolLM2 also the strongest static mask (importance or the lazy greedy, "
              "the lower) on the selection windows (`metrics/smollm2/static_baselines_report.json`).", ""]
    lines += table(("heads off", "toy: importance", f"{NAME}: importance", f"{NAME}: strongest static (selection)"),
                   redundancy_rows(root))
    return "\n".join(lines)


def render_page(root: Path, page: str) -> str:
    """``page`` (the research page's text) with its generated block rendered afresh."""
    return replace_block(page, BEGIN, END, research_block(root), str(PAGE))
