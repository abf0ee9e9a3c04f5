"""The ``evaluate`` params section."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from lookahead.core.config import OMIT_DEFAULT
from lookahead.core.errors import LookaheadError, require


class EvaluateError(LookaheadError, ValueError):
    """Inputs that do not fit together, or a failed causality check."""


@dataclasses.dataclass
class EvaluateConfig:
    """The final table, the causality check and the explainer figure (docs/pipeline.md)."""

    seeds: int = 3
    """Runs over seeds of the diffusion samples and random heads, for each headline figure's mean and `_sd`
    (lookahead.core.seeds); the first, with the configured seeds, writes the outputs."""
    eval_sequences: int = 0
    """Val windows of the context cache scored (0 = all of them)."""
    eval_batch_size: int = 8
    """Windows per forward pass."""
    diffusion_samples: int = 8
    """K: diffusion samples per position (one-sample NLL is their mean; best-of-K their per-position minimum)."""
    random_draws: int = 3
    """Draws of the random per-position heads baseline (its NLL is their mean)."""
    timing_rounds: int = 5
    """Timed forwards per row (interleaved with the dense forward; the median is reported)."""
    causality_windows: int = 2
    """Val windows the causality check perturbs."""
    causality_cuts: int = 3
    """Cut points t per window: the tokens after t are replaced, positions <= t must not change."""
    causality_tolerance: float = 1.0e-5
    """Largest change of a logit or topology entry at <= t that passes (float noise of batched encoders)."""
    explainer_window: int = 0
    """Val window whose tokens the explainer figure shows."""
    explainer_tokens: int = 24
    """Tokens of that window shown (from its start)."""
    seed: int = 0
    """Seed of the diffusion samples, the random heads and the causality perturbations."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """`auto` = CUDA when available."""
    static_curve_step: int = dataclasses.field(default=1, metadata=OMIT_DEFAULT)
    """The static curve (the table's and the figure's static pruning, the stronger mask at each count)
    scores every ``static_curve_step``-th head count, and the counts around the phase-2 router's (1:
    every count, L·H + 1 forwards of the val windows: 271 on SmolLM2, ~1.5 h on 2 cores)."""

    def __post_init__(self) -> None:
        require(self.seeds >= 1, "seeds", f"must be >= 1; got {self.seeds}")
        require(self.static_curve_step >= 1, "static_curve_step", f"must be >= 1; got {self.static_curve_step}")
        for name in ("eval_batch_size", "diffusion_samples", "random_draws", "timing_rounds", "causality_windows",
                     "causality_cuts", "explainer_tokens"):
            require(getattr(self, name) >= 1, name, f"must be >= 1; got {getattr(self, name)}")
        for name in ("eval_sequences", "explainer_window", "seed"):
            require(getattr(self, name) >= 0, name, f"must be >= 0; got {getattr(self, name)}")
        require(math.isfinite(self.causality_tolerance) and self.causality_tolerance >= 0, "causality_tolerance",
                f"must be a finite number >= 0; got {self.causality_tolerance}")
