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
- **dense** ``4x4-dense<width>-s0``: the base recipe with a narrower attention (``base.arch.head_dim``:
  widths 96, 64 and 32 at hidden 128; the full 128 is each routed point's own base), then its dense
  control (phase 2's tokens, no topology) — ``score_control`` alone: the smaller-dense frontier before
  (the base LM) and after (its control) continued pretraining, one for both shapes (the same MACs at
  the same width), the between-base spread of ``make bases`` added to its claims.

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
ROUTED_SETTINGS = {"phase1.static_twin": False, "phase1.score_static_curve": True, "phase1.oracle": "none",
                   "phase1.random_draws": 1}
"""What the frontier reads and no more: no static twin, no greedy oracle on the scoring windows (its
capture is the head-scaling study's), one draw of random heads; the static curve scored."""
WIDTHS = (96, 64, 32)
"""Attention widths (n_heads · head_dim) of the smaller dense models at hidden 128 (the full 128 is
each routed point's own base). Run at 4 x 4 only: at the same width a 4 x 8 attention costs the same
MACs, so the smaller-dense frontier is one for both shapes, with each shape's own base at 1."""
DENSE_SHAPE = "4x4"
BASE_SEEDS = (0,)
"""One base LM per width: the between-base spread that ``make bases`` measured at 4 x 4 is added to the
claims against the dense frontier (an assumption the page states), as the issue allows."""
ROUTED_TARGETS = ("score_phase1", "score_phase2", "score_control")
DENSE_TARGETS = ("score_control",)


VARIANT_SETTINGS = {
    "router64": {"predictor.hidden": 64},  # a smaller router: ~1/4 of its MACs (at this width ~5 % of a dense forward)
    "router32": {"predictor.hidden": 32},
    "perlayer": {"predictor.budget": "topk_layer"},  # every layer keeps the same share of its heads
    "perlayerstatic": {"predictor.budget": "topk_layer_static"},  # each layer the count static importance keeps there
    "phase2x2": {"phase2.train.steps": 400},  # twice the continued pretraining (the controls alike)
}
"""The research target's variants (``--variants``): each at the routed points where it can change the
answer (full skip, deep, and where the router costs most of what routing saves), on the selection
windows like every other point."""
VARIANT_GRID = (("4x4", "full", 0.25, "router64"), ("4x4", "full", 0.25, "router32"),
                ("4x4", "full", 0.125, "router32"), ("4x4", "full", 0.25, "perlayer"),
                ("4x4", "full", 0.25, "perlayerstatic"), ("4x4", "full", 0.25, "phase2x2"),
                # where the router eats what routing saves (0.99 of dense MACs as deployed at these points)
                ("4x4", "query", 0.5, "router32"), ("4x8", "full", 0.75, "router32"),
                ("4x8", "full", 0.0625, ""), ("4x8", "full", 0.125, "router32"))
DENSE_VARIANTS = (("phase2x2", 64), ("phase2x2", 32))
"""(variant, width): the smaller dense models whose controls train as a variant's do — the phase2x2
point (0.89 of dense MACs) is measured against a dense frontier trained alike, between these widths."""


@dataclasses.dataclass(frozen=True)
class Point:
    shape: str
    kind: str  # routed | dense
    skip: str = ""
    keep: float = 0.0
    width: int = 0
    seed: int = 0
    variant: str = ""
    """A key of :data:`VARIANT_SETTINGS` ("": the grid's settings)."""

    @property
    def name(self) -> str:
        tail = f"-{self.variant}" if self.variant else ""
        if self.kind == "routed":
            return f"{self.shape}-{self.skip}-keep{round(self.keep * 1000)}{tail}"
        return f"{self.shape}-dense{self.width}-s{self.seed}{tail}"

    @property
    def controls(self) -> str:
        """The continued-pretraining settings its controls train under ("": the grid's): a variant that
        changes them is measured against frontiers trained alike (:func:`lookahead.tools.frontier_fit.frontiers`)."""
        return ",".join(f"{k}={v}" for k, v in sorted(VARIANT_SETTINGS.get(self.variant, {}).items())
                        if k.startswith("phase2."))

    @property
    def heads(self) -> int:
        return SHAPES[self.shape]["base.arch.n_heads"]

    def overrides(self, scoring_set: str) -> dict:
        out = {**SHAPES[self.shape], "scoring.set": scoring_set}
        if self.kind == "routed":
            return {**out, **ROUTED_SETTINGS, "predictor.keep": self.keep, "runtime.skip": self.skip,
                    **VARIANT_SETTINGS.get(self.variant, {})}
        if self.width % self.heads or (self.width // self.heads) % 2:
            raise StudyError(f"{self.name}: width {self.width} is no even head dim at {self.heads} heads")
        return {**out, "base.arch.head_dim": self.width // self.heads, "base.train.seed": self.seed,
                **VARIANT_SETTINGS.get(self.variant, {})}

    @property
    def targets(self) -> tuple[str, ...]:
        return ROUTED_TARGETS if self.kind == "routed" else DENSE_TARGETS


def variants(shapes=tuple(SHAPES)) -> list[Point]:
    """The variants of :data:`VARIANT_GRID` at ``shapes``."""
    routed = [Point(shape, "routed", skip, keep, variant=variant) for shape, skip, keep, variant in VARIANT_GRID
              if shape in shapes]
    dense = [Point(DENSE_SHAPE, "dense", width=w, seed=seed, variant=variant) for variant, w in DENSE_VARIANTS
             for seed in BASE_SEEDS if DENSE_SHAPE in shapes]
    return routed + dense


def grid(shapes=tuple(SHAPES)) -> list[Point]:
    """Every point of the study: the routed ones of ``shapes``, then the smaller dense models (the full
    width is each routed point's own base, its control scored by them: read from them, not rerun)."""
    routed = [Point(s, "routed", skip, keep) for s in shapes for skip, keep in ROUTED_GRID]
    dense = [Point(DENSE_SHAPE, "dense", width=w, seed=seed) for w in WIDTHS for seed in BASE_SEEDS]
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
    import numpy as np
    from transformers import Olmo2Config

    from lookahead.graph.cost import macs_per_token
    from lookahead.tools.bases import window_means
    from lookahead.artifacts.val_scores import load_scores

    params = read_params(rev)
    arch = params["base"]["arch"]
    shape = {k: v for k, v in SHAPES[point.shape].items() if k.startswith("base.arch.")}
    if (arch["n_layers"], arch["n_heads"]) != (shape["base.arch.n_layers"], shape["base.arch.n_heads"]):
        raise StudyError(f"{point.name}: the run holds {arch['n_layers']} x {arch['n_heads']} heads")
    window = arch["context_length"]
    files = ("phase1", "phase2", "static_control", "control") if point.kind == "routed" else ("control",)
    record = {"point": point.name, **dataclasses.asdict(point), "controls": point.controls, "set": scoring_set,
              "rev": rev[:12], "stage_seconds": times, "windows": {}}
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
        n = arch["n_layers"] * arch["n_heads"]
        static_kept = round(point.keep * n)
        ctx = (window + 1) / 2
        static = lambda k: macs_per_token(cfg, ctx, k / n, "static") / macs_per_token(cfg, ctx, 1.0, "static")  # noqa: E731
        record.update(active_head_fraction=phase1["active_head_fraction"], heads_total=n,
                      phase2_active_head_fraction=phase2.get("active_head_fraction"))
        dense = macs_per_token(cfg, ctx, 1.0, "query")

        def as_run(file: str) -> float | None:  # every seed's forward as its gates ran, over dense, the router added
            ran = record["windows"][file].get("deployed_macs")
            return None if ran is None else float(np.mean(ran)) / dense + phase1["router_macs_over_dense"]

        record["macs"] = macs_figures(cfg, window, {
            "deployed": as_run("phase1"), "phase2_deployed": as_run("phase2"),
            "static_control": static(static_kept),
            **{f"static_heads_{k}": static(k) for k in range(1, n + 1)}})
        record["static_control_heads"] = static_kept
    else:  # a narrower attention: its dense MACs over the full width's
        full = full_width(cfg)
        ctx = (window + 1) / 2
        record["macs"] = macs_figures(full, window, {
            "dense": macs_per_token(cfg, ctx, 1.0, "query") / macs_per_token(full, ctx, 1.0, "query")})
    return record


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
    parser.add_argument("--variants", action="store_true",
                        help="also the research target's variants (smaller routers, per-layer budgets, longer phase 2, deeper at 4 x 8)")
    parser.add_argument("--collect-only", action="store_true", help="write the report and figure from the committed points")
    parser.add_argument("--declare", action="store_true",
                        help="declare the headline point from the selection windows' points (once, before --set test)")
    args = parser.parse_args(argv)
    if not Path("dvc.yaml").is_file():
        parser.error("run from the repository root (dvc.yaml not found)")
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"--shapes: unknown {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    points = grid(tuple(shapes)) + (variants(tuple(shapes)) if args.variants else [])
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
    if not args.collect_only:
        run_points(points, args.set, Path(args.logs), args.commit, args.rerun)
    write(shapes, args.set, args.declare, args.commit)


def records(scoring_set: str) -> list[dict]:
    """The committed point files of a scoring set."""
    return [json.loads(path.read_text(encoding="utf-8")) for path in sorted((POINT_DIR / scoring_set).glob("*.json"))]


def write(shapes: list[str], scoring_set: str, declare: bool, commit_each: bool) -> None:
    """From the committed points: on the selection windows the report and figure (and with
    ``declare`` the declaration, refused once it exists: it is made once, before the test windows);
    on the test windows the declared points judged, the headline, the report and the figure."""
    from lookahead.artifacts.val_scores import scoring_from_params
    from lookahead.core.atomic import write_json
    from lookahead.tools import frontier_page as page

    found = records(scoring_set)
    if not found:
        raise StudyError(f"no point committed in {POINT_DIR / scoring_set}: run the study first")
    scoring = scoring_from_params(read_params(None))
    from lookahead.tools.bases import records as base_records
    from lookahead.tools.frontier_fit import level_spread

    kw = {"resamples": scoring.resamples, "confidence": scoring.confidence, "seed": scoring.bootstrap_seed,
          "spread": level_spread(base_records())}  # the dense frontier's other base LMs (make bases)
    declaration = page.read_declaration()
    if declare:
        if declaration is not None:
            raise StudyError(f"{page.DECLARED} exists: the headline is declared once, before the test windows are read")
        if scoring_set != "selection":
            raise StudyError("--declare reads the selection windows' points (--set selection)")
        declaration = page.declare(found, shapes, **kw)
        write_json(page.DECLARED, declaration)
        if commit_each:
            commit([page.DECLARED], "frontier: the headline point declared on the selection windows")
    judged = None
    if scoring_set == "test":
        if declaration is None:
            raise StudyError(f"no {page.DECLARED}: declare the headline on the selection windows first (--declare)")
        judged = page.judged(found, declaration, **kw)
        write_json(page.HEADLINE, page.headline(judged, declaration))
    write_json(page.REPORT if scoring_set == "test" else page.REPORT.with_name("frontier_selection_report.json"),
               page.report(found, shapes, declaration, judged, **kw))
    page.figure(found, shapes, page.FIGURE if scoring_set == "test" else page.FIGURE.with_name("frontier_selection.png"))
    print(f"[frontier] {len(found)} points of the {scoring_set} windows written", flush=True)


if __name__ == "__main__":
    try:
        main()
    except StudyError as error:
        fail(error)
