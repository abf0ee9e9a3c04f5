"""The claims across base LMs (docs/research/base-variance.md): ``make bases``.

    python -m lookahead.tools.bases --commit           # every base not yet committed, then the tables
    python -m lookahead.tools.bases --seeds 1          # one base
    python -m lookahead.tools.bases --collect-only     # the tables from the committed bases

Every interval a run reports is conditional on its base LM and on the discrete choices made from it
(rankings, masks, the oracle's targets): its seeds vary each stage's own randomness only. A claim
about the *method* needs the base LM's variance in it. So ``B`` base LMs that differ only in
``base.train.seed`` (initialisation and data order) each run every stage from the base on, as the
DVC experiment ``bases-seed<s>`` (:func:`lookahead.tools.experiments.run_experiment`: interrupted, it
resumes from DVC's run cache). Seed 0 is the default run: the workspace's own where ``dvc status``
is clean, else run like the others.

As each base finishes, ``metrics/bases/seed<s>.json`` is written (and committed, ``--commit``: no
cache travels with the repository): the per-window means of every per-position array its scoring stages
saved (``data/val_nll/*.safetensors``; every claim below is a mean or a ratio of sums over the test
windows' positions, so per-window means give it exactly), its headlines and its stage times. From
the committed bases:

- ``metrics/bases.json`` (with ``bases_sd.json``, ``bases_ci.json``): each claim's mean over bases,
  its sd over bases and its 95 % interval;
- ``metrics/bases_report.json``: every base's figure and interval (the same as its run's headline:
  the same bootstrap of the same windows), the across-bases interval and verdict, and each claim's
  prediction interval for one fresh run (``make verify``); and under ``figures`` every research
  headline that is not a claim (an absolute NLL, a share: a figure with a seed sd) with its value on
  each base, their mean and their sd: the spread between base LMs that ``make verify`` judges a fresh
  run's absolute figures by (:func:`figures`).

The across-bases interval is :func:`lookahead.core.intervals.paired_interval` with bases in place of
seeds: the per-window differences averaged over each base's seeds, stacked over bases; se² =
window_se² + sd_bases² / B, window_se from a bootstrap of the base-averaged per-window differences
(the test windows are shared, so one resample serves every base), Student's t at the
Welch–Satterthwaite degrees of freedom. ``greedy_capture`` and ``deployed_ratio`` (ratios of sums)
take :func:`lookahead.core.intervals.ratio_interval` the same way.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lookahead.artifacts.val_scores import ScoringConfig, Scores, load_scores, scoring_from_params, seeds_of
from lookahead.core.atomic import atomic_file
from lookahead.core.intervals import paired_interval, ratio_interval
from lookahead.core.report import write_metrics
from lookahead.pipeline.phase1.final import CLAIMS as PHASE1_CLAIMS, RECALL_CLAIM
from lookahead.tools.experiments import (DVC, StudyError, commit, fail, output_file, read_json, read_params,
                                         run_experiment, sh)
from lookahead.tools.verdicts import claim_verdict

SEEDS = (0, 1, 2)
BASE_DIR = Path("metrics/bases")
HEADLINE = Path("metrics/bases.json")
REPORT = Path("metrics/bases_report.json")
SCORE_FILES = ("phase1", "phase2", "control", "static_control")
"""The scoring stages' per-position files (``data/val_nll/<name>.safetensors``), all on the test windows."""
HEADLINE_STAGES = ("base", "phase1", "evaluate", "diffusion", "modulator")
"""The headlines kept with each base: its dense NLL, the claims as its run judged them, and the
decoders' and modulator's claims (intervals over this base LM only: their scores are not per test window)."""
ROUTED = "routed"
"""Phase 2 as deployed where it was scored so, else on a dense pass's states (as evaluate pairs it)."""


@dataclass(frozen=True)
class Claim:
    """A paired claim ``A − B`` of per-position arrays (``file.key``), claimed below (or above) ``reference``;
    with ``ratio``, the ratio of sums ``ΣA / ΣB`` instead."""

    name: str
    stage: str
    """The headline that carries it in a single run (``metrics/<stage>.json``)."""
    a: str
    b: str
    below: bool
    reference: float = 0.0
    ratio: bool = False


CLAIMS = (
    # phase 1's paired claims as phase 1 defines them (lookahead.pipeline.phase1.final), then phase 2's (evaluate's)
    *(Claim(name, "phase1", f"phase1.{a}", f"phase1.{b}", True) for name, a, b in PHASE1_CLAIMS),
    Claim(RECALL_CLAIM[0], "phase1", f"phase1.{RECALL_CLAIM[1]}", f"phase1.{RECALL_CLAIM[2]}", False),
    Claim("phase2_minus_control", "evaluate", f"phase2.{ROUTED}", "control.dense", True),
    Claim("phase2_minus_static_control", "evaluate", f"phase2.{ROUTED}", "static_control.hard", True),
)
CAPTURE = Claim("greedy_capture", "phase1", "phase1.static - phase1.deployed", "phase1.static - phase1.greedy", False, 0.6,
                ratio=True)
"""The router's share of the greedy oracle's gain over static pruning: a ratio of sums, claimed above 0.6."""
SHARE = Claim("deployed_ratio", "phase1", "phase1.deployed - phase1.dense", "phase1.static - phase1.dense", True, 1.0,
              ratio=True)
"""The share of static pruning's NLL increase over dense that the router as deployed still pays (the head-scaling
study's ``deployed_ratio``): a ratio of sums, below 1 where the router loses less than static pruning."""
RATIOS = (CAPTURE, SHARE)


# --- one base: its per-window means -------------------------------------------------------------

def window_count(label: str | None, positions: int) -> int:
    """The windows of a ``window_set`` label (``test:256x128:<hash>``), checked against the positions."""
    try:
        windows, length = (int(x) for x in label.split(":")[1].split("x"))
    except (AttributeError, IndexError, ValueError):
        raise StudyError(f"a score file's window set {label!r} is no `name:WxT:hash` label: rerun its stage") from None
    if windows * length != positions:
        raise StudyError(f"window set {label} ({windows} x {length}) does not cover the file's {positions} positions")
    return windows


def window_means(scores: Scores) -> dict[str, list[list[float]]]:
    """Every array of a score file as per-window means, (seeds, windows) (one row where no seed changes it)."""
    out = {}
    for key, array in scores.items():
        a = seeds_of(array)
        w = window_count(scores.window_set, a.shape[1])
        out[key] = np.round(a.reshape(a.shape[0], w, -1).mean(2), 7).tolist()
    return out


def base_record(seed: int, rev: str | None, times: dict | None) -> dict:
    """What a base keeps (rev None: the workspace's run; else an experiment commit)."""
    record = {"seed": seed, "rev": (rev or sh("git", "rev-parse", "HEAD").strip())[:12],
              "stage_seconds": times or {}, "windows": {}, "headlines": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in SCORE_FILES:
            scores = load_scores(output_file(rev, f"data/val_nll/{name}.safetensors", Path(tmp)))
            record.setdefault("window_set", scores.window_set)
            if scores.window_set != record["window_set"]:
                raise StudyError(f"base seed {seed}: {name} scores {scores.window_set}, phase 1 {record['window_set']}")
            record["windows"][name] = window_means(scores)
    for stage in HEADLINE_STAGES:
        headline = {}
        for suffix in ("", "_sd", "_ci"):
            try:
                headline.update(read_json(rev, f"metrics/{stage}{suffix}.json"))
            except FileNotFoundError:
                continue
        record["headlines"][stage] = headline
    return record


NUMBERS = re.compile(r"\[\n\s*([-+0-9.eE,\s]+?)\n\s*\]")  # a JSON list of numbers alone, as indent= lays it out


def write_record(path: Path, record: dict) -> None:
    """Indented JSON with each list of numbers on one line (a seed's per-window means): small in git,
    readable in a diff."""
    text = NUMBERS.sub(lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", json.dumps(record, indent=1))
    with atomic_file(path) as tmp:
        tmp.write_text(text + "\n", encoding="utf-8")


# --- the claims: per base, and across bases ------------------------------------------------------

def _array(record: dict, ref: str) -> np.ndarray:
    """(seeds, windows) of ``file.key`` (``phase2.routed``: phase 2 as deployed where scored so)."""
    name, key = ref.split(".", 1)
    arrays = record["windows"][name]
    if key == ROUTED:
        key = "deployed" if "deployed" in arrays else "hard"
    return np.asarray(arrays[key], dtype=np.float64)


def _difference(record: dict, expression: str) -> np.ndarray:
    """``file.key`` or ``file.key - file.key`` (seeds broadcast)."""
    parts = [p.strip() for p in expression.split(" - ")]
    out = _array(record, parts[0])
    return out - _array(record, parts[1]) if len(parts) == 2 else out


def claim_differences(record: dict, claim: Claim) -> np.ndarray:
    """(seeds, windows) per-window differences A − B of one base (seed i of A minus seed i of B)."""
    a, b = _seed_pair(_difference(record, claim.a), _difference(record, claim.b))
    return a - b


def _seed_pair(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two (seeds, windows) arrays broadcast to one seed count (a deterministic one row to every seed)."""
    s = max(len(a), len(b))
    return np.broadcast_to(a, (s, a.shape[1])), np.broadcast_to(b, (s, b.shape[1]))


def ratio_terms(record: dict, claim: Claim = CAPTURE) -> tuple[np.ndarray, np.ndarray]:
    """(numerators, denominators), (seeds, windows), of a ratio claim (``greedy_capture``, ``deployed_ratio``)."""
    return _seed_pair(_difference(record, claim.a), _difference(record, claim.b))


def measured(record: dict, claim: Claim) -> bool:
    """Whether every array the claim reads is in the base's files (a run without a deployed router has none)."""
    return all(measured_ref(record, ref.strip()) for side in (claim.a, claim.b) for ref in side.split(" - "))


def _judged(interval: dict, claim: Claim) -> dict:
    keep = ("mean", "sd", "token_se", "se", "df", "ci_low", "ci_high")
    out = {k: interval.get(k) for k in keep if k in interval}
    out["verdict"] = claim_verdict((interval["ci_low"], interval["ci_high"]), claim.below, claim.reference)
    return out


def _terms(record: dict, claim: Claim) -> tuple[np.ndarray, ...]:
    """What the claim's interval reads, each (seeds, windows): the numerators and denominators of a
    ratio claim, the per-window differences of a paired one."""
    return ratio_terms(record, claim) if claim.ratio else (claim_differences(record, claim),)


def _interval(claim: Claim, terms: tuple[np.ndarray, ...], scoring: ScoringConfig) -> dict:
    args = (1, scoring.resamples, scoring.confidence, scoring.bootstrap_seed)
    return _judged((ratio_interval if claim.ratio else paired_interval)(*terms, *args), claim)


def per_base(record: dict, claim: Claim, scoring: ScoringConfig) -> dict:
    """One base's claim over its seeds and the windows: the interval its own run reports."""
    return _interval(claim, _terms(record, claim), scoring)


def across_bases(records: list[dict], claim: Claim, scoring: ScoringConfig) -> dict:
    """The claim across bases: each base's seed-averaged per-window figures stacked as the "seeds" of
    the interval (module docstring); ``sd`` is the sd over bases, ``token_se`` the window component."""
    terms = [_terms(r, claim) for r in records]
    return _interval(claim, tuple(np.stack([t[i].mean(0) for t in terms]) for i in range(len(terms[0]))), scoring)


def prediction_interval(mean: float, sd_bases: float, bases: int, run_se: float,
                        confidence: float = 0.95) -> tuple[float, float]:
    """Where one fresh run's figure should land: ``mean ± t(B − 1) · sqrt(sd_bases² (1 + 1/B) + run_se²)``,
    ``run_se`` the run's own standard error (its windows and seeds). Student's t at B − 1 degrees of
    freedom for the whole: conservative (Welch–Satterthwaite would add degrees of freedom for the
    window component and narrow the interval as ``run_se`` grows)."""
    from scipy import stats

    q = float(stats.t.ppf(0.5 + confidence / 2, bases - 1))
    half = q * math.sqrt(sd_bases ** 2 * (1 + 1 / bases) + run_se ** 2)
    return mean - half, mean + half


def tables(records: list[dict], scoring: ScoringConfig) -> dict:
    """The report: every claim per base and across them, every base's other figures."""
    records = sorted(records, key=lambda r: r["seed"])
    sets = {r["window_set"] for r in records}
    if len(sets) > 1:
        raise StudyError(f"the bases score different windows ({', '.join(sorted(sets))}): one test set for every base")
    report = {"bases": len(records), "seeds": [r["seed"] for r in records], "window_set": records[0]["window_set"],
              "revs": {str(r["seed"]): r["rev"] for r in records}, "claims": {}}
    for claim in (*CLAIMS, *RATIOS):
        if not all(measured(r, claim) for r in records):
            continue
        if claim.ratio and not all((ratio_terms(r, claim)[1].sum(1) > 0).all() for r in records):
            continue  # as phase 1's own: no ratio where its denominator (a gain, a damage) is not positive
        row = {"stage": claim.stage, "claimed": ("below " if claim.below else "above ") + f"{claim.reference:g}",
               "per_base": {str(r["seed"]): per_base(r, claim, scoring) for r in records}}
        if len(records) > 1:
            row["across"] = across_bases(records, claim, scoring)
        report["claims"][claim.name] = row
    # each base's stage times stay in its record (metrics/bases/seed<s>.json): timings are no metric (core.report)
    report["per_base"] = {str(r["seed"]): {"base_val_nll": r["headlines"].get("base", {}).get("val_nll"),
                                           **phase1_nlls(r["headlines"].get("phase1", {})),
                                           "other_claims": other_claims(r["headlines"])} for r in records}
    report["figures"] = figures(records)
    return report


def phase1_nlls(phase1: dict) -> dict:
    """A base's phase-1 NLLs on the test windows: what the claims are differences and ratios of."""
    return {key: phase1.get(key) for key in ("dense_nll", "static_pruning_nll", "deployed_nll")}


def other_claims(headlines: dict) -> dict:
    """A base's claims that are not judged across bases (the decoders', the modulator's), as its run
    judged them: the interval over this base LM's seeds and windows."""
    ours, out = {c.name for c in (*CLAIMS, *RATIOS)}, {}
    for stage in ("diffusion", "evaluate", "modulator"):
        figures = headlines.get(stage, {})
        for key in figures:
            name = key[: -len("_ci_low")] if key.endswith("_ci_low") else None
            if name and name not in ours:
                out[f"{stage}.{name}"] = {"mean": figures.get(name), "ci_low": figures[key],
                                          "ci_high": figures.get(f"{name}_ci_high")}
    return out


SCORED_FIGURES = {
    "phase2.dense_nll": "phase2.dense", "phase2.hard_nll": "phase2.hard", "phase2.deployed_nll": "phase2.deployed",
    "control.val_nll": "control.dense",
    "static_control.val_nll": "static_control.hard", "static_control.dense_nll": "static_control.dense",
}
"""The headlines of the stages whose headline files a base does not keep (phase 2 and its controls), each as
the score file's array whose mean over the test windows and seeds it is (``file.key`` of the record's
per-window means: the same figure to the 7 decimals they are rounded to)."""


def figures(records: list[dict]) -> dict:
    """Every research headline that is not a claim, on each base: ``{"<stage>.<key>": {"per_base": {seed: value},
    "mean", "sd"}}`` (sd over bases, ``None`` for one base). A research headline is a number with a seed sd
    beside it (``<key>_sd``) and no interval (a claim, with ``_ci_low``, is judged across bases in ``claims``);
    the stages whose headlines a base keeps (:data:`HEADLINE_STAGES`) give them as their runs wrote them, phase 2
    and its controls from the score files' per-window means (:data:`SCORED_FIGURES`). A figure some base lacks
    is left out."""
    def value(record: dict, name: str) -> float | None:
        stage, key = name.split(".", 1)
        if name in SCORED_FIGURES:
            return float(_array(record, SCORED_FIGURES[name]).mean()) if measured_ref(record, SCORED_FIGURES[name]) else None
        headline = record["headlines"].get(stage, {})
        number = headline.get(key)
        return float(number) if isinstance(number, (int, float)) and not isinstance(number, bool) else None

    names = dict.fromkeys([f"{stage}.{key}" for r in records for stage in HEADLINE_STAGES
                           for key in r["headlines"].get(stage, {})
                           if f"{key}_sd" in r["headlines"][stage] and f"{key}_ci_low" not in r["headlines"][stage]]
                          + list(SCORED_FIGURES))
    out = {}
    for name in names:
        values = {str(r["seed"]): value(r, name) for r in records}
        if any(v is None for v in values.values()):
            continue
        v = np.asarray(list(values.values()))
        out[name] = {"per_base": values, "mean": float(v.mean()), "sd": float(v.std(ddof=1)) if len(v) > 1 else None}
    return out


def measured_ref(record: dict, ref: str) -> bool:
    """Whether the record's score files hold ``file.key`` (``phase2.routed``: its deployed or hard array)."""
    name, key = ref.split(".", 1)
    arrays = record["windows"].get(name, {})
    return key in arrays or (key == ROUTED and "hard" in arrays)


def headline_of(report: dict) -> dict:
    """``{name: path}`` of the headline: the bases, each claim's mean over bases, its sd and interval."""
    keys = {"bases": "bases", "window_set": "window_set"}
    for name, row in report["claims"].items():
        if "across" in row:
            keys.update({name: ("claims", name, "across", "mean"), f"{name}_sd": ("claims", name, "across", "sd"),
                         f"{name}_ci_low": ("claims", name, "across", "ci_low"),
                         f"{name}_ci_high": ("claims", name, "across", "ci_high")})
    return keys


def records() -> list[dict]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(BASE_DIR.glob("seed*.json"))]


def write_tables(scoring: ScoringConfig) -> dict:
    found = records()
    if not found:
        raise StudyError(f"no base in {BASE_DIR}: run `make bases` first")
    report = tables(found, scoring)
    write_metrics(report, headline_of(report), HEADLINE, REPORT)
    for name, row in report["claims"].items():
        across = row.get("across")
        line = (f"{across['mean']:+.3f} [{across['ci_low']:+.3f}, {across['ci_high']:+.3f}] {across['verdict']}"
                if across else "(one base)")
        bases = "  ".join(f"{s}: {b['mean']:+.3f}" for s, b in row["per_base"].items())
        print(f"{name:40s} {line:40s} per base  {bases}")
    print(f"written: {HEADLINE}, {REPORT} ({report['bases']} bases)")
    return report


def workspace_is_complete() -> bool:
    """Whether the workspace holds a complete, up-to-date run (``dvc status`` clean)."""
    try:
        return not json.loads(sh(*DVC, "status", "--json") or "{}")
    except (StudyError, json.JSONDecodeError):
        return False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated base.train.seed values")
    parser.add_argument("--collect-only", action="store_true", help="the tables from the committed bases")
    parser.add_argument("--commit", action="store_true", help="git-commit each base's file as it finishes")
    parser.add_argument("--rerun", action="store_true", help="rerun a base whose experiment exists but is not collected")
    parser.add_argument("--logs", default="logs/bases", help="each experiment's DVC log (default logs/bases)")
    args = parser.parse_args(argv)
    if not Path("dvc.yaml").is_file():
        parser.error("run from the repository root (dvc.yaml not found)")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds: integers separated by commas; got {args.seeds!r}")
    scoring = scoring_from_params(read_params(None))
    if not args.collect_only:
        for seed in seeds:
            path = BASE_DIR / f"seed{seed}.json"
            if path.is_file():
                print(f"[bases] seed {seed}: read back from {path}", flush=True)
                continue
            if seed == 0 and workspace_is_complete():
                rev, times = None, None
                print("[bases] seed 0: the workspace's default run", flush=True)
            else:
                rev, times = run_experiment(f"bases-seed{seed}", {"base.train.seed": seed}, Path(args.logs),
                                            rerun=args.rerun, tag="bases")
            write_record(path, base_record(seed, rev, times))
            if args.commit:
                commit([path], f"bases: base LM seed {seed}, its per-window test NLLs and headlines")
            print(f"[bases] seed {seed}: done ({path})", flush=True)
    write_tables(scoring)


if __name__ == "__main__":
    try:
        main()
    except StudyError as error:
        fail(error)
