"""The val windows research claims are scored on, their roles, and the per-position NLL files the
stages write on them.

The val token stream's non-overlapping windows of T + 1 tokens (token ids only: the routers that
read the LM's own states need nothing else) have fixed roles (``windows.*`` in params.yaml,
:class:`WindowsConfig`; their history: docs/reproducibility.md#window-roles):

- **fit**: what static baselines are fitted on (importance ranked, a greedy static mask);
- **selection**: what defaults and variants are compared on (``dvc exp run -S scoring.set=selection …``;
  the comparison scripts refuse test-set runs), and which of two baselines is the stronger;
- **test**: what the committed claims read, and nothing else: windows neither in nor adjacent to
  any other role's, the context cache's val windows included (the decoders' defaults were chosen on
  those);
- the context cache's val windows (the contexts stage's own seeded choice), left as they are.

Phase 1, phase 2, both controls and evaluate score ``windows.per_role`` windows of one role
(``scoring.set``), far more than the context cache's val windows (32 at the default, ~4 k positions:
too few to resolve 0.01 nats, docs/reproducibility.md). Each writes the per-position NLLs of its final
models, every seed, to ``data/val_nll/<stage>.safetensors`` (``paths.scores``): evaluate and the
claims' intervals (:mod:`lookahead.core.intervals`) pair them position by position, seed by seed.
Every score file records which windows it scored (:func:`lookahead.core.windows.window_set_id`, a
hash of their token ids), and :func:`paired` refuses two files of different windows. What *chooses*
— the probe's head importance, the static baselines, the context cache — records the spans it read,
and the scoring stages refuse to score the test set where one overlaps it (:func:`check_disjoint`).
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
"""The roles a stage may score (``scoring.set``)."""
ROLES = ("fit", "selection", "test")
"""The val stream's window roles (:class:`WindowsConfig`), besides the context cache's."""


class ScoresError(LookaheadError, ValueError):
    """A per-position NLL file that is missing or does not fit another."""


@dataclasses.dataclass
class WindowsConfig:
    """The roles of the val stream's windows (``windows`` in params.yaml; docs/reproducibility.md#window-roles)."""

    per_role: int = 256
    """Non-overlapping windows in each of fit, selection and test (256 x 128 = 32 768 positions at the default)."""
    seed: int = 0
    """Seed of the choice of each role's windows."""

    def __post_init__(self) -> None:
        require(self.per_role >= 1, "per_role", f"must be >= 1; got {self.per_role}")
        require(self.seed >= 0, "seed", f"must be >= 0; got {self.seed}")


@dataclasses.dataclass
class ScoringConfig:
    """How research claims are scored: which role's windows, and their intervals (docs/reproducibility.md).
    ``roles`` is params.yaml's ``windows`` section (:func:`load_scoring` reads both)."""

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
    """Which windows: ``test`` (the committed claims) or ``selection`` (what defaults and variants are
    compared on)."""
    roles: WindowsConfig = dataclasses.field(default_factory=WindowsConfig)
    """The window roles (params.yaml's ``windows`` section, not this one's)."""

    def __post_init__(self) -> None:
        for name in ("batch_size", "resamples"):
            require(getattr(self, name) >= 1, name, f"must be >= 1; got {getattr(self, name)}")
        require(self.bootstrap_seed >= 0, "bootstrap_seed", f"must be >= 0; got {self.bootstrap_seed}")
        require(0 < self.confidence < 1, "confidence", f"must be in (0, 1); got {self.confidence}")
        require(self.set in SETS, "set", f"must be one of {', '.join(SETS)}; got {self.set!r}")


def load_scoring(params_path) -> ScoringConfig:
    """params.yaml's ``scoring`` section with its ``windows`` section as :attr:`ScoringConfig.roles`."""
    from lookahead.core.config import load_section, read_params

    section = read_params(params_path).get("scoring")
    if isinstance(section, dict) and "roles" in section:
        raise ConfigError("scoring.roles", "unknown key: the window roles are params.yaml's `windows` section")
    scoring = load_section(params_path, "scoring", ScoringConfig)
    return dataclasses.replace(scoring, roles=load_section(params_path, "windows", WindowsConfig))


def scoring_from_params(params: dict) -> ScoringConfig:
    """:func:`load_scoring` of a params dict already read (a revision's: before the ``windows``
    section, ``scoring.windows`` and ``scoring.seed`` set what are now the roles' size and seed)."""
    section = dict(params["scoring"])
    old = {k: section.pop(k) for k in ("windows", "seed") if k in section}
    roles = params.get("windows") or {"per_role": old.get("windows", 256), "seed": old.get("seed", 0)}
    return ScoringConfig(**section, roles=WindowsConfig(**roles))


def window_roles(n_windows: int, roles: WindowsConfig, reserved=()) -> dict[str, np.ndarray]:
    """``{role: sorted indices}`` among the val stream's ``n_windows`` non-overlapping windows: fit a
    seeded choice of ``roles.per_role``; selection as many among the others; test as many among the
    windows neither in nor adjacent to (sharing a boundary token with) a fit, selection or
    ``reserved`` window (the context cache's, :func:`cache_indices`)."""
    k = roles.per_role
    if n_windows < 2 * k:
        raise ConfigError("windows.per_role", f"the val stream holds only {n_windows} non-overlapping windows: "
                          f"fit, selection and test need 3 x {k} and more")
    fit = np.sort(np.random.default_rng([roles.seed, 42]).choice(n_windows, k, replace=False))
    rest = np.setdiff1d(np.arange(n_windows), fit)
    selection = np.sort(rest[np.random.default_rng([roles.seed, 43]).choice(len(rest), k, replace=False)])
    used = np.zeros(n_windows, dtype=bool)
    used[np.concatenate([fit, selection, np.asarray(reserved, dtype=np.int64)])] = True
    near = used.copy()
    near[1:] |= used[:-1]
    near[:-1] |= used[1:]
    free = np.flatnonzero(~near)
    if len(free) < k:
        raise ConfigError("windows.per_role", f"only {len(free)} of the val stream's {n_windows} windows are neither in "
                          f"nor adjacent to a fit, selection or context-cache window: the test set needs {k}")
    test = np.sort(free[np.random.default_rng([roles.seed, 44]).choice(len(free), k, replace=False)])
    return {"fit": fit, "selection": selection, "test": test}


def cache_indices(every: np.ndarray | torch.Tensor, cache_windows: np.ndarray) -> np.ndarray:
    """The indices among the val stream's windows ``every`` (n, T+1) of the context cache's val
    windows (``cache_windows``, (m, T+1), matched by their tokens)."""
    every = np.ascontiguousarray(np.asarray(every, dtype=np.int64))
    cache_windows = np.ascontiguousarray(np.asarray(cache_windows, dtype=np.int64))
    if len(cache_windows) == 0:
        return np.zeros(0, dtype=np.int64)
    if every.shape[1] != cache_windows.shape[1]:
        raise ScoresError(f"the context cache's val windows hold {cache_windows.shape[1]} tokens, the scoring "
                          f"windows {every.shape[1]}: rerun `dvc repro contexts`")
    index = {row.tobytes(): i for i, row in enumerate(every)}
    missing = [i for i, row in enumerate(cache_windows) if row.tobytes() not in index]
    if missing:
        raise ScoresError(f"the context cache's val window {missing[0]} is not a window of the val stream: "
                          "rerun `dvc repro contexts`")
    return np.array(sorted(index[row.tobytes()] for row in cache_windows), dtype=np.int64)


def window_indices(n_windows: int, cfg: ScoringConfig, which: str | None = None, reserved=None) -> np.ndarray:
    """Indices (sorted) of one role's windows (``which``, default ``cfg.set``) among the val stream's
    ``n_windows`` (:func:`window_roles`). The test set needs ``reserved``, the context cache's
    windows (:func:`cache_indices`; empty where there is no cache): it is chosen apart from them."""
    which = which or cfg.set
    require(which in ROLES, "scoring.set", f"must be one of {', '.join(ROLES)}; got {which!r}")
    if which == "test" and reserved is None:
        raise ScoresError("the test set is chosen apart from the context cache's val windows: pass them (`cache`)")
    return window_roles(n_windows, cfg.roles, () if reserved is None else reserved)[which]


def _val_windows(tokens_dir, context_length: int) -> torch.Tensor:
    return data.eval_windows(data.load_stream(tokens_dir, "val"), context_length, max_tokens=0)


def _reserved(every: torch.Tensor, which: str, cache) -> np.ndarray | None:
    """The context cache's window indices where the test set needs them (``cache``: a
    :class:`~lookahead.artifacts.contexts.ContextCache`, an (m, T+1) array of its val windows, or None)."""
    if which != "test" or cache is None:
        return None
    return cache_indices(every, cache.windows("val") if hasattr(cache, "windows") else cache)


def scoring_windows(tokens_dir, cfg: ScoringConfig, context_length: int, which: str | None = None,
                    cache=None) -> torch.Tensor:
    """(n, T+1) int64: one role's windows of the val stream (:func:`window_indices`; ``which``,
    default ``cfg.set``), in stream order (every target scored once). ``cache``: the context cache
    (or its val windows), which the test set is chosen apart from."""
    which = which or cfg.set
    every = _val_windows(tokens_dir, context_length)
    return every[torch.from_numpy(window_indices(len(every), cfg, which, _reserved(every, which, cache)))]


Span = tuple[str, int, int]
"""Tokens ``start … stop − 1`` of a stream (``train`` or ``val``) that something read."""


def scoring_spans(tokens_dir, cfg: ScoringConfig, context_length: int, which: str | None = None,
                  cache=None) -> list[Span]:
    """The val stream's token spans of one role's windows (:func:`scoring_windows`)."""
    which = which or cfg.set
    every = _val_windows(tokens_dir, context_length)
    return [("val", int(i) * context_length, int(i) * context_length + context_length + 1)
            for i in window_indices(len(every), cfg, which, _reserved(every, which, cache))]


def cache_spans(tokens_dir, cache) -> list[Span]:
    """The val stream's token spans of the context cache's val windows (what the decoders' defaults
    were chosen on)."""
    every = _val_windows(tokens_dir, cache.context_length)
    return [("val", int(i) * cache.context_length, int(i) * cache.context_length + cache.context_length + 1)
            for i in cache_indices(every, cache.windows("val"))]


def check_disjoint(chosen_by: dict[str, list[Span]], scored: list[Span], what: str = "the scoring windows") -> None:
    """Raise :class:`ScoresError` where a span something chose with (``{name: spans}``) shares a
    token with a span of ``scored`` (naming the chooser, the tokens and the scored window's index
    among its stream's windows of that length)."""
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
                    step = stops[j] - starts[j] - 1  # windows of T + 1 tokens, one every T
                    raise ScoresError(f"{name} read {split} tokens {a}..{b - 1}, which overlap {what} "
                                      f"({split} window {starts[j] // step}: tokens {starts[j]}..{stops[j] - 1}): "
                                      "a choice made on scored data")


def refuse_choices_on_test(cfg: ScoringConfig, tokens_dir, cache, chosen_by: dict[str, list[Span]] | None = None) -> None:
    """Where ``cfg`` scores the test set, refuse (:class:`ScoresError`, naming the chooser and the
    window) when anything that chose read a test token: the context cache's val windows and
    ``chosen_by`` (``{who: spans}``: e.g. the static baselines' fit and selection windows)."""
    if cfg.set != "test":
        return
    chosen = {"contexts (the context cache's val windows)": cache_spans(tokens_dir, cache), **(chosen_by or {})}
    check_disjoint(chosen, scoring_spans(tokens_dir, cfg, cache.context_length, "test", cache), "the test set")


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
