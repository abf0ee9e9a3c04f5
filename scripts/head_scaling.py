"""Head scaling (docs/research/head-scaling.md): does per-token routing pay more with more heads?

A family of model shapes from the default's 4 x 4 heads toward 16 x 16, one thing changed at a time
(heads per layer at the default's depth and width, then depth at 16 heads per layer), each point's
research chain run as a DVC experiment in a temporary directory:

    dvc exp run --temp -n hs-<L>x<H> -S base.arch.n_layers=L -S base.arch.n_heads=H [-S oracle...] \
        score_phase1 score_phase2 score_control

which runs base → probe, init, contexts → oracle → phase 1 and its scoring (its claims on the test
windows) → phase 2 + the dense and static controls and their scoring (their per-position NLLs on the
same windows), and leaves
out what the study does not read (modulator, pairs, diffusion, evaluate). The default's own run is
the 4 x 4 point: its figures are read from the workspace where its run is complete (``dvc status``
clean), else it runs as the others do. Each point's figures go to
``metrics/head_scaling/<point>.json`` and are committed as soon as the point finishes (``--commit``,
on in ``make head-scaling``): experiment refs live in one clone, and a study this long is
interrupted. A point whose file exists is read back, never rerun; a point whose experiment succeeded
but whose figures were not collected is collected from it; an interrupted point reruns, its finished
stages restored from DVC's run cache. Stage times come from the MLflow runs the stages log
(lookahead.core.tracking), grouped by experiment name. ``--quarter`` adds phase 1 at 75 % off
(an oracle + phase 1 experiment per point, ``predictor.keep=0.25``).

Each point file keeps the per-window means of every per-position array its scoring stages saved
(``windows``), which the fits across points read (:mod:`lookahead.tools.scaling_fit`: the slope over
the heads-per-layer leg and the adjacent differences, windows resampled jointly; no value past the
largest point). The tables, headline, figure and page are rendered by :mod:`lookahead.tools.scaling_page`:

    metrics/head_scaling.json         the headline: two claims at the largest point and their slope over the
                                      heads-per-layer leg (their intervals in metrics/head_scaling_ci.json)
    metrics/head_scaling_report.json  the full battery: every NLL, the oracle check, stage times, the fits
    metrics/head_scaling.csv          the battery, one row per point
    docs/figures/head_scaling.png     each claim with its interval against log2(heads)

Usage: make head-scaling [SCALING_ARGS="--points 4x8,4x16"]   (python scripts/head_scaling.py --help)
--collect-only rebuilds the table and figure from the committed point files.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from lookahead.tools.experiments import (StudyError, commit, experiment_rev, fail, output_file, read_json, read_params,
                                         run_experiment, sh)
from lookahead.tools.scaling_page import (BEGIN, CLAIMS, END, HEADLINE_CLAIMS, PAGE, QUARTER_FIT_CLAIMS,  # noqa: F401
                                           QUARTER_HEADLINE_CLAIM, QUARTER_KEYS, REPORT, STAGES, TABLE, fits,
                                           headline, markdown, quarter_rows, without_windows, write)

POINT_DIR = Path("metrics/head_scaling")
TARGETS = ("score_phase1", "score_phase2", "score_control")  # and every stage they read: phase 1, phase 2, both controls


@dataclasses.dataclass(frozen=True)
class Point:
    layers: int
    heads: int
    per_round: int = 1
    candidates: int = 0
    changes: str = ""
    validate: int = 0
    """Selection windows on which the point's lazy oracle is checked against the exact greedy (0: not)."""
    static_candidates: int = 0
    """The greedy static mask's search (``static_baselines.candidates``): 0 exact, else lazy with that many a step."""

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

    @property
    def static_mask(self) -> str:
        return f"lazy greedy (candidates {self.static_candidates})" if self.static_candidates else "exact greedy"

    def overrides(self) -> dict:
        return {"base.arch.n_layers": self.layers, "base.arch.n_heads": self.heads,
                "oracle.per_round": self.per_round, "oracle.candidates": self.candidates,
                "static_baselines.candidates": self.static_candidates}


# One change at a time: heads per layer at the default's depth and width (hidden 128: the same
# parameters and FLOPs, smaller heads), then depth at 16 heads per layer. The default run's exact greedy
# oracle at 16 heads; above that the lazy greedy with 4 candidates a step, which matches it within
# 0.01 nats at 16 heads (benchmarks/greedy_rounds.py), with one oracle for every point it runs. The greedy
# static mask: exact up to 32 heads, lazy with 4 candidates a step from 64 (exact
# there: heads^2 / 2 evaluations of the fit windows: 10 min at 32 heads, about 45 at 64).
POINTS = (
    Point(4, 4, changes="the default (4 layers, hidden 128, head dim 32)"),
    Point(4, 8, candidates=4, changes="heads per layer x2 (head dim 16)", validate=32),
    Point(4, 16, candidates=4, static_candidates=4, changes="heads per layer x4 (head dim 8)"),
    Point(8, 16, candidates=4, static_candidates=4, changes="depth x2 at 16 heads per layer"),
    Point(16, 16, per_round=2, candidates=4, static_candidates=4, changes="depth x4 at 16 heads per layer: the 1B graph"),
)
DEFAULT = POINTS[0]


def run_point(point: Point, log_dir: Path, name: str | None = None, extra: dict | None = None,
              targets: tuple[str, ...] = TARGETS, rerun: bool = False) -> tuple[str, dict[str, float]]:
    """The point's chain as the DVC experiment ``hs-<name>`` (:func:`lookahead.tools.experiments.run_experiment`):
    its commit and each stage's seconds."""
    return run_experiment(f"hs-{name or point.name}", {**point.overrides(), **(extra or {})}, log_dir, targets,
                          rerun, tag="head-scaling")


def validate_oracle(point: Point, rev: str, windows: int) -> dict:
    """benchmarks/greedy_rounds.py on the point's own base LM, head importance, tokens, context cache and
    params (exported from the experiment: a fresh clone's workspace holds none of them): the exact greedy
    against the point's lazy search and c = 8, on ``windows`` selection windows; its JSON line."""
    from dvc.api import DVCFileSystem

    fs = DVCFileSystem(".", rev=rev)
    with tempfile.TemporaryDirectory() as tmp:
        for path in ("models/base", "data/tokens", "data/contexts"):
            fs.get(path, f"{tmp}/{Path(path).name}", recursive=True)
        fs.get("data/probe/heads.safetensors", f"{tmp}/heads.safetensors")
        Path(tmp, "params.yaml").write_text(sh("git", "show", f"{rev}:params.yaml"), encoding="utf-8")
        variant = (f"r{point.per_round}" if point.per_round > 1 else "") + f"c{point.candidates}"
        print(f"[head-scaling] {point.name}: the lazy oracle against the exact greedy on {windows} windows", flush=True)
        line = sh(sys.executable, "benchmarks/greedy_rounds.py", "--base", f"{tmp}/base", "--heads",
                  f"{tmp}/heads.safetensors", "--tokens", f"{tmp}/tokens", "--contexts", f"{tmp}/contexts",
                  "--params", f"{tmp}/params.yaml", "--windows", str(windows), "--variants", f"{variant},c8")
    return json.loads(line.strip().splitlines()[-1])


QUARTER = 0.25
"""Phase 1 at 75 % of heads off (``--quarter``): ``predictor.keep`` of its phase-1-only experiment."""


def quarter_name(point: Point) -> str:
    return f"{point.name}-keep{round(QUARTER * 100)}"


def run_quarter(point: Point, log_dir: Path, rerun: bool = False) -> dict:
    """Phase 1 of the point at 75 % off: an experiment of the oracle and phase 1 (and its scoring) alone (the base LM,
    probe, init and contexts restored from the point's run), its phase-1 figures and per-window NLLs."""
    from lookahead.artifacts.val_scores import scoring_from_params

    rev, times = run_point(point, log_dir, quarter_name(point), {"predictor.keep": QUARTER}, ("score_phase1",), rerun)
    params = read_params(rev)
    with tempfile.TemporaryDirectory() as tmp:
        scores = output_file(rev, "data/val_nll/phase1.safetensors", Path(tmp))
        out = phase1_figures(rev, scoring_from_params(params), params["base"]["arch"]["context_length"], scores)
        out["windows"] = windows_of({"phase1": scores})
    return {**out, "keep": QUARTER, "stage_seconds": times, "rev": rev[:12]}


def windows_of(files: dict[str, Path]) -> dict:
    """The per-window means of every per-position array of each scoring file (``{name: path}``;
    :func:`lookahead.tools.bases.window_means`): what the fits across points read."""
    from lookahead.artifacts.val_scores import load_scores
    from lookahead.tools.bases import window_means

    return {name: window_means(load_scores(path)) for name, path in files.items()}


def score_windows(rev: str | None, names: tuple[str, ...]) -> dict:
    """:func:`windows_of` the scoring files ``data/val_nll/<name>.safetensors`` of a run."""
    with tempfile.TemporaryDirectory() as tmp:
        return windows_of({name: output_file(rev, f"data/val_nll/{name}.safetensors", Path(tmp)) for name in names})


def seed_interval(mean: float | None, sd: float | None, seeds: int, confidence: float = 0.95) -> tuple:
    """Student-t interval over seeds alone (figures without per-position scores):
    :func:`lookahead.core.intervals.combined_interval` with no window component."""
    from lookahead.core.intervals import combined_interval

    if mean is None or sd is None or seeds < 2:
        return None, None
    interval = combined_interval(mean, 0.0, sd, seeds, confidence)
    return interval["ci_low"], interval["ci_high"]


PHASE1_CLAIMS = ("deployed_minus_static_pruning", "deployed_minus_static_at_equal_macs", "router_minus_static_pruning",
                 "greedy_capture")


def phase1_figures(rev: str | None, scoring, window: int, scores: Path) -> dict:
    """Phase 1's figures of a run (the LM frozen): NLLs, its paired claims and greedy capture with
    their intervals (phase 1's report), the ratio of NLL increases with its interval (from its
    per-position NLLs, ``scores``: the run's data/val_nll/phase1.safetensors), the static twin gap and
    context-shuffle ΔNLL (intervals over seeds alone)."""
    from lookahead.artifacts.val_scores import load_scores
    from lookahead.core.intervals import ratio_interval

    report = read_json(rev, "metrics/phase1_report.json")
    out = {"heads_kept": report["oracle_heads_kept"], "window_set": report["window_set"], "seeds": report["seeds"],
           "active_head_fraction": report["active_head_fraction"]}
    for key in ("dense_nll", "static_pruning_nll", "deployed_nll", "hard_nll", "greedy_oracle_nll", "oracle_recall_at_k",
                "dynamic_fraction", "deployed_macs_over_dense", "router_macs_over_dense"):
        out[f"phase1_{key}"] = report.get(key)
    for claim in PHASE1_CLAIMS:
        out[claim] = report.get(claim)
        out[f"{claim}_ci_low"], out[f"{claim}_ci_high"] = report.get(f"{claim}_ci_low"), report.get(f"{claim}_ci_high")
    phase1 = load_scores(scores)
    # ratio: the deployed router's NLL increase over static pruning's, both over dense (ratio of sums, CI)
    dense, static, deployed = (phase1[k] for k in ("dense", "static", "deployed"))
    ratio = ratio_interval(deployed - dense, static - dense, window, scoring.resamples, scoring.confidence, scoring.bootstrap_seed)
    out.update(deployed_ratio=ratio["mean"], deployed_ratio_ci_low=ratio["ci_low"], deployed_ratio_ci_high=ratio["ci_high"])
    # no per-position scores: intervals over the seeds alone (Student-t)
    for key in ("static_twin_gap", "context_shuffle_dnll"):
        out[key] = report.get(key)
        out[f"{key}_ci_low"], out[f"{key}_ci_high"] = seed_interval(report.get(key), report.get(f"{key}_sd"),
                                                                     report["seeds"], scoring.confidence)
    return out


def figures(point: Point, rev: str | None, times: dict | None) -> dict:
    """Every claim of one point, from its phase-1 report and the per-position NLLs of phase 1,
    phase 2 and both controls on the same test windows (rev None: the workspace's default run)."""
    from lookahead.artifacts.val_scores import scoring_from_params
    from lookahead.graph.cost import macs_per_token, window_at_macs_ratio
    from lookahead.pipeline.evaluate.claims import trained_claims

    params = read_params(rev)
    arch, skip = params["base"]["arch"], params["runtime"]["skip"]
    if (arch["n_layers"], arch["n_heads"]) != (point.layers, point.heads):
        sys.exit(f"error: {point.name}: the run holds {arch['n_layers']}x{arch['n_heads']} heads")
    scoring = scoring_from_params(params)
    window = arch["context_length"]
    with tempfile.TemporaryDirectory() as tmp:
        files = {name: output_file(rev, f"data/val_nll/{name}.safetensors", Path(tmp))
                 for name in ("phase1", "phase2", "control", "static_control")}
        phase1 = phase1_figures(rev, scoring, window, files["phase1"])
        trained, _ = trained_claims(scoring, window, files["phase2"], files["control"], files["static_control"])
        windows = windows_of(files)
    out = {"point": point.name, "n_layers": point.layers, "n_heads": point.heads, "heads": point.total,
           "log2_heads": math.log2(point.total), "hidden_size": arch["hidden_size"],
           "head_dim": arch["hidden_size"] // point.heads, "changes": point.changes, "oracle": point.oracle,
           "static_mask": point.static_mask,
           "skip": skip, **phase1, "windows": windows}
    # what differs between points besides heads (the confounds table)
    base = read_json(rev, "metrics/base.json")
    train = params["base"]["train"]
    out.update(parameters=base.get("parameters"), train_tokens=train["steps"] * train["batch_size"] * window)
    # phase 2 against both controls (evaluate's claims, from the same score files)
    for key in ("phase2_hard_nll", "dense_control_nll", "static_control_nll"):
        out[key] = trained[key]
    for claim in ("phase2_minus_control", "phase2_minus_static_control"):
        out[claim] = trained[claim]
        out[f"{claim}_ci_low"], out[f"{claim}_ci_high"] = trained[f"{claim}_ci_low"], trained[f"{claim}_ci_high"]
    # the compute case (graph.cost): the window at which the deployed router reaches 0.8x dense MACs
    from transformers import Olmo2Config

    with tempfile.TemporaryDirectory() as tmp:
        cfg = Olmo2Config.from_dict(json.loads(output_file(rev, "models/base/config.json", Path(tmp)).read_text()))
    router = (out["phase1_router_macs_over_dense"] or 0.0) * macs_per_token(cfg, (window + 1) / 2, 1.0, skip)
    out["window_at_0_8_dense_macs"] = window_at_macs_ratio(cfg, out["active_head_fraction"], skip, router, 0.8)
    out["stage_seconds"] = times
    out["rev"] = (rev or sh("git", "rev-parse", "HEAD").strip())[:12]
    return out


def collect() -> tuple[list[dict], list[str]]:
    """The committed points scored under the study's rules (those that keep per-window NLLs), and the names
    of those scored under earlier rules, which await their rerun (kept out of the tables: other windows)."""
    rows, pending = [], []
    for point in POINTS:
        path = POINT_DIR / f"{point.name}.json"
        if path.is_file():
            row = json.loads(path.read_text(encoding="utf-8"))
            (rows.append(row) if "windows" in row else pending.append(point.name))
    if not rows:
        sys.exit(f"error: no point in {POINT_DIR} scored under the study's rules: run the study first")
    return rows, pending


def commit_point(point: Point, path: Path, what: str = "") -> None:
    commit([path], f"head scaling: point {point.name} ({point.total} heads, {point.oracle})" + (f": {what}" if what else ""))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", default=",".join(p.name for p in POINTS),
                        help="comma-separated LxH points to run where missing (default: all)")
    parser.add_argument("--collect-only", action="store_true", help="tabulate the committed point files")
    parser.add_argument("--commit", action="store_true", help="git-commit each point's file as it finishes")
    parser.add_argument("--rerun", action="store_true",
                        help="rerun a point whose experiment exists in this clone but whose figures are not committed")
    parser.add_argument("--quarter", action="store_true",
                        help="also phase 1 at 75 %% of heads off (an oracle + phase 1 experiment per point)")
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
        from lookahead.tools.bases import workspace_is_complete, write_record

        for point in (by_name[name] for name in wanted):
            path = POINT_DIR / f"{point.name}.json"
            row = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
            if row is not None and "windows" not in row:  # scored under earlier rules: no per-window NLLs to fit
                print(f"[head-scaling] {point.name}: {path} keeps no per-window NLLs (earlier rules): rerunning it",
                      flush=True)
                row = None
            if row is not None:
                print(f"[head-scaling] {point.name}: read back from {path}", flush=True)
            else:
                if point == DEFAULT and workspace_is_complete():  # the default run: the workspace's own
                    row = figures(point, None, None)
                else:
                    rev, times = run_point(point, Path(args.logs), rerun=args.rerun)
                    row = figures(point, rev, times)
                    if point.validate:
                        tic = time.time()
                        row["oracle_validation"] = validate_oracle(point, rev, point.validate)
                        row["oracle_validation_seconds"] = round(time.time() - tic, 1)
                write_record(path, row)
                if args.commit:
                    commit_point(point, path)
                print(f"[head-scaling] {point.name}: done ({path})", flush=True)
            if args.quarter and "off_75" in row and "windows" not in row["off_75"]:
                # recorded before the 75 % rows kept per-window NLLs: from its experiment where this clone holds it
                rev = experiment_rev(f"hs-{quarter_name(point)}")
                if rev is not None:
                    row["off_75"]["windows"] = score_windows(rev, ("phase1",))
                    write_record(path, row)
                    if args.commit:
                        commit_point(point, path, "phase 1 at 75 % off: its per-window NLLs")
                else:
                    print(f"[head-scaling] {point.name}: its 75 % row keeps no per-window NLLs (earlier rules): "
                          "rerunning it", flush=True)
                    del row["off_75"]
            if args.quarter and "off_75" not in row:
                row["off_75"] = run_quarter(point, Path(args.logs), args.rerun)
                write_record(path, row)
                if args.commit:
                    commit_point(point, path, "phase 1 at 75 % off")
                print(f"[head-scaling] {point.name}: phase 1 at 75 % off done ({path})", flush=True)
    write(*collect())


if __name__ == "__main__":
    try:
        main()
    except StudyError as error:
        fail(error)
