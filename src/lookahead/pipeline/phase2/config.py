"""The ``phase2`` params section: phase 2's joint training, and the keys its dense control reads."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from lookahead.core.errors import require
from lookahead.train.loop import TrainConfig
from lookahead.train.schedule import check_budget_schedule, tau_at

DECODERS = ("mlp", "diffusion")


@dataclasses.dataclass
class Phase2Config:
    """Joint continued pretraining; the dense control reads `train`, `replay` and the eval keys (DESIGN §2 phase2)."""

    seeds: int = 3
    """Runs over seeds of training (phase 2 and the dense control each), for each headline figure's mean and `_sd`
    (lookahead.core.seeds); the first, with the configured seeds, writes the outputs."""
    decoder: Literal["mlp", "diffusion"] = "mlp"
    """Topologies from the phase-1 predictor, trained on (`mlp`), or sampled from the frozen diffusion head."""
    lambda_head: float = 0.5
    """mlp: weight of the mean head gate (pushes heads off)."""
    lambda_edge: float = 1.0
    """mlp: weight of the mean active edge weight."""
    tau_start: float = 1.0
    """mlp: edge-sigmoid temperature at step 0."""
    tau_end: float = 1.0
    """mlp: temperature at the last step (geometric annealing in between)."""
    hard_from_step: int = 0
    """mlp: straight-through hard edges and gates from this step on (-1 = never: soft training)."""
    predictor_lr_scale: float = 30.0
    """mlp: the predictor's learning rate as a multiple of train.lr."""
    replay: bool = True
    """Each step also trains on train.batch_size windows of the whole train stream, dense, in both runs."""
    eval_sequences: int = 0
    """Val windows of the context cache used for evaluation (0 = all of them)."""
    eval_batch_size: int = 8
    """Windows per forward pass when evaluating."""
    train: TrainConfig = dataclasses.field(default_factory=lambda: TrainConfig(
        steps=200, batch_size=8, lr=3e-4, warmup_steps=20, eval_every=50, checkpoint_every=50))
    """Optimisation of the LM (and the predictor) — the dense control uses the same (batch_size = windows per step)."""

    def __post_init__(self) -> None:
        require(self.seeds >= 1, "seeds", f"must be >= 1; got {self.seeds}")
        require(self.decoder in DECODERS, "decoder", f"must be one of {', '.join(DECODERS)}; got {self.decoder!r}")
        check_budget_schedule(self)
        require(math.isfinite(self.predictor_lr_scale) and self.predictor_lr_scale > 0, "predictor_lr_scale",
                f"must be a finite number > 0; got {self.predictor_lr_scale}")
        require(self.eval_sequences >= 0, "eval_sequences", f"must be >= 0 (0 = all); got {self.eval_sequences}")
        require(self.eval_batch_size >= 1, "eval_batch_size", f"must be >= 1; got {self.eval_batch_size}")

    def tau(self, step: int) -> float:
        """τ at ``step`` (:func:`lookahead.train.schedule.tau_at`)."""
        return tau_at(self.tau_start, self.tau_end, step, self.train.steps)
