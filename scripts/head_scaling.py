"""Head scaling (docs/research/head-scaling.md): does per-token routing pay more with more heads?

A family of model shapes from the default's 4 x 4 heads toward 16 x 16, one thing changed at a time
(heads per layer at the default's depth and width, then depth at 16 heads per layer), each point's
research chain run as a DVC experiment in a temporary directory:

    dvc exp run --temp -n hs-<L>x<H> -S base.arch.n_layers=L -S base.arch.n_heads=H [-S oracle...] \
        phase2 control static_control

which runs base → probe, init, contexts → oracle → phase 1 (its claims on the test windows) →
phase 2 + the dense and static controls (their per-position NLLs on the same windows), and leaves
out what the study does not read (modulator, pairs, diffusion, evaluate). The default's own run is
the 4 x 4 point: its figures are read from the workspace, never rerun. Each point's figures go to
``metrics/head_scaling/<point>.json`` and are committed as soon as the point finishes (``--commit``,
on in ``make head-scaling``): experiment refs live in one clone, and a study this long is
interrupted. A point whose file exists is read back, never rerun; an interrupted point reruns, its
finished stages restored from DVC's run cache.

    metrics/head_scaling.json     one entry per point: shape, heads, every claim with _ci_low/_ci_high
    metrics/head_scaling.csv      the same, one row per point
    docs/figures/head_scaling.png each claim with its interval against log2(heads)

Usage: make head-scaling [SCALING_ARGS="--points 4x8,4x16"]   (python scripts/head_scaling.py --help)
--collect-only rebuilds the table and figure from the committed point files.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POINT_DIR = Path("metrics/head_scaling")
TABLE = Path("metrics/head_scaling.json")
CSV = Path("metrics/head_scaling.csv")
FIGURE = Path("docs/figures/head_scaling.png")
PAGE = Path("docs/research/head-scaling.md")
BEGIN, END = "<!-- head-scaling table: begin (scripts/head_scaling.py) -->", "<!-- head-scaling table: end -->"
TARGETS = ("phase2", "control", "static_control")
STAGES = ("base", "probe", "init", "contexts", "oracle", "phase1", "phase2", "control", "static_control")


@dataclasses.dataclass(frozen=True)
class Point:
    layers: int
    heads: int
    per_round: int = 1
    candidates: int = 0
    changes: str = ""
    validate: int = 0
    """Selection windows on which the point's lazy oracle is checked against the exact greedy (0: not)."""

    @property
    def name(self) -> str:
        return f"{self.layers}x{self.heads}"

    @property
    def total(self) -> int:
        return self.layers * self.heads

    @property
    def oracle(self) -> str:
        if self.candidates:
            return f"lazy greedy (candidates {self.candidates}, per_round {self.per_round})"
        return "exact greedy" if self.per_round == 1 else f"greedy, {self.per_round} heads a step"

    def overrides(self) -> list[str]:
        values = {"base.arch.n_layers": self.layers, "base.arch.n_heads": self.heads,
                  "oracle.per_round": self.per_round, "oracle.candidates": self.candidates}
        return [arg for key, value in values.items() for arg in ("-S", f"{key}={value}")]


# One change at a time: heads per layer at the default's depth and width (hidden 128: the same
# parameters and FLOPs, smaller heads), then depth at 16 heads per layer. The default run's exact greedy
# oracle at 16 heads; above that the lazy greedy with 4 candidates a step, which matches it within
# 0.01 nats at 16 heads (benchmarks/greedy_rounds.py), with one oracle for every point it runs.
POINTS = (
    Point(4, 4, changes="the default (4 layers, hidden 128, head dim 32)"),
    Point(4, 8, candidates=4, changes="heads per layer x2 (head dim 16)", validate=32),
    Point(4, 16, candidates=4, changes="heads per layer x4 (head dim 8)"),
    Point(8, 16, candidates=4, changes="depth x2 at 16 heads per layer"),
    Point(16, 16, per_round=2, candidates=4, changes="depth x4 at 16 heads per layer: the 1B graph"),
)
DEFAULT = POINTS[0]


def sh(*argv: str, capture: bool = True) -> str:
    proc = subprocess.run(argv, text=True, capture_output=capture)
    if proc.returncode != 0:
        sys.exit(f"error: {' '.join(argv)} failed ({proc.returncode})" + (f":\n{proc.stderr}" if capture else ""))
    return proc.stdout if capture else ""


def experiment_rev(name: str) -> str:
    """The newest experiment commit named ``name`` in this clone."""
    refs = sh("git", "for-each-ref", "--sort=-committerdate", "--format=%(objectname) %(refname)", "refs/exps")
    for line in refs.splitlines():
        sha, ref = line.split(" ", 1)
        if ref.rsplit("/", 1)[-1] == name:
            return sha
    sys.exit(f"error: no experiment {name} in this clone")


def run_point(point: Point, log_dir: Path) -> dict[str, float]:
    """Run the point's chain as a DVC experiment; return each stage's wall seconds (from DVC's
    'Running stage' lines: a stage restored from the run cache or unchanged takes ~0 s)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    cmd = ["dvc", "exp", "run", "--temp", "-f", "-n", f"hs-{point.name}", *point.overrides(), *TARGETS]
    print(f"[head-scaling] {point.name}: {' '.join(cmd)}  (log: {log_dir / point.name}.log)", flush=True)
    starts: list[tuple[str, float, str]] = []
    with open(log_dir / f"{point.name}.log", "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        for line in proc.stdout:
            log.write(line)
            log.flush()
            now = time.time()
            match = re.search(r"Running stage '([\w-]+)'", line)
            restored = re.search(r"Stage '([\w-]+)' (?:is cached - skipping run|didn't change, skipping)", line)
            if match or restored:
                starts.append(((match or restored)[1], now, "ran" if match else "restored"))
        end = time.time()
        if proc.wait() != 0:
            sys.exit(f"error: experiment hs-{point.name} failed: see {log_dir / point.name}.log")
    times = {}
    for (stage, start, how), nxt in zip(starts, [*starts[1:], (None, end, None)]):
        times[stage] = round(nxt[1] - start, 1) if how == "ran" else 0.0
    return times


def validate_oracle(point: Point, rev: str, windows: int) -> dict:
    """benchmarks/greedy_rounds.py on the point's own base LM and head importance (exported from the
    experiment): the exact greedy against the point's lazy search and c = 8, on ``windows`` selection
    windows; its JSON line."""
    from dvc.api import DVCFileSystem

    fs = DVCFileSystem(".", rev=rev)
    with tempfile.TemporaryDirectory() as tmp:
        fs.get("models/base", f"{tmp}/base", recursive=True)
        fs.get("data/probe/heads.safetensors", f"{tmp}/heads.safetensors")
        variant = (f"r{point.per_round}" if point.per_round > 1 else "") + f"c{point.candidates}"
        print(f"[head-scaling] {point.name}: the lazy oracle against the exact greedy on {windows} windows", flush=True)
        line = sh(sys.executable, "benchmarks/greedy_rounds.py", "--base", f"{tmp}/base", "--heads",
                  f"{tmp}/heads.safetensors", "--windows", str(windows), "--variants", f"{variant},c8")
    return json.loads(line.strip().splitlines()[-1])

def read_json(rev: str | None, path: str) -> dict:
    if rev is None:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    return json.loads(sh("git", "show", f"{rev}:{path}"))


def score_file(rev: str | None, path: str, tmp: Path) -> Path:
    """A DVC-tracked file of the workspace (rev None) or of an experiment commit, as a local path."""
    if rev is None:
        return Path(path)
    import dvc.api

    local = tmp / Path(path).name
    with dvc.api.open(path, rev=rev, mode="rb") as src:
        local.write_bytes(src.read())
    return local


def seed_interval(mean: float | None, sd: float | None, seeds: int, confidence: float = 0.95) -> tuple:
    """Student-t interval over seeds alone (figures without per-position scores)."""
    from scipy import stats

    if mean is None or sd is None or seeds < 2:
        return None, None
    half = stats.t.ppf(0.5 + confidence / 2, seeds - 1) * sd / math.sqrt(seeds)
    return mean - half, mean + half


def figures(point: Point, rev: str | None, times: dict | None) -> dict:
    """Every claim of one point, from its phase-1 report and the per-position NLLs of phase 1,
    phase 2 and both controls on the same test windows (rev None: the workspace's default run)."""
    from lookahead.artifacts.val_scores import ScoringConfig, load_scores
    from lookahead.core.intervals import ratio_interval
    from lookahead.graph.cost import macs_per_token, window_at_macs_ratio
    from lookahead.pipeline.evaluate.claims import trained_claims

    import yaml

    report = read_json(rev, "metrics/phase1_report.json")
    params = yaml.safe_load(Path("params.yaml").read_text() if rev is None else sh("git", "show", f"{rev}:params.yaml"))
    arch, skip = params["base"]["arch"], params["runtime"]["skip"]
    if (arch["n_layers"], arch["n_heads"]) != (point.layers, point.heads):
        sys.exit(f"error: {point.name}: the run holds {arch['n_layers']}x{arch['n_heads']} heads")
    scoring = ScoringConfig(**params["scoring"])
    window = arch["context_length"]
    out = {"point": point.name, "n_layers": point.layers, "n_heads": point.heads, "heads": point.total,
           "log2_heads": math.log2(point.total), "hidden_size": arch["hidden_size"],
           "head_dim": arch["hidden_size"] // point.heads, "changes": point.changes, "oracle": point.oracle,
           "heads_kept": report["oracle_heads_kept"], "skip": skip, "window_set": report["window_set"],
           "seeds": report["seeds"]}
    # phase 1, the LM frozen (its paired claims and greedy capture come with intervals)
    for key in ("dense_nll", "static_pruning_nll", "deployed_nll", "hard_nll", "greedy_oracle_nll", "oracle_recall_at_k",
                "dynamic_fraction", "deployed_macs_over_dense", "router_macs_over_dense"):
        out[f"phase1_{key}"] = report.get(key)
    for claim in ("deployed_minus_static_pruning", "deployed_minus_static_at_equal_macs", "router_minus_static_pruning",
                  "greedy_capture"):
        out[claim] = report.get(claim)
        out[f"{claim}_ci_low"], out[f"{claim}_ci_high"] = report.get(f"{claim}_ci_low"), report.get(f"{claim}_ci_high")
    with tempfile.TemporaryDirectory() as tmp:
        files = {name: score_file(rev, f"data/val_nll/{name}.safetensors", Path(tmp))
                 for name in ("phase1", "phase2", "control", "static_control")}
        phase1 = load_scores(files["phase1"])
        trained, _ = trained_claims(scoring, window, files["phase2"], files["control"], files["static_control"])
    # ratio: the deployed router's NLL increase over static pruning's, both over dense (ratio of sums, CI)
    dense, static, deployed = (phase1[k] for k in ("dense", "static", "deployed"))
    ratio = ratio_interval(deployed - dense, static - dense, window, scoring.resamples, scoring.confidence, scoring.seed)
    out.update(deployed_ratio=ratio["mean"], deployed_ratio_ci_low=ratio["ci_low"], deployed_ratio_ci_high=ratio["ci_high"])
    # no per-position scores: intervals over the seeds alone (Student-t)
    for key in ("static_twin_gap", "context_shuffle_dnll"):
        out[key] = report.get(key)
        out[f"{key}_ci_low"], out[f"{key}_ci_high"] = seed_interval(report.get(key), report.get(f"{key}_sd"),
                                                                     report["seeds"], scoring.confidence)
    # phase 2 against both controls (evaluate's claims, from the same score files)
    for key in ("phase2_hard_nll", "dense_control_nll", "static_control_nll"):
        out[key] = trained[key]
    for claim in ("phase2_minus_control", "phase2_minus_static_control"):
        out[claim] = trained[claim]
        out[f"{claim}_ci_low"], out[f"{claim}_ci_high"] = trained[f"{claim}_ci_low"], trained[f"{claim}_ci_high"]
    # the compute case (graph.cost): the window at which the deployed router reaches 0.8x dense MACs
    from transformers import Olmo2Config

    with tempfile.TemporaryDirectory() as tmp:
        cfg = Olmo2Config.from_dict(json.loads(score_file(rev, "models/base/config.json", Path(tmp)).read_text()))
    on = report["active_head_fraction"]
    router = (report["router_macs_over_dense"] or 0.0) * macs_per_token(cfg, (window + 1) / 2, 1.0, skip)
    out["window_at_0_8_dense_macs"] = window_at_macs_ratio(cfg, on, skip, router, 0.8)
    out["stage_seconds"] = times
    out["rev"] = (rev or sh("git", "rev-parse", "HEAD").strip())[:12]
    return out


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


def trend(rows: list[dict], key: str, at: float = 8.0) -> dict | None:
    """Weighted least squares of a claim against log2(heads) (weights 1/se², se from each point's
    95 % interval), evaluated at log2(heads) = ``at`` with the standard error of the fit there; None
    below three points."""
    import numpy as np

    pts = [(r["log2_heads"], r[key], (r[f"{key}_ci_high"] - r[f"{key}_ci_low"]) / (2 * 1.96)) for r in rows
           if r.get(key) is not None and r.get(f"{key}_ci_low") is not None]
    if len(pts) < 3:
        return None
    x, y, se = (np.array(v, dtype=float) for v in zip(*pts))
    w = 1 / np.maximum(se, 1e-9) ** 2
    design = np.stack([np.ones_like(x), x], 1)
    cov = np.linalg.inv(design.T @ (design * w[:, None]))
    coef = cov @ design.T @ (w * y)
    resid = y - design @ coef
    scale = max(1.0, float((w * resid**2).sum() / (len(x) - 2)))  # widen where the points scatter beyond their se
    cov = cov * scale
    g = np.array([1.0, at])
    pred, pred_se = float(g @ coef), float(np.sqrt(g @ cov @ g))
    return {"slope_per_doubling": float(coef[1]), "slope_se": float(np.sqrt(cov[1, 1])), "at_log2_heads": at,
            "predicted": pred, "predicted_ci_low": pred - 1.96 * pred_se, "predicted_ci_high": pred + 1.96 * pred_se,
            "points": len(x), "overdispersion": scale}



def _cell(value, low=None, high=None, digits: int = 3) -> str:
    if value is None:
        return "–"
    return f"{value:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]" if low is not None else f"{value:+.{digits}f}"


def markdown(study: dict) -> str:
    """The page's tables, rendered from ``metrics/head_scaling.json`` (a test compares them)."""
    rows = study["points"]
    lines = ["| shape | heads | head dim | what changes | oracle | dense NLL | static pruning | router as deployed | "
             "greedy oracle | MACs as deployed / dense | window at 0.8× dense MACs |",
             "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        window = r["window_at_0_8_dense_macs"]
        lines.append(f"| {r['n_layers']} × {r['n_heads']} | {r['heads']} | {r['head_dim']} | {r['changes']} | {r['oracle']} | "
                     f"{r['phase1_dense_nll']:.3f} | {r['phase1_static_pruning_nll']:.3f} | {r['phase1_deployed_nll']:.3f} | "
                     f"{r['phase1_greedy_oracle_nll']:.3f} | {r['phase1_deployed_macs_over_dense']:.3f} | "
                     f"{'never' if window is None else f'{window:,.0f}'} |")
    lines += ["", "| shape | " + " | ".join(label for _, label in CLAIMS) + " |",
              "|---|" + "---|" * len(CLAIMS)]
    for r in rows:
        lines.append(f"| {r['n_layers']} × {r['n_heads']} | " + " | ".join(
            _cell(r.get(k), r.get(f"{k}_ci_low"), r.get(f"{k}_ci_high")) for k, _ in CLAIMS) + " |")
    trends = study["trend_at_256_heads"]
    lines.append("| trend at 256 heads | " + " | ".join(
        _cell(t["predicted"], t["predicted_ci_low"], t["predicted_ci_high"]) if (t := trends.get(k)) else "–"
        for k, _ in CLAIMS) + " |")
    lines.append("| slope per doubling of heads | " + " | ".join(
        _cell(t["slope_per_doubling"], t["slope_per_doubling"] - 1.96 * t["slope_se"],
              t["slope_per_doubling"] + 1.96 * t["slope_se"]) if (t := trends.get(k)) else "–" for k, _ in CLAIMS) + " |")
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
                             f"{v['static_nll']:.3f} | {name} | {x['trials_per_window']} ({v['exact_trials_per_window']}) | "
                             f"{x['speedup']:.1f}× | {_cell(x['nll_minus_exact'], *x['nll_minus_exact_ci'], digits=4)} | "
                             f"{_cell(x['capture'], *x['capture_ci'])} | {x['recall_of_exact']:.3f} |")
    times = [r for r in rows if r.get("stage_seconds")]
    if times:
        stages = [s for s in STAGES if any(s in r["stage_seconds"] for r in times)]
        lines += ["", "| shape | " + " | ".join(stages) + " | total (min) |", "|---|" + "---:|" * (len(stages) + 1)]
        for r in times:
            t = r["stage_seconds"]
            lines.append(f"| {r['n_layers']} × {r['n_heads']} | " + " | ".join(
                f"{t[s]:.0f}" if s in t else "–" for s in stages) + f" | {sum(t.values()) / 60:.1f} |")
    return "\n".join(lines)


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

def collect() -> list[dict]:
    rows = []
    for point in POINTS:
        path = POINT_DIR / f"{point.name}.json"
        if path.is_file():
            rows.append(json.loads(path.read_text(encoding="utf-8")))
    if not rows:
        sys.exit(f"error: no point in {POINT_DIR}: run the study first")
    return rows


def write(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lookahead.core.atomic import atomic_file, write_csv, write_json

    trends = {key: trend(rows, key) for key, _ in CLAIMS}
    sets = {r["window_set"] for r in rows}
    if len(sets) > 1:
        sys.exit(f"error: the points score different windows ({', '.join(sorted(sets))}): one window set per table")
    study = {"points": rows, "trend_at_256_heads": trends, "claims": {key: label for key, label in CLAIMS}}
    write_json(TABLE, study)
    update_page(study)
    flat = [{k: v for k, v in r.items() if not isinstance(v, dict)} for r in rows]
    write_csv(CSV, flat)
    fig, axes = plt.subplots(2, 4, figsize=(18, 8), dpi=100)
    for ax, (key, label) in zip(axes.flat, CLAIMS):
        pts = [r for r in rows if r.get(key) is not None]
        x = [r["log2_heads"] for r in pts]
        y = [r[key] for r in pts]
        lo = [r[key] - r[f"{key}_ci_low"] if r.get(f"{key}_ci_low") is not None else 0 for r in pts]
        hi = [r[f"{key}_ci_high"] - r[key] if r.get(f"{key}_ci_high") is not None else 0 for r in pts]
        ax.errorbar(x, y, yerr=[lo, hi], fmt="o-", capsize=4, color="tab:blue")
        fit = trends[key]
        if fit is not None:
            ax.errorbar([fit["at_log2_heads"]], [fit["predicted"]],
                        yerr=[[fit["predicted"] - fit["predicted_ci_low"]], [fit["predicted_ci_high"] - fit["predicted"]]],
                        fmt="s", color="tab:red", capsize=4, label="trend at 256 heads")
            ax.legend(fontsize=8)
        if "minus" in key or "gap" in key or "dnll" in key:
            ax.axhline(0, color="grey", lw=0.8, ls="--")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("log2(heads)")
        ax.set_xticks(sorted({*x, 8.0}))
    fig.suptitle("per-token routing against the number of heads (50 % off; test windows; 95 % intervals)")
    fig.tight_layout()
    FIGURE.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(FIGURE) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    print(f"{'point':>6} {'heads':>5}  " + "  ".join(f"{key[:22]:>22}" for key, _ in CLAIMS[:4]))
    for r in rows:
        print(f"{r['point']:>6} {r['heads']:>5}  " + "  ".join(
            f"{r[key]:+22.4f}" if r.get(key) is not None else f"{'-':>22}" for key, _ in CLAIMS[:4]))
    print(f"written: {TABLE}, {CSV}, {FIGURE} and the tables of {PAGE}")


def commit(point: Point, path: Path) -> None:
    sh("git", "add", str(path))
    sh("git", "commit", "-q", "-m", f"head scaling: point {point.name} ({point.total} heads, {point.oracle})",
       "--", str(path))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", default=",".join(p.name for p in POINTS),
                        help="comma-separated LxH points to run where missing (default: all)")
    parser.add_argument("--collect-only", action="store_true", help="tabulate the committed point files")
    parser.add_argument("--commit", action="store_true", help="git-commit each point's file as it finishes")
    parser.add_argument("--logs", default="logs/head_scaling", help="each experiment's DVC log (default logs/head_scaling)")
    args = parser.parse_args(argv)
    if not Path("dvc.yaml").is_file():
        parser.error("run from the repository root (dvc.yaml not found)")
    by_name = {p.name: p for p in POINTS}
    wanted = [name.strip() for name in args.points.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in by_name]
    if unknown:
        parser.error(f"--points: unknown {', '.join(unknown)}; known: {', '.join(by_name)}")
    if not args.collect_only:
        for point in (by_name[name] for name in wanted):
            path = POINT_DIR / f"{point.name}.json"
            if path.is_file():
                print(f"[head-scaling] {point.name}: read back from {path}", flush=True)
                continue
            if point == DEFAULT:  # the default run: the workspace's committed figures, never rerun
                row = figures(point, None, None)
            else:
                times = run_point(point, Path(args.logs))
                rev = experiment_rev(f"hs-{point.name}")
                row = figures(point, rev, times)
                if point.validate:
                    tic = time.time()
                    row["oracle_validation"] = validate_oracle(point, rev, point.validate)
                    row["oracle_validation_seconds"] = round(time.time() - tic, 1)
            from lookahead.core.atomic import write_json

            write_json(path, row)
            if args.commit:
                commit(point, path)
            print(f"[head-scaling] {point.name}: done ({path})", flush=True)
    write(collect())


if __name__ == "__main__":
    main()
