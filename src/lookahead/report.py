"""Headline metrics and full reports (DESIGN §1).

A stage computes a nested dict of figures — its *report*. Two files come out of it:

- ``metrics/<stage>.json``: the headline figures only, a flat dict of a few to a couple of dozen
  keys that a researcher compares across experiments. It is the DVC metric (``cache: false``, in
  git), so ``dvc metrics show`` and ``dvc exp show`` stay narrow. Timings and throughputs are not
  headline figures: they change on every rerun and would mark every experiment as changed in
  ``dvc exp show --only-changed``; they stay in the report, and the benchmarks measure them.
- ``metrics/<stage>_report.json``: the whole report, a cached DVC output (not a metric), logged to
  MLflow as an artifact and, figure by figure, as MLflow metrics (lists as step series).
"""

from __future__ import annotations

from collections.abc import Mapping
import os
from typing import Any

from lookahead.atomic import write_json

MAX_HEADLINE = 24  # "a few to a couple of dozen keys"


FigurePath = str | tuple[str, ...]  # "train.lines", or ("Qwen/Qwen3-0.6B", "embedding") where a key has dots


def lookup(report: Mapping[str, Any], path: FigurePath) -> Any:
    """The value at ``path`` of a nested report: dotted (``"train.lines"``) or a tuple of keys."""
    node: Any = report
    for part in path.split(".") if isinstance(path, str) else path:
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(f"headline figure {path!r} is not in the report (at {part!r})")
        node = node[part]
    return node


def pick(report: Mapping[str, Any], keys: Mapping[str, FigurePath] | tuple[str, ...]) -> dict[str, Any]:
    """The headline dict: ``{name: value at path}`` for a ``{name: path}`` mapping, or the
    same name and path for each key of a tuple. Values must be scalars (numbers, strings, bools)."""
    spec = dict(keys) if isinstance(keys, Mapping) else {k: k for k in keys}
    if len(spec) > MAX_HEADLINE:
        raise ValueError(f"{len(spec)} headline figures; keep it to {MAX_HEADLINE} (the rest belong in the report)")
    headline = {}
    for name, path in spec.items():
        value = lookup(report, path)
        if isinstance(value, (Mapping, list, tuple)):
            raise ValueError(f"headline figure {name!r} ({path!r}) must be a scalar, not {type(value).__name__}")
        headline[name] = value
    return headline


def write_metrics(report: dict[str, Any], headline_keys: Mapping[str, FigurePath] | tuple[str, ...],
                  metrics_path: str | os.PathLike, report_path: str | os.PathLike, tracker=None) -> dict[str, Any]:
    """Write the headline metrics and the full report (atomically); log both to ``tracker`` (a
    :class:`lookahead.tracking.StageRun`). Returns the headline dict."""
    headline = pick(report, headline_keys)
    write_json(report_path, report)
    write_json(metrics_path, headline)
    if tracker is not None:
        tracker.log_metrics(report)
        tracker.log_artifact(report_path)
    return headline
