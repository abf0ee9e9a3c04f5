"""The ``diffusion`` params section: the diffusion head's training and sampling, and the autoregressive
keep-set decoder judged beside it."""

from __future__ import annotations

import dataclasses
import math

from lookahead.core.errors import require
from lookahead.graph.denoiser import DenoiserConfig
from lookahead.train.loop import TrainConfig


@dataclasses.dataclass
class AutoregressiveConfig:
    """The autoregressive keep-set decoder (:class:`lookahead.graph.keepsets.KeepSetAR`), trained on
    ε-good pairs only."""

    steps: int = 600
    """Adam steps (maximum likelihood of the train windows' ε-good sets)."""
    batch_size: int = 256
    """Pairs per step."""
    lr: float = 3e-3
    """Peak learning rate (cosine decay to a tenth)."""
    hidden: int = 128
    """Width of the MLP from the inputs to the per-head logits."""
    temperature: float = 0.5
    """Divides every decision's logit while sampling (< 1: nearer the mode; 1 = the model)."""
    router_logits: bool = False
    """Stack it on the phase-1 router: its keep logits (a function of the same inputs) are an input
    and a prior added to its own logits, with a learned weight per head."""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "hidden"):
            require(getattr(self, name) >= 1, name, f"must be >= 1; got {getattr(self, name)}")
        for name in ("lr", "temperature"):
            value = getattr(self, name)
            require(math.isfinite(value) and value > 0, name, f"must be a finite number > 0; got {value}")


@dataclasses.dataclass
class DiffusionConfig:
    """The diffusion head, its training and its evaluation (docs/pipeline.md)."""

    seeds: int = 3
    """Runs over seeds of training, hold-out split and evaluation samples, for each headline figure's mean and `_sd`
    (lookahead.core.seeds); the first, with the configured seeds, writes the outputs."""
    denoiser: DenoiserConfig = dataclasses.field(default_factory=DenoiserConfig)
    """Shape of the denoiser network."""
    geo_features: bool = True
    """Condition on the init stage's geometric embedding of the token (and a matched flag) too."""
    sample_steps: int = 10
    """Ancestral sampling steps from t = 1 to 0."""
    sample_temperature: float = 0.5
    """Divides the a_0 logits while sampling: < 1 trades diversity for samples nearer the mode."""
    eval_samples: int = 8
    """K: samples per position for best-of-K NLL, diversity and mode recall (both samplers)."""
    recall_radius: int = 1
    """A kept topology counts as recovered when a sample is within this Hamming distance (bits)."""
    heldout_fraction: float = 0.2
    """Share of the pair set's windows held out of training (mode recall and val BCE are measured on them)."""
    eval_sequences: int = 0
    """Val windows of the context cache for the LM NLL comparison (0 = all of them)."""
    eval_batch_size: int = 8
    """Windows per LM forward in evaluation."""
    val_pairs: int = 2048
    """Held-out pairs scored for the periodic val BCE (at most)."""
    seed: int = 0
    """Seed of the hold-out split and of the evaluation samples."""
    autoregressive: AutoregressiveConfig = dataclasses.field(default_factory=AutoregressiveConfig)
    """The autoregressive decoder judged beside the diffusion head (ε-good pairs)."""
    baseline_noise: float = 0.5
    """ε-good pairs: scale of the logistic noise on the MLP router's keep logits in its sampler (top-K
    of logits + noise; 1 = the phase-1 sampler's)."""
    train: TrainConfig = dataclasses.field(default_factory=lambda: TrainConfig(
        steps=1500, batch_size=128, lr=2e-3, beta2=0.99, warmup_steps=50, weight_decay=0.0, eval_every=250,
        checkpoint_every=250))
    """Optimisation of the denoiser (batch_size = pairs per step)."""

    def __post_init__(self) -> None:
        require(self.seeds >= 1, "seeds", f"must be >= 1; got {self.seeds}")
        for name in ("sample_steps", "eval_samples", "eval_batch_size", "val_pairs"):
            require(getattr(self, name) >= 1, name, f"must be >= 1; got {getattr(self, name)}")
        require(math.isfinite(self.sample_temperature) and self.sample_temperature > 0, "sample_temperature",
                f"must be a finite number > 0; got {self.sample_temperature}")
        require(math.isfinite(self.baseline_noise) and self.baseline_noise > 0, "baseline_noise",
                f"must be a finite number > 0; got {self.baseline_noise}")
        require(self.recall_radius >= 0, "recall_radius", f"must be >= 0; got {self.recall_radius}")
        require(math.isfinite(self.heldout_fraction) and 0 < self.heldout_fraction < 1, "heldout_fraction",
                f"must be in (0, 1); got {self.heldout_fraction}")
        require(self.eval_sequences >= 0, "eval_sequences", f"must be >= 0 (0 = all); got {self.eval_sequences}")
        require(self.seed >= 0, "seed", f"must be >= 0; got {self.seed}")
