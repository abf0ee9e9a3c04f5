"""The val set research claims are scored on, and the per-position NLL files the stages write on it.

Phase 1, phase 2, both controls and evaluate score the same ``scoring.windows`` windows of the val
token stream (a seeded choice among its non-overlapping windows of T + 1 tokens, token ids only: the
routers that read the LM's own states need nothing else), far more than the context cache's val
windows (32 at the default, ~4 k positions: too few to resolve 0.01 nats, docs/reproducibility.md). Each of those
stages writes the per-position NLLs of its final models, every seed, to
``data/val_nll/<stage>.safetensors`` (``paths.scores`` in params.yaml): evaluate and the claims' intervals (:mod:`lookahead.core.intervals`) pair them
position by position, seed by seed.

Two disjoint sets of such windows (``scoring.set``): the **test** set, which only the committed
claims read, and the **selection** set, another ``scoring.windows`` windows of the same stream that
defaults and variants are compared on (``dvc exp run -S scoring.set=selection …``; the comparison
scripts refuse test-set runs). Every score file records which windows it scored
(:func:`lookahead.core.windows.window_set_id`, a hash of their token ids), and :func:`paired` refuses two files of
different windows. Nothing that *chooses* — the probe's head importance (static pruning, the static
control's mask, the router's initial bias), the oracle's and the trainings' windows — reads a val
window: :func:`check_disjoint` is the test of it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from lookahead.core.atomic import atomic_file
from lookahead.core.errors import ConfigError, LookaheadError, require
from lookahead.core.windows import set_name
from lookahead.train import data

SETS = ("test", "selection")


class ScoresError(LookaheadError, ValueError):
    """A per-position NLL file that is missing or does not fit another."""


@dataclasses.dataclass
class ScoringConfig:
    """The val windows research claims are scored on, and their intervals (docs/reproducibility.md)."""

    windows: int = 256
    """Non-overlapping windows of the val stream scored (256 x 128 = 32 768 positions at the default)."""
    seed: int = 0
    """Seed of the choice of windows (the test and selection sets)."""
    bootstrap_seed: int = 0
    """Seed of the bootstrap resamples in every claim's interval: its own, so that redrawing the
    intervals rescores without choosing other windows."""
    batch_size: int = 16
    """Windows per forward pass."""
    resamples: int = 2000
    """Bootstrap resamples of the val windows in each claim's interval."""
    confidence: float = 0.95
    """Coverage of the intervals (`<name>_ci_low`, `<name>_ci_high`)."""
    set: str = "test"
    """Which windows: ``test`` (the committed claims) or ``selection`` (disjoint from them: what
    defaults and variants are compared on)."""

    def __post_init__(self) -> None:
        for name in ("windows", "batch_size", "resamples"):
            require(getattr(self, name) >= 1, name, f"must be >= 1; got {getattr(self, name)}")
        for name in ("seed", "bootstrap_seed"):
            require(getattr(self, name) >= 0, name, f"must be >= 0; got {getattr(self, name)}")
        require(0 < self.confidence < 1, "confidence", f"must be in (0, 1); got {self.confidence}")
        require(self.set in SETS, "set", f"must be one of {', '.join(SETS)}; got {self.set!r}")


def window_indices(n_windows: int, cfg: ScoringConfig, which: str | None = None) -> np.ndarray:
    """Indices (sorted) among the val stream's ``n_windows`` non-overlapping windows of the test or
    the selection set (``which``, default ``cfg.set``): the test set a seeded choice of
    ``cfg.windows``, the selection set a seeded choice of as many among the others."""
    which = which or cfg.set
    if n_windows < 2 * cfg.windows:
        raise ConfigError("scoring.windows", f"the val stream holds only {n_windows} non-overlapping windows: "
                          f"the test and selection sets need 2 x {cfg.windows}")
    test = np.sort(np.random.default_rng([cfg.seed, 42]).choice(n_windows, cfg.windows, replace=False))
    if which == "test":
        return test
    rest = np.setdiff1d(np.arange(n_windows), test)
    return np.sort(rest[np.random.default_rng([cfg.seed, 43]).choice(len(rest), cfg.windows, replace=False)])


def scoring_windows(tokens_dir, cfg: ScoringConfig, context_length: int, which: str | None = None) -> torch.Tensor:
    """(n, T+1) int64: the ``cfg.windows`` non-overlapping windows of the val stream of the test or
    selection set (:func:`window_indices`), in stream order (every target scored once)."""
    every = data.eval_windows(data.load_stream(tokens_dir, "val"), context_length, max_tokens=0)
    return every[torch.from_numpy(window_indices(len(every), cfg, which))]


Span = tuple[str, int, int]
"""Tokens ``start … stop − 1`` of a stream (``train`` or ``val``) that something read."""


def scoring_spans(tokens_dir, cfg: ScoringConfig, context_length: int, which: str | None = None) -> list[Span]:
    """The val stream's token spans of the test or selection set's windows."""
    n = (len(data.load_stream(tokens_dir, "val")) - 1) // context_length
    return [("val", int(i) * context_length, int(i) * context_length + context_length + 1)
            for i in window_indices(n, cfg, which)]


def check_disjoint(chosen_by: dict[str, list[Span]], scored: list[Span], what: str = "the scoring windows") -> None:
    """Raise :class:`ScoresError` where a span something chose with (``{name: spans}``) shares a
    token with a span of ``scored``."""
    for name, spans in chosen_by.items():
        for split in {s for s, _, _ in spans}:
            mine = sorted((a, b) for s, a, b in spans if s == split)
            theirs = sorted((a, b) for s, a, b in scored if s == split)
            if not mine or not theirs:
                continue
            starts = np.array([a for a, _ in theirs])
            stops = np.array([b for _, b in theirs])
            for a, b in mine:
                j = np.searchsorted(starts, b) - 1  # the last scored span starting before b
                if j >= 0 and stops[j] > a:
                    raise ScoresError(f"{name} read {split} tokens {a}..{b - 1}, which overlap {what} "
                                      f"({split} tokens {starts[j]}..{stops[j] - 1}): a choice made on scored data")


def batches(windows: torch.Tensor, batch_size: int, device) -> list[torch.Tensor]:
    """The windows in batches of ``batch_size``, on ``device``."""
    return [windows[i : i + batch_size].to(device) for i in range(0, len(windows), batch_size)]


def save_scores(path, scores: dict[str, np.ndarray | torch.Tensor], window_set: str | None = None) -> None:
    """Per-position NLLs, ``{name: (seeds, positions) or (positions,)}``, as float32 safetensors
    (atomic), with the :func:`~lookahead.core.windows.set_label` of the windows they score in the file's metadata."""
    from safetensors.torch import save_file

    tensors = {k: torch.as_tensor(np.asarray(v, dtype=np.float32)).contiguous() for k, v in scores.items()}
    with atomic_file(path) as tmp:
        save_file(tensors, str(tmp), metadata={"window_set": window_set} if window_set else None)


class Scores(dict):
    """The arrays of a score file (``{name: float64 array}``) and ``window_set``, the label of the
    windows they score (None in files written before it was recorded)."""

    window_set: str | None = None


def load_scores(path) -> Scores:
    """The arrays :func:`save_scores` wrote, as float64 numpy arrays, with their window set."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise ScoresError(f"per-position val NLLs {path} not found: rerun `dvc repro` up to the stage that writes it")
    out = Scores()
    with safe_open(str(path), framework="pt") as f:
        out.window_set = (f.metadata() or {}).get("window_set")
        for key in f.keys():
            out[key] = f.get_tensor(key).double().numpy()
    return out


def seeds_of(array: np.ndarray) -> np.ndarray:
    """(seeds, positions) of an array saved with or without its seed axis."""
    return array[None] if array.ndim == 1 else array


def paired(a: np.ndarray, b: np.ndarray, what: str, sets: tuple[str | None, str | None] | None = None) -> np.ndarray:
    """Per-position differences a − b (seeds, positions): seed i of a minus seed i of b, or minus
    the one row of a deterministic b; refuse arrays scored on different positions or seed counts,
    or on different windows (``sets``: the two files' :attr:`Scores.window_set`, where known)."""
    if sets is not None and None not in sets and sets[0] != sets[1]:
        raise ScoresError(f"{what}: the per-position NLLs score different windows ({sets[0]} and {sets[1]}): "
                          "rerun `dvc repro` with one `scoring` section")
    a, b = seeds_of(a), seeds_of(b)
    if a.shape[1] != b.shape[1] or (b.shape[0] != 1 and b.shape[0] != a.shape[0]):
        raise ScoresError(f"{what}: per-position NLLs of shapes {a.shape} and {b.shape} do not pair (the same val "
                          "positions and seeds are needed): rerun `dvc repro`")
    return a - b


def comparison_set(label: str | None, run: str, allow_test: bool = False) -> None:
    """Refuse a comparison of defaults or variants read from ``run``'s figures unless they score the
    selection set (``label``: the run's ``window_set``): the test set is the committed claims' alone.
    ``allow_test``: the caller reads the claims' windows knowingly (e.g. to reproduce a committed table)."""
    name = set_name(label)
    if name == "selection" or (allow_test and name is not None):
        return
    if name is None:
        raise ScoresError(f"{run}: its figures record no window set (a run from before `scoring.set`): rerun it with "
                          "`dvc exp run -S scoring.set=selection …`")
    raise ScoresError(f"{run} was scored on the {name} set ({label}): compare defaults and variants on the selection "
                      "set (`dvc exp run -S scoring.set=selection …`), or pass --test to read the claims' windows knowingly")
