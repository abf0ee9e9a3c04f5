"""The static control's mask, read from the static_baselines stage: the stronger static baseline at
phase 2's final active-head fraction (:mod:`lookahead.artifacts.static_baselines`). Its own module, so
that the dense control, which shares :mod:`lookahead.pipeline.phase2.control`, does not depend on it."""

from __future__ import annotations

from lookahead.artifacts.static_baselines import StaticBaselines
from lookahead.pipeline.phase2.control import StaticMask


def static_mask(static_dir, pruning_file) -> StaticMask:
    """The static control's mask: the stronger static baseline (``static_dir``, the static_baselines
    stage's) at the phase-2 run's final active-head fraction, in its skip mode (``pruning_file``:
    :func:`lookahead.artifacts.phase2.write_pruning`)."""
    from lookahead.artifacts.phase2 import phase2_pruning

    return mask_at(static_dir, *phase2_pruning(pruning_file))


def mask_at(static_dir, fraction: float, skip: str) -> StaticMask:
    """The stronger static baseline of ``static_dir`` (the static_baselines stage's) at ``fraction`` of the heads."""
    static = StaticBaselines(static_dir)
    keep = static.keep_at(fraction)
    return StaticMask(static.ranking(keep), fraction, skip, f"{static.method(keep)} (fit windows)")
