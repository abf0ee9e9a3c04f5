"""The NLL-vs-MACs frontier (docs/research/frontier.md): does routing buy quality per unit of compute?

At 4 x 4 and 4 x 8 heads, every point a DVC experiment in a temporary directory, its figures committed
to ``metrics/frontier/<set>/<point>.json`` as it finishes (``--commit``; experiment refs live in one
clone and no cache outlives a session): a committed point is read back, never rerun.

- **routed** ``<shape>-<skip>-keep<‰>``: phase 1's router as deployed and phase 2 after it, in ``full``
  skip at 75, 50, 25 and 12.5 % of heads kept and in ``query`` skip at 50, 25 and 12.5 % (at 75 % a
  query-skip router costs more than dense) — ``dvc exp run -S predictor.keep=k -S runtime.skip=s
  score_phase1 score_phase2 score_control`` with ``phase1.static_twin: false`` and the static curve
  scored (``phase1.score_static_curve``: static pruning at every whole head count, the *before*
  static frontier); its static control (the LM trained under the stronger static mask at that share)
  is a point of the *after* static frontier;
- **dense** ``<shape>-dense<width>-s<seed>``: the base recipe with a narrower attention
  (``base.arch.head_dim``: widths 96, 64 and 32 at hidden 128, and the full 128) over base seeds
  0, 1, 2, then its dense control (phase 2's tokens, no topology) — ``score_control`` alone: the
  smaller-dense frontier before (the base LM) and after (its control) continued pretraining.

Each point keeps its MACs per token over dense as they ran (the deployed router's gates counted, the
router included; static and dense in closed form, exact for them), the non-embedding ratio beside
it, and the per-window means of every per-position array its scoring stages wrote (``windows``), on
the scoring set of ``--set`` (``selection`` first: the headline point is declared from it,
``--declare``; then ``test``, scored once). The claims (:mod:`lookahead.tools.frontier_fit`) are
routed − frontier at the same MACs, before and after continued pretraining.

Usage: make frontier [FRONTIER_ARGS="--set selection --points 4x4-full-keep250"]
       python scripts/frontier.py --plan        (the grid and what each point runs)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

from lookahead.tools.experiments import StudyError, commit, fail, output_file, read_json, read_params, run_experiment

POINT_DIR = Path("metrics/frontier")
SETS = ("selection", "test")

SHAPES = {
    "4x4": {"base.arch.n_layers": 4, "base.arch.n_heads": 4},
    # the lazy greedy oracle at 32 heads, as the head-scaling study runs it (validated there)
    "4x8": {"base.arch.n_layers": 4, "base.arch.n_heads": 8, "oracle.candidates": 4},
}
ROUTED_GRID = (("full", 0.75), ("full", 0.5), ("full", 0.25), ("full", 0.125),
               ("query", 0.5), ("query", 0.25), ("query", 0.125))
"""(skip, share of heads kept): ``query`` skip keeps every key and value, so at 75 % kept it costs more than dense."""
ROUTED_SETTINGS = {"phase1.static_twin": False, "phase1.score_static_curve": True}
WIDTHS = (128, 96, 64, 32)
"""Attention widths (n_heads · head_dim) of the dense models at hidden 128: 128 is the base recipe itself."""
BASE_SEEDS = (0, 1, 2)
ROUTED_TARGETS = ("score_phase1", "score_phase2", "score_control")
DENSE_TARGETS = ("score_control",)


@dataclasses.dataclass(frozen=True)
class Point:
    shape: str
    kind: str  # routed | dense
    skip: str = ""
    keep: float = 0.0
    width: int = 0
    seed: int = 0

    @property
    def name(self) -> str:
        if self.kind == "routed":
            return f"{self.shape}-{self.skip}-keep{round(self.keep * 1000)}"
        return f"{self.shape}-dense{self.width}-s{self.seed}"

    @property
    def heads(self) -> int:
        return SHAPES[self.shape]["base.arch.n_heads"]

    def overrides(self, scoring_set: str) -> dict:
        out = {**SHAPES[self.shape], "scoring.set": scoring_set}
        if self.kind == "routed":
            return {**out, **ROUTED_SETTINGS, "predictor.keep": self.keep, "runtime.skip": self.skip}
        if self.width % self.heads or (self.width // self.heads) % 2:
            raise StudyError(f"{self.name}: width {self.width} is no even head dim at {self.heads} heads")
        return {**out, "base.arch.head_dim": self.width // self.heads, "base.train.seed": self.seed}

    @property
    def targets(self) -> tuple[str, ...]:
        return ROUTED_TARGETS if self.kind == "routed" else DENSE_TARGETS


def grid(shapes=tuple(SHAPES)) -> list[Point]:
    """Every point of the study, routed first (the dense points' full width at seed 0 is the routed
    points' own base: its control scored by them, so it is read from them, not rerun)."""
    routed = [Point(s, "routed", skip, keep) for s in shapes for skip, keep in ROUTED_GRID]
    dense = [Point(s, "dense", width=w, seed=seed) for s in shapes for w in WIDTHS for seed in BASE_SEEDS
             if (w, seed) != (WIDTHS[0], 0)]
    return routed + dense


def experiment_name(point: Point, scoring_set: str) -> str:
    return f"fr-{point.name}" + ("" if scoring_set == "test" else f"-{scoring_set[:3]}")


# --- one point: its MACs and per-window means ----------------------------------------------------

def full_width(cfg):
    """The shape's dense model at full attention width (head_dim = hidden / heads): every point's MACs are over its."""
    from transformers import Olmo2Config

    return Olmo2Config.from_dict({**cfg.to_dict(), "head_dim": cfg.hidden_size // cfg.num_attention_heads})


def macs_figures(cfg, window: int, keys: dict[str, float | None]) -> dict:
    """Each MACs-over-dense figure of ``keys`` (over ``cfg``'s dense forward: the shape's full width)
    with its non-embedding ratio beside it: (m · dense − d·V) / (dense − d·V), d·V the LM head's
    (:func:`lookahead.graph.cost.lm_head_macs`)."""
    from lookahead.graph.cost import lm_head_macs, macs_per_token

    dense = macs_per_token(cfg, (window + 1) / 2, 1.0, "query")
    head = lm_head_macs(cfg)
    out = {"dense_macs_per_token": dense, "lm_head_macs_per_token": head}
    for key, ratio in keys.items():
        out[key] = ratio
        out[f"{key}_non_embedding"] = None if ratio is None else (ratio * dense - head) / (dense - head)
    return out


def point_record(point: Point, rev: str, times: dict, scoring_set: str) -> dict:
    """What a point keeps (module docstring), from its experiment commit ``rev``."""
    from transformers import Olmo2Config

    from lookahead.graph.cost import macs_per_token
    from lookahead.tools.bases import window_means
    from lookahead.artifacts.val_scores import load_scores

    params = read_params(rev)
    window = params["base"]["arch"]["context_length"]
    files = ("phase1", "phase2", "static_control", "control") if point.kind == "routed" else ("control",)
    record = {"point": point.name, **dataclasses.asdict(point), "set": scoring_set, "rev": rev[:12],
              "stage_seconds": times, "windows": {}}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Olmo2Config.from_dict(json.loads(output_file(rev, "models/base/config.json", Path(tmp)).read_text()))
        for name in files:
            scores = load_scores(output_file(rev, f"data/val_nll/{name}.safetensors", Path(tmp)))
            record.setdefault("window_set", scores.window_set)
            if scores.window_set != record["window_set"]:
                raise StudyError(f"{point.name}: {name} scores {scores.window_set}, not {record['window_set']}")
            record["windows"][name] = window_means(scores)
    if point.kind == "routed":
        phase1 = read_json(rev, "metrics/phase1_report.json")
        phase2 = read_json(rev, "metrics/phase2_report.json")
        n = point.heads * params["base"]["arch"]["n_layers"]
        static_kept = round(point.keep * n)
        ctx = (window + 1) / 2
        static = lambda k: macs_per_token(cfg, ctx, k / n, "static") / macs_per_token(cfg, ctx, 1.0, "static")  # noqa: E731
        record.update(active_head_fraction=phase1["active_head_fraction"], heads_total=n,
                      phase2_active_head_fraction=phase2.get("active_head_fraction"))
        record["macs"] = macs_figures(cfg, window, {
            "deployed": phase1["deployed_macs_over_dense"],  # as its gates ran, the router included
            "phase2_deployed": phase2.get("deployed_macs_over_dense"),
            "static_control": static(static_kept),
            **{f"static_heads_{k}": static(k) for k in range(1, n + 1)}})
        record["static_control_heads"] = static_kept
    else:  # a narrower attention: its dense MACs over the full width's
        full = full_width(cfg)
        ctx = (window + 1) / 2
        record["macs"] = macs_figures(full, window, {
            "dense": macs_per_token(cfg, ctx, 1.0, "query") / macs_per_token(full, ctx, 1.0, "query")})
    return record


# --- the frontiers and the claims ----------------------------------------------------------------

FRONTIERS = ("static_before", "static_after", "dense_before", "dense_after")


def _rows(record: dict, file: str, key: str):
    import numpy as np

    return np.asarray(record["windows"][file][key], dtype=np.float64)  # (rows, windows)


def frontiers(records: list[dict], shape: str) -> dict[str, list[tuple[float, object, str]]]:
    """Each frontier of ``shape`` as (MACs over dense, (rows, windows) per-window NLLs, label) points:

    - ``static_before``: the stronger static mask at every whole head count (a full-skip routed
      point's static curve; all heads: the base LM itself);
    - ``static_after``: each full-skip routed point's static control at its share, and the dense control at 1;
    - ``dense_before`` / ``dense_after``: at each attention width, the base LMs of the base seeds (one
      row each) and their dense controls (each base seed's control seeds averaged: one row per base).
    """
    import numpy as np

    routed = [r for r in records if r["shape"] == shape and r["kind"] == "routed"]
    full = sorted((r for r in routed if r["skip"] == "full"), key=lambda r: r["keep"])
    out: dict[str, list] = {k: [] for k in FRONTIERS}
    if full:
        curve, n = full[0], full[0]["heads_total"]
        out["static_before"] = [(curve["macs"][f"static_heads_{k}"], _rows(curve, "phase1", f"static_heads_{k}"),
                                 f"static {k}/{n}") for k in range(1, n + 1)]
        out["static_after"] = [(r["macs"]["static_control"], _rows(r, "static_control", "hard"),
                                f"static control {r['static_control_heads']}/{n}") for r in full]
        out["static_after"].append((1.0, _rows(curve, "control", "dense"), "dense control"))
    widths: dict[int, list[tuple[float, object, object]]] = {}
    if routed:  # the base recipe at seed 0: the routed points' own base and its control
        r = routed[0]
        widths.setdefault(WIDTHS[0], []).append((1.0, _rows(r, "control", "base"), _rows(r, "control", "dense")))
    for r in (r for r in records if r["shape"] == shape and r["kind"] == "dense"):
        widths.setdefault(r["width"], []).append((r["macs"]["dense"], _rows(r, "control", "base"),
                                                   _rows(r, "control", "dense")))
    for width, seeds in sorted(widths.items(), reverse=True):
        macs = seeds[0][0]
        before = np.vstack([b.mean(0, keepdims=True) for _, b, _ in seeds])  # (base seeds, windows)
        after = np.vstack([a.mean(0, keepdims=True) for _, _, a in seeds])
        out["dense_before"].append((macs, before, f"dense {width}"))
        out["dense_after"].append((macs, after, f"dense {width} + control"))
    return out


CLAIM_SIDES = (("before", "phase1", "deployed"), ("after", "phase2", "phase2_deployed"))
"""(when, the routed point's score file, its MACs key): the router as deployed, before and after continued pretraining."""


def claims(records: list[dict], shape: str, resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> list[dict]:
    """At every routed point of ``shape``, before and after continued pretraining: routed − the static
    frontier and routed − the smaller-dense frontier at the routed point's MACs
    (:func:`lookahead.tools.frontier_fit.frontier_claim`; None outside a frontier's measured range)."""
    from lookahead.tools.frontier_fit import frontier_claim, verdict

    f = frontiers(records, shape)
    out = []
    for r in (r for r in records if r["shape"] == shape and r["kind"] == "routed"):
        for when, file, macs_key in CLAIM_SIDES:
            macs = r["macs"].get(macs_key)
            if macs is None or "deployed" not in r["windows"].get(file, {}):
                continue
            routed = _rows(r, file, "deployed")
            for against in ("static", "dense"):
                points = [(m, a) for m, a, _ in f[f"{against}_{when}"]]
                claim = frontier_claim(routed, macs, points, resamples=resamples, confidence=confidence, seed=seed)
                out.append({"point": r["point"], "skip": r["skip"], "keep": r["keep"], "when": when, "against": against,
                            "macs_over_dense": macs, "routed_nll": float(routed.mean()),
                            **({} if claim is None else claim), "verdict": verdict(claim)})
    return out


def point_path(point: Point, scoring_set: str) -> Path:
    return POINT_DIR / scoring_set / f"{point.name}.json"


def run_points(points: list[Point], scoring_set: str, log_dir: Path, commit_each: bool, rerun: bool) -> None:
    from lookahead.tools.bases import write_record

    for point in points:
        path = point_path(point, scoring_set)
        if path.is_file():
            print(f"[frontier] {point.name}: read back from {path}", flush=True)
            continue
        rev, times = run_experiment(experiment_name(point, scoring_set), point.overrides(scoring_set), log_dir,
                                    point.targets, rerun, tag="frontier")
        write_record(path, point_record(point, rev, times, scoring_set))
        if commit_each:
            commit([path], f"frontier ({scoring_set}): point {point.name}")
        print(f"[frontier] {point.name}: done ({path})", flush=True)


def plan(points: list[Point], scoring_set: str) -> str:
    lines = []
    for p in points:
        state = "committed" if point_path(p, scoring_set).is_file() else "to run"
        sets = " ".join(f"-S {k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in p.overrides(scoring_set).items())
        lines.append(f"{p.name:24s} {state:9s} dvc exp run --temp -n {experiment_name(p, scoring_set)} {sets} "
                     f"{' '.join(p.targets)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", choices=SETS, default="selection",
                        help="the scoring windows (selection: where the headline point is chosen; test: scored once)")
    parser.add_argument("--points", default="", help="comma-separated point names (default: every point)")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated shapes (default: 4x4,4x8)")
    parser.add_argument("--plan", action="store_true", help="print each point, whether it is committed, and its command")
    parser.add_argument("--commit", action="store_true", help="git-commit each point's file as it finishes")
    parser.add_argument("--rerun", action="store_true", help="rerun an experiment of this clone whose figures are not committed")
    parser.add_argument("--logs", default="logs/frontier", help="each experiment's DVC log")
    args = parser.parse_args(argv)
    if not Path("dvc.yaml").is_file():
        parser.error("run from the repository root (dvc.yaml not found)")
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"--shapes: unknown {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    points = grid(tuple(shapes))
    if args.points:
        by_name = {p.name: p for p in points}
        wanted = [n.strip() for n in args.points.split(",") if n.strip()]
        missing = [n for n in wanted if n not in by_name]
        if missing:
            parser.error(f"--points: unknown {', '.join(missing)}; known: {', '.join(by_name)}")
        points = [by_name[n] for n in wanted]
    if args.plan:
        print(plan(points, args.set))
        return
    run_points(points, args.set, Path(args.logs), args.commit, args.rerun)


if __name__ == "__main__":
    try:
        main()
    except StudyError as error:
        fail(error)
