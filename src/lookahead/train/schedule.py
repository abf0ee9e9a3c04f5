"""The schedule of the sparsity terms phase 1 and phase 2 train under (docs/design.md): the keys both
configs share, validated once, and the edge temperature annealed over training."""

from __future__ import annotations

import math

from lookahead.core.errors import require


def check_budget_schedule(cfg) -> None:
    """Validate the keys phase 1 and phase 2 share for the sparsity terms and their schedule:
    ``lambda_head``, ``lambda_edge`` (finite, >= 0), ``tau_start`` > 0, ``tau_end`` in
    (0, tau_start], ``hard_from_step`` -1 (never) or a step of ``train``."""
    for name in ("lambda_head", "lambda_edge"):
        value = getattr(cfg, name)
        require(math.isfinite(value) and value >= 0, name, f"must be a finite number >= 0; got {value}")
    require(math.isfinite(cfg.tau_start) and cfg.tau_start > 0, "tau_start", f"must be > 0; got {cfg.tau_start}")
    require(math.isfinite(cfg.tau_end) and 0 < cfg.tau_end <= cfg.tau_start, "tau_end",
            f"must be in (0, tau_start = {cfg.tau_start}]; got {cfg.tau_end}")
    require(-1 <= cfg.hard_from_step < cfg.train.steps, "hard_from_step",
            f"must be -1 (never) or a step in [0, train.steps = {cfg.train.steps}); got {cfg.hard_from_step}")


def tau_at(tau_start: float, tau_end: float, step: int, steps: int) -> float:
    """The edge temperature annealed geometrically: tau_start · (tau_end / tau_start)^(step / (steps − 1))."""
    progress = min(1.0, step / max(1, steps - 1))
    return tau_start * (tau_end / tau_start) ** progress
