"""How the results page judges a figure: the stages' headlines (:class:`Figures`), the verdict rules
(a paired difference's interval, a mean's interval against a reference or another mean) and the
comparison tables' rows, each table on one set of windows (:func:`scored_on`). The rules are stated in
:mod:`lookahead.tools.results`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lookahead.core.intervals import quantile
from lookahead.core.windows import set_name


@dataclass(frozen=True)
class Figures:
    """One stage's headline (mean, ``_sd``, ``_ci_low``/``_ci_high``, ``seeds``)."""

    stage: str
    values: dict

    def has(self, *keys: str) -> bool:
        return all(isinstance(self.values.get(k), (int, float)) and not isinstance(self.values.get(k), bool)
                   for k in keys)

    @property
    def seeds(self) -> int:
        return int(self.values.get("seeds", 1))

    def mean(self, key: str) -> float:
        return float(self.values[key])

    def sd(self, key: str) -> float:
        return float(self.values.get(f"{key}_sd") or 0.0)

    def show(self, key: str, digits: int = 3) -> str:
        """``mean ± sd (n)``, or the one value of a figure without a spread."""
        if f"{key}_sd" not in self.values:
            return num(self.mean(key), digits)
        return f"{num(self.mean(key), digits)} ± {num(self.sd(key), digits)} ({self.seeds})"

    def interval(self, key: str) -> tuple[float, float] | None:
        low, high = self.values.get(f"{key}_ci_low"), self.values.get(f"{key}_ci_high")
        return (float(low), float(high)) if low is not None and high is not None else None


def num(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def interval_cell(value: float | None, low: float | None = None, high: float | None = None, digits: int = 3) -> str:
    """A signed figure with its interval, ``+0.123 [+0.100, +0.146]`` (``–`` where not measured): the
    one format of an interval in the page's and the studies' tables."""
    if value is None:
        return "–"
    if low is None or high is None:
        return f"{value:+.{digits}f}"
    return f"{value:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def claim_verdict(interval: tuple[float, float], below: bool, reference: float = 0.0) -> str:
    """A paired difference's interval against ``reference``, claimed ``below`` it (else above)."""
    low, high = interval
    if (high < reference) if below else (low > reference):
        return "holds"
    if (low > reference) if below else (high < reference):
        return "fails"
    return "unresolved"


def mean_verdict(mean: float, sd: float, n: int, reference: float, other_sd: float = 0.0,
                 interval: tuple[float, float] | None = None) -> str:
    """``mean`` (sd over ``n`` seeds) against ``reference`` (a value, or a mean with ``other_sd``):
    by ``interval`` (the figure's own 95 % interval) where given, else by ``mean ± t · se``, se =
    sqrt((sd² + other_sd²) / n), t Student's at n − 1 degrees of freedom (the normal 1.96 for one
    seed, where only a zero spread is possible)."""
    diff = mean - reference
    if interval is not None:
        low, high = interval
        if low <= reference <= high:
            return "within noise"
        return "above" if low > reference else "below"
    se = math.sqrt((sd ** 2 + other_sd ** 2) / max(n, 1))
    q = quantile(0.0, se, max(n, 1))[0]  # the seed component alone: t(n − 1), the normal quantile for one seed
    if diff == 0.0 or (se > 0.0 and abs(diff) <= q * se):
        return "within noise"
    return "above" if diff > 0 else "below"


def replace_block(text: str, begin: str, end: str, block: str, what: str) -> str:
    """``text`` with what lies between the markers ``begin`` and ``end`` replaced by ``block`` (a
    generated block of a page); ``what`` names the page in the error where a marker is missing."""
    if begin not in text or end not in text:
        raise ValueError(f"{what} has no generated block ({begin} … {end})")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{block}\n{end}{tail}"


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


COMPARISON = ("comparison", "figure", "mean ± sd (seeds)", "judged against", "verdict")


class MixedWindows(ValueError):
    """A table whose figures were scored on different windows."""


def scored_on(*labels: str | None) -> str:
    """The line naming the one window set a table's figures come from; :class:`MixedWindows` where
    they come from two (a label None: a run from before window sets were recorded)."""
    known = sorted({label for label in labels if label})
    if len(known) > 1:
        raise MixedWindows(f"one table, figures from {len(known)} window sets: {', '.join(known)}")
    if not known:
        return "Scored on: windows not recorded (a run from before `window_set`)."
    name = set_name(known[0])
    what = {"test": "the test set (the claims' windows)", "selection": "the selection set (not the claims' windows)",
            "cache-val": "the context cache's val windows (the decoders read their encodings)"}.get(name, name)
    return f"Scored on: {what}, `{known[0]}` (`window_set`: name, windows x positions, hash of the token ids)."


def claim_row(f: Figures, what: str, key: str, below: bool, against: str) -> tuple[str, ...] | None:
    if not f.has(key) or f.interval(key) is None:
        return None
    low, high = f.interval(key)
    return (what, f"`{key}`", f"{f.show(key)}, 95 % CI [{low:.3f}, {high:.3f}]", against,
            claim_verdict((low, high), below))


def mean_row(f: Figures, what: str, key: str, claimed: str, reference: float, against: str,
              digits: int = 3) -> tuple[str, ...] | None:
    """A mean judged against a fixed ``reference`` (described by ``against``), claimed ``below`` or ``above`` it."""
    return judged(f, what, key, claimed, reference, 0.0, against, digits)


def versus_row(f: Figures, what: str, key: str, claimed: str, other: str) -> tuple[str, ...] | None:
    """A mean judged against the stage's mean ``other`` (their spreads combined), claimed ``below`` or ``above`` it."""
    if not f.has(other):
        return None
    return judged(f, what, key, claimed, f.mean(other), f.sd(other), f"`{other}`: {f.show(other)}", 3)


def judged(f: Figures, what: str, key: str, claimed: str, reference: float, reference_sd: float, against: str,
            digits: int) -> tuple[str, ...] | None:
    if not f.has(key):
        return None
    interval = f.interval(key) if reference_sd == 0.0 else None
    side = mean_verdict(f.mean(key), f.sd(key), f.seeds, reference, reference_sd, interval)
    verdict = "within noise" if side == "within noise" else f"{'holds' if side == claimed else 'fails'} ({side})"
    shown = f.show(key, digits) + ("" if interval is None else f", 95 % CI [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]")
    return (what, f"`{key}`", shown, f"{claimed} {against}", verdict)


def nll_table(f: Figures, what: str, rows: list[tuple[str, str]]) -> list[str]:
    """The val NLLs behind a finding: one row per (name, key) the stage has."""
    return table((what, "figure", "val NLL"), [(name, f"`{key}`", f.show(key)) for name, key in rows if f.has(key)])


def table_rows(*rows) -> list[tuple[str, ...]]:
    return [row for row in rows if row is not None]
