"""The ``phase1`` params section: how phase 1 trains the router and what it scores."""

from __future__ import annotations

import dataclasses
import math

from lookahead.core.config import OMIT_DEFAULT
from lookahead.core.errors import require
from lookahead.train.loop import TrainConfig
from lookahead.train.schedule import check_budget_schedule, tau_at


@dataclasses.dataclass
class Phase1Config:
    """Predictor training with the LM frozen (docs/design.md)."""

    seeds: int = 3
    """Runs over seeds of training (batches, noise), for each headline figure's mean and `_sd`
    (lookahead.core.seeds); the first, with the configured seeds, writes the outputs."""
    lambda_head: float = 0.0
    """Weight of the mean head gate (pushes heads off)."""
    lambda_edge: float = 1.0
    """Weight of the mean active edge weight (pushes edges off)."""
    tau_start: float = 1.0
    """Edge-sigmoid temperature at step 0."""
    tau_end: float = 1.0
    """Temperature at the last step (geometric annealing in between)."""
    hard_from_step: int = -1
    """Straight-through hard edges and gates from this step on (-1 = never: soft training)."""
    eval_sequences: int = 0
    """Val windows of the context cache used for evaluation (0 = all of them)."""
    eval_batch_size: int = 8
    """Windows per forward pass when evaluating."""
    random_draws: int = 3
    """Draws of the random per-position heads baseline on the scoring windows (its NLL is their mean;
    read by the ``score_phase1`` stage only: the periodic evaluation's curves draw
    :data:`lookahead.pipeline.phase1.module.PERIODIC_RANDOM_DRAWS`)."""
    z_loss: float = 0.0
    """Head gates: weight of the router z-loss, mean z² of the keep logits (MoA uses 1e-3)."""
    balance: float = 0.0
    """Head gates: weight of the load-balance loss on the heads' shares of tokens."""
    noise_start: float = 1.0
    """Head gates: scale of the training noise on the keep scores at step 0."""
    noise_end: float = 1.0
    """Its scale at the last step (geometric in between; 0 < noise_end <= noise_start)."""
    oracle: str = "greedy"
    """The label-free oracle in the report: loo (leave-one-out KL), greedy (also the greedy one,
    (L·H − K)·L·H forwards) or none."""
    nll_weight: float = 0.0
    """Weight of the NLL of the soft-executed graph in the loss (its straight-through gradient); 0 =
    the LM runs without gradient (the NLL is still logged) and the router learns from the other
    terms alone, e.g. pure oracle distillation (needs ``distill`` > 0)."""
    distill: float = 1.0
    """Head gates: weight of the oracle distillation (``loss``) of the keep logits toward the
    oracle's keep set at each training position (``distill_target``; the oracle reads the dense
    model at t, a training target only; the router's inputs stay causal)."""
    distill_target: str = "greedy"
    """The oracle distilled from: loo (each position's top-K by leave-one-out KL) or greedy (the
    greedy label-free oracle's heads: stronger, (L·H − K)·L·H forwards per train window). Both
    come from the oracle stage's train windows (``data/oracle``) for routers that read the LM; a
    router that reads the context cache trains on the cache's windows, its targets computed once
    per stage run and shared by its seeds."""
    loss: str = "listwise"
    """Distillation loss: bce (each head's keep logit, centred on the router's top-K threshold,
    against the oracle's keep set) or listwise (softmax cross-entropy of the keep set over the
    router's scores: −mean over kept heads of log softmax(z), a ListNet-style ranking loss)."""
    finetune_steps: int = 0
    """The last ``finetune_steps`` of ``train.steps`` fine-tune the distilled router end to end: the
    loss is KL(dense ‖ routed) at every position through the straight-through top-K (hard gates in
    the forward, the soft gates' gradient), the LM frozen; distillation and the other terms off."""
    input_rounds: int = 1
    """``predictor.input: lm``: training inputs from the router's own routed model, not only the
    dense pass — this many rounds of "route on the dense states, run the routed LM, route again on
    its final hidden states at t − 1" per batch (no gradient; each a forward of the LM), toward the
    states the router reads as deployed (``deployed_nll``: the fixed point of those rounds)."""
    train_windows: int = 0
    """Oracle windows trained on, the first ones of the oracle stage's draw (0 = all of them): the
    curve of router quality against oracle windows without recomputing the oracle."""
    static_twin: bool = True
    """Also train the same router on zeroed inputs (a learned static mask) for ``static_twin_gap``."""
    score_per_round: int | None = dataclasses.field(default=None, metadata=OMIT_DEFAULT)
    """The scoring oracle's greedy search (``score_phase1`` only): heads removed per round (None: the
    oracle stage's ``oracle.per_round``, the search phase 1 distils from)."""
    score_candidates: int | None = dataclasses.field(default=8, metadata=OMIT_DEFAULT)
    """Its candidates tried per round (0: every head; None: the oracle stage's ``oracle.candidates``):
    8, the lazy search the default profile scores with (docs/research/head-scaling.md validates it)."""
    score_loo_from_greedy: bool = dataclasses.field(default=False, metadata=OMIT_DEFAULT)
    """``score_phase1`` takes the leave-one-out oracle's KL from the greedy oracle's first step (every
    head's removal alone: the same KL from batched forwards, equal to float rounding) in place of its
    own L·H forwards a window; needs ``oracle: greedy``. False keeps the default's bytes."""
    score_static_curve: bool = dataclasses.field(default=False, metadata=OMIT_DEFAULT)
    """``score_phase1`` also scores static pruning at every whole head count from 1 to L·H on the
    scoring windows (``static_heads_<k>`` in its score file): the static curve of the NLL-vs-MACs
    frontier (docs/research/frontier.md)."""
    train: TrainConfig = dataclasses.field(default_factory=lambda: TrainConfig(
        steps=600, batch_size=8, lr=3e-2, warmup_steps=20, weight_decay=0.0, eval_every=200, checkpoint_every=100))
    """Optimisation of the predictor (batch_size = windows per step)."""

    def __post_init__(self) -> None:
        require(self.seeds >= 1, "seeds", f"must be >= 1; got {self.seeds}")
        check_budget_schedule(self)
        # the balance term is a variance of head shares over the whole batch, not a mean over its
        # windows: a micro-batch's would be another loss (lookahead.train.loop.step_gradients)
        require(self.balance == 0 or self.train.accumulate == 1, "balance",
                f"is a function of the whole step's batch (each head's share of its tokens), so it cannot be "
                f"accumulated over micro-batches: set it to 0 or train.accumulate to 1; got balance {self.balance} "
                f"with train.accumulate {self.train.accumulate}")
        require(self.eval_sequences >= 0, "eval_sequences", f"must be >= 0 (0 = all); got {self.eval_sequences}")
        require(self.eval_batch_size >= 1, "eval_batch_size", f"must be >= 1; got {self.eval_batch_size}")
        require(self.random_draws >= 1, "random_draws", f"must be >= 1; got {self.random_draws}")
        for name in ("z_loss", "balance", "distill", "nll_weight"):
            value = getattr(self, name)
            require(math.isfinite(value) and value >= 0, name, f"must be a finite number >= 0; got {value}")
        require(math.isfinite(self.noise_start) and self.noise_start > 0, "noise_start",
                f"must be > 0; got {self.noise_start}")
        require(math.isfinite(self.noise_end) and 0 < self.noise_end <= self.noise_start, "noise_end",
                f"must be in (0, noise_start = {self.noise_start}]; got {self.noise_end}")
        require(self.oracle in ORACLES, "oracle", f"must be one of {', '.join(ORACLES)}; got {self.oracle!r}")
        require(self.distill_target in ("loo", "greedy"), "distill_target",
                f"must be loo or greedy; got {self.distill_target!r}")
        require(self.loss in ("bce", "listwise"), "loss", f"must be bce or listwise; got {self.loss!r}")
        require(self.train_windows >= 0, "train_windows", f"must be >= 0 (0 = all); got {self.train_windows}")
        require(self.input_rounds >= 0, "input_rounds", f"must be >= 0; got {self.input_rounds}")
        require(0 <= self.finetune_steps <= self.train.steps, "finetune_steps",
                f"must be in [0, train.steps = {self.train.steps}]; got {self.finetune_steps}")
        require(self.nll_weight > 0 or self.distill > 0, "nll_weight",
                "is 0 and so is distill: nothing would train the router (set one of them > 0)")
        check_scoring_search(self)

    def tau(self, step: int) -> float:
        """τ at ``step`` (:func:`lookahead.train.schedule.tau_at`)."""
        return tau_at(self.tau_start, self.tau_end, step, self.train.steps)

    def noise(self, step: int) -> float:
        """The head gates' noise scale at ``step``, annealed like τ."""
        return tau_at(self.noise_start, self.noise_end, step, self.train.steps)


SCORING_KEYS = ("random_draws", "score_per_round", "score_candidates", "score_loo_from_greedy", "score_static_curve")
"""The keys of ``phase1`` only the ``score_phase1`` stage reads (dvc.yaml lists them there alone)."""


def without_scoring(cfg: Phase1Config) -> Phase1Config:
    """``cfg`` with :data:`SCORING_KEYS` at their defaults: what the ``phase1`` stage trains with and
    saves in its routers' files, so that their bytes never depend on a key DVC does not rerun it for."""
    defaults = Phase1Config()
    return dataclasses.replace(cfg, **{k: getattr(defaults, k) for k in SCORING_KEYS})


def check_scoring_search(cfg) -> None:
    """``score_per_round`` ≥ 1 and ``score_candidates`` ≥ 0 where set; ``score_loo_from_greedy`` only
    where the greedy oracle is scored."""
    require(not cfg.score_loo_from_greedy or cfg.oracle == "greedy", "score_loo_from_greedy",
            f"takes the leave-one-out KL from the greedy oracle's first step: needs oracle: greedy; got {cfg.oracle!r}")
    require(cfg.score_per_round is None or cfg.score_per_round >= 1, "score_per_round",
            f"must be >= 1 or null (the oracle stage's); got {cfg.score_per_round}")
    require(cfg.score_candidates is None or cfg.score_candidates >= 0, "score_candidates",
            f"must be >= 0 (0 = every head) or null (the oracle stage's); got {cfg.score_candidates}")


@dataclasses.dataclass
class ScoringKeys:
    """The keys of ``phase1`` the ``score_phase1`` stage reads from params (dvc.yaml lists the same);
    every other setting of a seed's router comes from its file, as training recorded it."""

    random_draws: int = 3
    """As :attr:`Phase1Config.random_draws`."""
    oracle: str = "greedy"
    """As :attr:`Phase1Config.oracle`."""
    score_per_round: int | None = None
    """As :attr:`Phase1Config.score_per_round`."""
    score_candidates: int | None = 8
    """As :attr:`Phase1Config.score_candidates`."""
    score_loo_from_greedy: bool = False
    """As :attr:`Phase1Config.score_loo_from_greedy`."""
    score_static_curve: bool = False
    """As :attr:`Phase1Config.score_static_curve`."""

    def __post_init__(self) -> None:
        require(self.random_draws >= 1, "random_draws", f"must be >= 1; got {self.random_draws}")
        require(self.oracle in ORACLES, "oracle", f"must be one of {', '.join(ORACLES)}; got {self.oracle!r}")
        check_scoring_search(self)


ORACLES = ("loo", "greedy", "none")
BELOW_MARGIN = 1e-4
"""A position counts as below dense when its hard NLL is lower by more than this (nats): at step 0
hard and dense agree to ~1e-7, and float ties are not improvements."""
