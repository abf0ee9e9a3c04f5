"""Headline metrics and full reports (docs/development.md#layout).

A stage computes a nested dict of figures — its *report*. Three files come out of it:

- ``metrics/<stage>.json``: the headline figures only, a flat dict of a few to a couple of dozen
  keys that a researcher compares across experiments. It is the DVC metric (``cache: false``, in
  git), so ``dvc metrics show`` and ``dvc exp show`` stay narrow. Timings and throughputs are not
  headline figures: they change on every rerun and would mark every experiment as changed in
  ``dvc exp show --only-changed``; the benchmarks measure them side by side.
- ``metrics/<stage>_report.json``: the whole report, a cached DVC output (not a metric), logged to
  MLflow as an artifact and, figure by figure, as MLflow metrics (lists as step series).
- ``metrics/<stage>_timing.json``: the stage's timings and throughputs (every figure whose name says
  it is one, :func:`is_timing`), taken out of the two files above. They measure the machine, not the
  result, and change on every run; keeping them out of DVC's outputs is what lets a rerun with the
  same inputs write the same bytes (docs/reproducibility.md). Git-ignored, not a DVC output; logged to MLflow.

Research headlines measured over several seeds (docs/reproducibility.md) carry ``<name>`` (the mean) and
``<name>_sd`` (the sample standard deviation): see :mod:`lookahead.core.seeds`; paired claims carry
``<name>_ci_low`` and ``<name>_ci_high`` (:mod:`lookahead.core.intervals`). The headline is one set of
figures, written to up to three DVC metrics files so that ``dvc metrics show metrics/<stage>.json``
fits a terminal: the figures in ``metrics/<stage>.json``, their spreads (``_sd``, ``_se``, ``seeds``)
and the windows they score (``window_set``) in ``metrics/<stage>_sd.json`` and the claims' intervals in ``metrics/<stage>_ci.json``, each written
where it has a figure. :func:`read_headline` reads the three back as one dict.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lookahead.core.atomic import write_json

MAX_HEADLINE = 36  # "a few to a couple of dozen keys" in the main file; spreads, intervals and the window set in its siblings


FigurePath = str | tuple[str, ...]  # "train.lines", or ("Qwen/Qwen3-0.6B", "embedding") where a key has dots


def lookup(report: Mapping[str, Any], path: FigurePath) -> Any:
    """The value at ``path`` of a nested report: dotted (``"train.lines"``) or a tuple of keys."""
    node: Any = report
    for part in path.split(".") if isinstance(path, str) else path:
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(f"headline figure {path!r} is not in the report (at {part!r})")
        node = node[part]
    return node


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def pick(report: Mapping[str, Any], keys: Mapping[str, FigurePath] | tuple[str, ...]) -> dict[str, Any]:
    """The headline dict: ``{name: value at path}`` for a ``{name: path}`` mapping, or the
    same name and path for each key of a tuple. Values must be scalars (numbers, strings, bools) or
    a flat dict of numbers (``{"l0": 0.1, "l1": 0.2}``: ``dvc metrics show`` flattens it to
    ``name.l0``, ``name.l1``)."""
    spec = dict(keys) if isinstance(keys, Mapping) else {k: k for k in keys}
    if len(spec) > MAX_HEADLINE:
        raise ValueError(f"{len(spec)} headline figures; keep it to {MAX_HEADLINE} (the rest belong in the report)")
    headline = {}
    for name, path in spec.items():
        value = lookup(report, path)
        flat = isinstance(value, Mapping) and all(_is_number(v) for v in value.values())
        if isinstance(value, (list, tuple)) or (isinstance(value, Mapping) and not flat):
            raise ValueError(f"headline figure {name!r} ({path!r}) must be a scalar or a flat dict of numbers, "
                             f"not {type(value).__name__}")
        headline[name] = dict(value) if flat else value
    return headline


TIMING = re.compile(r"(_per_s|_seconds|_wall_s)(_over_dense)?$|^seconds$")


def is_timing(name: str) -> bool:
    """Whether a figure named ``name`` is a timing or throughput (``*_per_s``, ``*_seconds``,
    ``*_wall_s``, ``*_per_s_over_dense``)."""
    return bool(TIMING.search(name))


def split_timings(report: Any) -> tuple[Any, Any]:
    """(report without timing figures, the timing figures in the same nesting); lists of dicts
    (per-row tables) are split row by row."""
    if isinstance(report, Mapping):
        kept, timing = {}, {}
        for key, value in report.items():
            if isinstance(key, str) and is_timing(key):
                timing[key] = value
                continue
            rest, t = split_timings(value)
            kept[key] = rest
            if t:
                timing[key] = t
        return kept, timing
    if isinstance(report, list) and report and all(isinstance(r, Mapping) for r in report):
        parts = [split_timings(r) for r in report]
        timing = [t for _, t in parts]
        return [k for k, _ in parts], timing if any(timing) else {}
    return report, {}


def timing_path(metrics_path: str | os.PathLike) -> Path:
    """``metrics/<stage>_timing.json`` beside ``metrics/<stage>.json``."""
    path = Path(metrics_path)
    return path.with_name(f"{path.stem}_timing.json")


SIBLINGS = {"sd": ("_sd", "_se", "window_set"), "ci": ("_ci_low", "_ci_high")}
"""The headline's sibling files (``metrics/<stage>_<part>.json``) and the key suffixes each holds:
spreads, the seed count and the label of the windows the figures score
(:func:`lookahead.artifacts.val_scores.set_label`), then the intervals."""


def sibling_path(metrics_path: str | os.PathLike, part: str) -> Path:
    """``metrics/<stage>_<part>.json`` beside ``metrics/<stage>.json`` (``part``: a key of :data:`SIBLINGS`)."""
    path = Path(metrics_path)
    return path.with_name(f"{path.stem}_{part}.json")


def split_headline(headline: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"": figures, "sd": spreads and the seed count, "ci": intervals}``, each in headline order."""
    parts: dict[str, dict[str, Any]] = {"": {}, **{part: {} for part in SIBLINGS}}
    for key, value in headline.items():
        part = "sd" if key == "seeds" else next((p for p, ends in SIBLINGS.items() if key.endswith(ends)), "")
        parts[part][key] = value
    return parts


def read_headline(metrics_path: str | os.PathLike) -> dict[str, Any]:
    """A stage's whole headline: ``metrics/<stage>.json`` with its sibling files' figures."""
    path = Path(metrics_path)
    headline = json.loads(path.read_text(encoding="utf-8"))
    for part in SIBLINGS:
        if sibling_path(path, part).is_file():
            headline.update(json.loads(sibling_path(path, part).read_text(encoding="utf-8")))
    return headline


def write_metrics(report: dict[str, Any], headline_keys: Mapping[str, FigurePath] | tuple[str, ...],
                  metrics_path: str | os.PathLike, report_path: str | os.PathLike, tracker=None,
                  declared: tuple[str, ...] = ()) -> dict[str, Any]:
    """Write the headline metrics (with their sibling files), the full report and the timings
    (atomically; see the module docstring); log them to ``tracker`` (a
    :class:`lookahead.core.tracking.StageRun`). A timing named as a headline key is an error. Returns
    the whole headline dict. ``declared``: the siblings (:data:`SIBLINGS` keys) dvc.yaml declares for a
    stage whose headline has them under some settings only, written even where empty."""
    results, timing = split_timings(report)
    headline = pick(results, headline_keys)
    parts = split_headline(headline)
    write_json(metrics_path, parts.pop(""))
    for part, figures in parts.items():
        if figures or part in declared:
            write_json(sibling_path(metrics_path, part), figures)
        else:  # a stale sibling of an earlier headline would be read back with this one
            sibling_path(metrics_path, part).unlink(missing_ok=True)
    _write_report(report, results, timing, report_path, timing_path(metrics_path), tracker)
    return headline


def write_report(report: dict[str, Any], report_path: str | os.PathLike, tracker=None) -> dict[str, Any]:
    """Write a report with no headline — a training stage's, which its scoring stage reads — and its
    timings beside it (``<report>_timing.json``, git-ignored like every timing file); log both to
    ``tracker``. Returns the report as written (without its timings)."""
    results, timing = split_timings(report)
    _write_report(report, results, timing, report_path, timing_path(report_path), tracker)
    return results


def _write_report(report: dict[str, Any], results: dict[str, Any], timing: dict[str, Any],
                  report_path: str | os.PathLike, timing_file: Path, tracker=None) -> None:
    """Write ``results`` (the report without its timings) and ``timing``; log the whole ``report`` and
    both files to ``tracker``."""
    write_json(report_path, results)
    write_json(timing_file, timing)
    if tracker is not None:
        tracker.log_metrics(report)
        tracker.log_artifact(report_path)
        tracker.log_artifact(timing_file)
