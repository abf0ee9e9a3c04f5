"""The val set research claims are scored on, and the per-position NLL files the stages write on it.

Phase 1, phase 2, both controls and evaluate score the same ``scoring.windows`` windows of the val
token stream (a seeded choice among its non-overlapping windows of T + 1 tokens, token ids only: the
routers that read the LM's own states need nothing else), far more than the context cache's val
windows (32 at the default, ~4 k positions: too few to resolve 0.01 nats, DESIGN §12). Each of those
stages writes the per-position NLLs of its final models, every seed, to
``data/val_nll/<stage>.safetensors`` (``paths.scores`` in params.yaml): evaluate and the claims' intervals (:mod:`lookahead.core.intervals`) pair them
position by position, seed by seed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from lookahead.core.atomic import atomic_file
from lookahead.core.errors import ConfigError, LookaheadError, require
from lookahead.train import data

class ScoresError(LookaheadError, ValueError):
    """A per-position NLL file that is missing or does not fit another."""


@dataclasses.dataclass
class ScoringConfig:
    """The val windows research claims are scored on, and their intervals (DESIGN §12)."""

    windows: int = 256
    """Non-overlapping windows of the val stream scored (256 x 128 = 32 768 positions at the default)."""
    seed: int = 0
    """Seed of the choice of windows and of the bootstrap."""
    batch_size: int = 16
    """Windows per forward pass."""
    resamples: int = 2000
    """Bootstrap resamples of the val windows in each claim's interval."""
    confidence: float = 0.95
    """Coverage of the intervals (`<name>_ci_low`, `<name>_ci_high`)."""

    def __post_init__(self) -> None:
        for name in ("windows", "batch_size", "resamples"):
            require(getattr(self, name) >= 1, name, f"must be >= 1; got {getattr(self, name)}")
        require(self.seed >= 0, "seed", f"must be >= 0; got {self.seed}")
        require(0 < self.confidence < 1, "confidence", f"must be in (0, 1); got {self.confidence}")


def scoring_windows(tokens_dir, cfg: ScoringConfig, context_length: int) -> torch.Tensor:
    """(n, T+1) int64: a seeded choice of ``cfg.windows`` non-overlapping windows of the val stream,
    in stream order (every target scored once)."""
    every = data.eval_windows(data.load_stream(tokens_dir, "val"), context_length, max_tokens=0)
    if len(every) < cfg.windows:
        raise ConfigError("scoring.windows", f"the val stream holds only {len(every)} non-overlapping windows of "
                          f"{context_length + 1} tokens; got {cfg.windows}")
    pick = np.sort(np.random.default_rng([cfg.seed, 42]).choice(len(every), cfg.windows, replace=False))
    return every[torch.from_numpy(pick)]


def batches(windows: torch.Tensor, batch_size: int, device) -> list[torch.Tensor]:
    """The windows in batches of ``batch_size``, on ``device``."""
    return [windows[i : i + batch_size].to(device) for i in range(0, len(windows), batch_size)]


def save_scores(path, scores: dict[str, np.ndarray | torch.Tensor]) -> None:
    """Per-position NLLs, ``{name: (seeds, positions) or (positions,)}``, as float32 safetensors (atomic)."""
    from safetensors.torch import save_file

    tensors = {k: torch.as_tensor(np.asarray(v, dtype=np.float32)).contiguous() for k, v in scores.items()}
    with atomic_file(path) as tmp:
        save_file(tensors, str(tmp))


def load_scores(path) -> dict[str, np.ndarray]:
    """The arrays :func:`save_scores` wrote, as float64 numpy arrays."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise ScoresError(f"per-position val NLLs {path} not found: rerun `dvc repro` up to the stage that writes it")
    return {k: v.double().numpy() for k, v in load_file(str(path)).items()}


def seeds_of(array: np.ndarray) -> np.ndarray:
    """(seeds, positions) of an array saved with or without its seed axis."""
    return array[None] if array.ndim == 1 else array


def paired(a: np.ndarray, b: np.ndarray, what: str) -> np.ndarray:
    """Per-position differences a − b (seeds, positions): seed i of a minus seed i of b, or minus
    the one row of a deterministic b; refuse arrays scored on different positions or seed counts."""
    a, b = seeds_of(a), seeds_of(b)
    if a.shape[1] != b.shape[1] or (b.shape[0] != 1 and b.shape[0] != a.shape[0]):
        raise ScoresError(f"{what}: per-position NLLs of shapes {a.shape} and {b.shape} do not pair (the same val "
                          "positions and seeds are needed): rerun `dvc repro`")
    return a - b
