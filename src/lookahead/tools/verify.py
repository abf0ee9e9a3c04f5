"""Check a run against the committed one, figure by figure (docs/reproducibility.md): ``make verify``.

    python -m lookahead.tools.verify                 # the workspace's metrics/*.json against HEAD's
    python -m lookahead.tools.verify --rev v1.2      # ... against another git revision's

Every headline figure of every ``metrics/<stage>.json`` (with its spreads and intervals, in
``metrics/<stage>_sd.json`` and ``metrics/<stage>_ci.json``: :mod:`lookahead.core.report`) is
compared with the same figure at the revision, within a tolerance:

- a **research headline** — a figure measured over seeds, i.e. one with a ``<name>_sd`` beside it
  — that the committed run measured **across base LMs** (``metrics/bases_report.json``, ``figures``:
  ``make bases``, at least 2 bases) within its prediction interval for one fresh run: the mean over
  bases ± t(B − 1) · sqrt(sd_bases² (1 + 1/B) + the run's own se²), se = its seed sd / √seeds
  (:func:`lookahead.tools.bases.prediction_interval`). A fresh run on another CPU trains another base
  LM, and every absolute figure moves with it by more than its seeds' spread (the bases' val NLLs
  4.286–4.313 at the default). One outside makes the command exit 1;
- any other research headline within ``--sd-factor`` (3) times its seed sd (the larger of the two
  runs'), and never tighter than ``--floor`` (0.5 %) of the committed value (a spread of 0 over seeds
  is no promise that another machine gives the same bits). One outside makes the command exit 1;
- a **claim** — a paired difference with its interval, ``<name>_ci_low`` and ``<name>_ci_high``
  beside it (:mod:`lookahead.core.intervals`) — by its interval: it fails where its **verdict
  flips** (the committed interval lies below the claim's reference and the one here above it, or the
  other way round; the reference is 0, or the claim's own, e.g. 0.6 for ``greedy_capture``; an
  interval that straddles it has no verdict to flip), where its sign flips (the committed interval excludes 0 and the value here lies
  on the other side of 0) or where the two runs' intervals do not overlap (the difference of the two
  estimates is outside what both intervals together allow). One failing claim makes the command exit 1;
- a claim the committed run measured **across base LMs** by its prediction interval for one fresh
  run instead of the overlap of intervals (the committed run's interval is conditional on one base
  LM), and its verdict against the verdict across base LMs. Outside the prediction, or with the
  verdict flipped, the command exits 1;
- every other figure within ``--rel-tol`` (2 %) of the committed value (strings: equal). These are
  reported, and do not fail the check: they move with the machine (base pretraining is one seed,
  docs/reproducibility.md) and are not research claims.

Every numeric comparison also admits a CPU's last-bit difference (:mod:`lookahead.core.floats`:
relative 1e-9), so that a figure of spread 0 committed on one CPU is not "outside" on another.

``--against DIR`` compares with another workspace's ``metrics/`` instead of a git revision (the
replicate, ``lookahead.tools.replicate``, does).

On the machine that made the committed run, a from-scratch ``dvc repro`` is bitwise identical and
every difference is 0; elsewhere float rounding differs and training amplifies it, and this command
says whether the results still land where the committed run says they should. The exact bytes of
the team's run travel through DVC remotes: ``dvc pull``.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from lookahead.core.config import flatten
from lookahead.core.floats import close
from lookahead.core.report import SIBLINGS, read_headline, sibling_path

SD_SUFFIX = "_sd"
LOW, HIGH = "_ci_low", "_ci_high"  # a claim's interval (lookahead.core.intervals): part of its row
NOT_FIGURES = {"seeds"}  # how many seeds: part of the config, not a result
BASES_REPORT = "metrics/bases_report.json"  # the claims across base LMs (lookahead.tools.bases), where committed


@dataclass
class Row:
    """One figure compared."""

    figure: str
    committed: object
    here: object
    tolerance: float
    research: bool
    basis: str
    """What the tolerance is: `3 sd`, `2 %`, `equal` or `interval`."""
    committed_interval: tuple[float, float] | None = None
    here_interval: tuple[float, float] | None = None
    """A claim's intervals (basis `interval`)."""
    prediction: tuple[float, float] | None = None
    """Where a fresh run's figure should land, from the spread between base LMs (basis `prediction`: a claim;
    `bases`: a research headline)."""
    reference: float = 0.0
    """A claim's reference: its verdict is where its interval lies against it."""

    @property
    def difference(self) -> float | None:
        if _number(self.committed) and _number(self.here):
            return float(self.here) - float(self.committed)
        return None

    @property
    def claim(self) -> bool:
        return self.basis in ("interval", "prediction")

    @property
    def sign_flipped(self) -> bool:
        """A claim whose committed interval excludes 0 and whose value here lies on the other side."""
        if not (self.claim and self.committed_interval and _number(self.here)):
            return False
        low, high = self.committed_interval
        return (low > 0 and float(self.here) <= 0) or (high < 0 and float(self.here) >= 0)

    @property
    def verdict_flipped(self) -> bool:
        """A claim whose interval here lies on the other side of its reference than the committed one: the
        committed verdict was resolved (below or above) and the one here is resolved the other way. A claim
        that is unresolved on either side has no verdict to flip (its interval, or its prediction, judges it)."""
        if not (self.claim and self.committed_interval and self.here_interval):
            return False
        committed, here = side(self.committed_interval, self.reference), side(self.here_interval, self.reference)
        return "straddles" not in (committed, here) and committed != here

    @property
    def within(self) -> bool:
        if self.prediction is not None:
            inside = _number(self.here) and self.prediction[0] <= float(self.here) <= self.prediction[1]
            return inside and not self.verdict_flipped
        if self.claim:
            if self.committed_interval is None or self.here_interval is None or not _number(self.here):
                return False  # a claim without its interval on one side cannot be judged
            (a_low, a_high), (b_low, b_high) = self.committed_interval, self.here_interval
            return not (self.sign_flipped or self.verdict_flipped) and a_low <= b_high and b_low <= a_high
        if _number(self.committed) and _number(self.here):
            if not (math.isfinite(float(self.committed)) and math.isfinite(float(self.here))):
                return math.isnan(float(self.committed)) == math.isnan(float(self.here))
            return abs(self.difference) <= self.tolerance or close(float(self.here), float(self.committed))
        return self.committed == self.here


def side(interval: tuple[float, float], reference: float) -> str:
    """Where an interval lies against a claim's reference: the claim's verdict, whichever side it claims."""
    low, high = interval
    return "below" if high < reference else "above" if low > reference else "straddles"


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def metrics_files(repo: Path) -> list[str]:
    """The stages' DVC metrics files (``metrics:`` in dvc.yaml), relative to the repository."""
    import yaml

    stages = (yaml.safe_load((repo / "dvc.yaml").read_text(encoding="utf-8")) or {}).get("stages", {})
    files = []
    for stage in stages.values():
        for entry in stage.get("metrics", []):
            files += list(entry) if isinstance(entry, dict) else [entry]
    return files


def read_at_revision(repo: Path, rev: str, relpath: str) -> dict | None:
    """The JSON file at ``relpath`` in git revision ``rev``; None where it does not exist."""
    done = subprocess.run(["git", "show", f"{rev}:{relpath}"], cwd=repo, capture_output=True, text=True)
    if done.returncode != 0:
        return None
    return json.loads(done.stdout)


def compare(committed: dict, here: dict, stage: str, sd_factor: float, rel_tol: float, floor: float) -> list[Row]:
    """The rows of one stage: every figure of either side except the ``_sd`` columns and the
    intervals themselves (a claim's row carries its intervals)."""
    old, new = flatten(committed), flatten(here)
    references = claim_references()
    rows = []
    for name in list(old) + [k for k in new if k not in old]:
        if name.endswith((SD_SUFFIX, LOW, HIGH, "_se")) or name in NOT_FIGURES:
            continue
        a, b = old.get(name), new.get(name)
        if name + LOW in old or name + LOW in new:
            rows.append(Row(f"{stage}.{name}", a, b, 0.0, True, "interval", _interval(old, name), _interval(new, name),
                            reference=references.get(name, 0.0)))
            continue
        sds = [float(v) for v in (old.get(name + SD_SUFFIX), new.get(name + SD_SUFFIX)) if _number(v)]
        research = bool(sds)
        if not _number(a):
            tolerance, basis = 0.0, "equal"
        elif research and sd_factor * max(sds) >= floor * abs(float(a)):
            tolerance, basis = sd_factor * max(sds), f"{sd_factor:g} sd"
        elif research:
            tolerance, basis = floor * abs(float(a)), f"{floor:.1%}"
        else:
            tolerance, basis = rel_tol * abs(float(a)), f"{rel_tol:.0%}"
        rows.append(Row(f"{stage}.{name}", a, b, tolerance, research, basis))
    return rows


def _interval(figures: dict, name: str) -> tuple[float, float] | None:
    low, high = figures.get(name + LOW), figures.get(name + HIGH)
    return (float(low), float(high)) if _number(low) and _number(high) else None


def _fmt(value: object) -> str:
    if value is None:
        return "–"
    if _number(value):
        return f"{value:.6g}"
    return str(value)[:40]


def _fmt_interval(interval: tuple[float, float] | None) -> str:
    return "[–]" if interval is None else f"[{interval[0]:.4g}, {interval[1]:.4g}]"


def render(rows: list[Row]) -> str:
    """One table: figure, committed, here, difference, tolerance, verdict."""
    header = ("figure", "committed", "here", "difference", "tolerance", "")
    lines = [header]
    for row in rows:
        if row.prediction is not None and not row.claim:
            verdict = "within" if row.within else "OUTSIDE THE PREDICTION"
            lines.append((row.figure, f"{_fmt(row.committed)} (across bases)", _fmt(row.here), _fmt(row.difference),
                          f"prediction {_fmt_interval(row.prediction)}", verdict))
            continue
        if row.prediction is not None:
            verdict = "agrees" if row.within else ("VERDICT FLIPPED" if row.verdict_flipped else "OUTSIDE THE PREDICTION")
            lines.append((row.figure, f"{_fmt(row.committed)} (across bases)",
                          f"{_fmt(row.here)} {_fmt_interval(row.here_interval)}", _fmt(row.difference),
                          f"prediction {_fmt_interval(row.prediction)}", verdict))
            continue
        if row.claim:
            verdict = "agrees" if row.within else ("SIGN FLIPPED" if row.sign_flipped else
                                                   "VERDICT FLIPPED" if row.verdict_flipped else "INTERVALS APART")
            committed = f"{_fmt(row.committed)} {_fmt_interval(row.committed_interval)}"
            here = f"{_fmt(row.here)} {_fmt_interval(row.here_interval)}"
            lines.append((row.figure, committed, here, _fmt(row.difference), "interval", verdict))
            continue
        verdict = "within" if row.within else ("OUTSIDE" if row.research else "outside (not a research headline)")
        tol = f"±{row.tolerance:.3g} ({row.basis})" if row.basis != "equal" else "equal"
        lines.append((row.figure, _fmt(row.committed), _fmt(row.here), _fmt(row.difference), tol, verdict))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines)


def verify(repo: Path, rev: str, sd_factor: float = 3.0, rel_tol: float = 0.02, floor: float = 0.005,
           against: Path | None = None) -> list[Row]:
    """Every headline figure of the workspace's DVC metrics files against the same at ``rev``, or in
    the workspace ``against`` (its files stand for the committed run)."""
    rows: list[Row] = []
    files = metrics_files(repo)
    if against is not None:
        report = Path(against) / BASES_REPORT
        bases = json.loads(report.read_text(encoding="utf-8")) if report.is_file() else None
    else:
        bases = read_at_revision(repo, rev, BASES_REPORT)
    for relpath in headline_files(files):
        path = repo / relpath
        if against is not None:
            other = Path(against) / relpath
            committed = read_headline(other) if other.is_file() else None
        else:
            siblings = [str(sibling_path(relpath, part)) for part in SIBLINGS]
            committed = _merged([read_at_revision(repo, rev, name) for name in (relpath, *siblings)])
        if committed is None or not path.is_file():  # a stage the revision, or this run, does not have
            continue
        here = read_headline(path)
        rows += predicted(compare(committed, here, Path(relpath).stem, sd_factor, rel_tol, floor), here,
                          Path(relpath).stem, bases)
    return rows


def claim_references() -> dict[str, float]:
    """Each claim's reference where it is not 0 (``greedy_capture``: 0.6), as the claims across base LMs
    declare them (:data:`lookahead.tools.bases.CLAIMS`)."""
    from lookahead.tools.bases import CLAIMS, RATIOS

    return {c.name: c.reference for c in (*CLAIMS, *RATIOS)}


def predicted(rows: list[Row], here: dict, stage: str, bases: dict | None) -> list[Row]:
    """``rows`` with what the committed run measured across base LMs (``bases``: its
    ``metrics/bases_report.json``, at least 2 bases) judged by the prediction interval for one fresh run
    (:func:`lookahead.tools.bases.prediction_interval`, the run's own standard error added): a fresh run
    trains its own base LM, so the committed run's figures, conditional on one base, are not where it must
    land. A claim (its ``claims``) shows the mean over bases as the committed figure and keeps its verdict
    across bases to agree with; a research headline (its ``figures``: an absolute NLL, a share) is judged
    by the spread between bases where it has one, and by its seed spread only where it has none."""
    if not bases or bases.get("bases", 0) < 2:
        return rows
    from lookahead.tools.bases import prediction_interval

    claims, figures = bases.get("claims", {}), bases.get("figures", {})
    for row in rows:
        name = row.figure.split(".", 1)[1]
        if not _number(row.here):
            continue
        across = claims.get(name, {}).get("across")
        if row.claim and across is not None and claims[name].get("stage") == stage:
            row.committed, row.basis = across["mean"], "prediction"
            if _number(across.get("ci_low")) and _number(across.get("ci_high")):
                row.committed_interval = (float(across["ci_low"]), float(across["ci_high"]))
            row.prediction = prediction_interval(across["mean"], across["sd"], bases["bases"],
                                                 float(here.get(f"{name}_se") or 0.0))
            continue
        spread = figures.get(row.figure)
        if row.research and not row.claim and spread is not None and _number(spread.get("sd")):
            seeds = here.get("seeds") if _number(here.get("seeds")) else 1
            run_se = float(here.get(f"{name}{SD_SUFFIX}") or 0.0) / math.sqrt(max(int(seeds), 1))
            row.committed, row.basis = spread["mean"], "bases"
            row.prediction = prediction_interval(spread["mean"], spread["sd"], bases["bases"], run_se)
    return rows


def headline_files(files: list[str]) -> list[str]:
    """The stages' headline files among DVC metrics ``files``: without the sibling files that hold
    their spreads and intervals (:func:`lookahead.core.report.read_headline` reads those with them)."""
    siblings = {str(sibling_path(name, part)) for name in files for part in SIBLINGS}
    return [name for name in files if name not in siblings]


def _merged(parts: list[dict | None]) -> dict | None:
    """A headline file at a revision with its siblings' figures (:func:`read_headline` of a
    revision); None where the headline file itself is missing."""
    if parts[0] is None:
        return None
    merged = dict(parts[0])
    for part in parts[1:]:
        merged.update(part or {})
    return merged


def why_failed(row: Row) -> str:
    if row.sign_flipped:
        return "sign flipped"
    if row.verdict_flipped:
        return f"verdict flipped: {side(row.committed_interval, row.reference)} -> {side(row.here_interval, row.reference)} " \
               f"{row.reference:g}"
    return "outside the prediction" if row.prediction is not None else "intervals apart"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rev", default="HEAD", help="git revision holding the run to compare with (default HEAD)")
    parser.add_argument("--repo", type=Path, default=Path.cwd(), help="repository root (default: here)")
    parser.add_argument("--against", type=Path, default=None,
                        help="another workspace whose metrics/ stand for the committed run (instead of --rev)")
    parser.add_argument("--sd-factor", type=float, default=3.0,
                        help="research headlines: tolerance in seed sds (default 3)")
    parser.add_argument("--rel-tol", type=float, default=0.02,
                        help="figures without a seed spread: relative tolerance (default 0.02)")
    parser.add_argument("--floor", type=float, default=0.005,
                        help="research headlines: the smallest relative tolerance (default 0.005)")
    args = parser.parse_args(argv)
    if args.sd_factor <= 0 or args.rel_tol < 0 or args.floor < 0:
        parser.error("--sd-factor must be > 0, --rel-tol and --floor >= 0")
    rows = verify(args.repo, args.rev, sd_factor=args.sd_factor, rel_tol=args.rel_tol, floor=args.floor,
                  against=args.against)
    where = args.rev if args.against is None else str(args.against)
    if not rows:
        print(f"verify: no metrics/<stage>.json both here and at {where}", file=sys.stderr)
        return 2
    print(render(rows))
    claims = [r for r in rows if r.claim]
    research = [r for r in rows if r.research and not r.claim]
    outside = [r for r in research if not r.within]
    failed = [r for r in claims if not r.within]
    other = [r for r in rows if not r.research and not r.within]
    across = sum(r.basis == "bases" for r in research)
    print(f"\n{len(claims) - len(failed)} of {len(claims)} claims agree with {where} in verdict, sign and interval; "
          f"{len(research) - len(outside)} of {len(research)} research headlines within their spread "
          f"(between base LMs for {across}; {args.sd_factor:g} seed sd, at least {args.floor:.1%}, for the rest); "
          f"{len(rows) - len(research) - len(claims) - len(other)} "
          f"of {len(rows) - len(research) - len(claims)} other figures within {args.rel_tol:.0%}.")
    if failed:
        print("CLAIMS FAILED: " + ", ".join(f"{r.figure} ({why_failed(r)})" for r in failed))
    if outside:
        print("OUTSIDE: " + ", ".join(r.figure for r in outside))
    return 1 if outside or failed else 0


if __name__ == "__main__":
    sys.exit(main())
