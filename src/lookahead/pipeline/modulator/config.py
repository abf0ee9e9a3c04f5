"""The ``modulator`` params section and the alignment measurement's settings."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from lookahead.core.errors import LookaheadError, require
from lookahead.train.loop import TrainConfig


class ModulatorError(LookaheadError, ValueError):
    """Inputs of the modulator stage do not fit its params."""


@dataclasses.dataclass
class FieldConfig:
    """The multi-expert geometric field modulator (``kind: field``; seed notebook section 12,
    lookahead.pipeline.modulator.field); its α starts at ``alpha_init`` and follows ``alpha_mode``."""

    experts: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 4])
    """Simplex experts by k: 1 edge, 2 triangle, 4 pentachoron (any subset, no repeats)."""
    edim: int = 8
    """Dims of each expert's simplex template (>= k + 1)."""
    deform_scale: float = 0.05
    """Scale of the deformation the residual applies to the template."""
    null_fraction: float = 0.25
    """Share of the residual dims never touched (the null space); 0 = none."""
    null_mode: Literal["tail", "scatter"] = "tail"
    """Which dims are null: the last ones, or a scatter drawn with train.seed."""
    alpha_min: float = 0.001
    """α is clamped to [alpha_min, alpha_max]; alpha_min 0 lets α reach the identity."""
    alpha_max: float = 0.35
    geometric_lr_scale: float = 0.1
    """Learning rate of the deformation maps and validators, as a multiple of train.lr."""
    alpha_lr_scale: float = 0.5
    """Learning rate of the α logits, as a multiple of train.lr (the gates train at train.lr)."""
    cv_band: list[float] = dataclasses.field(default_factory=lambda: [0.16, 0.26])
    """Pentachoron CV band of the gloss encodings that the seed calls healthy."""
    cv_patience: int = 0
    """Stop training once the CV, having been inside cv_band, stays outside for this many
    evaluations in a row (0 = never stop early)."""

    def __post_init__(self) -> None:
        require(len(self.experts) >= 1 and len(set(self.experts)) == len(self.experts)
                and all(k >= 1 for k in self.experts), "experts", f"must list distinct k >= 1; got {self.experts}")
        require(self.edim >= max(self.experts) + 1, "edim",
                f"must be >= k + 1 for every expert (k up to {max(self.experts)}); got {self.edim}")
        require(math.isfinite(self.deform_scale) and self.deform_scale > 0, "deform_scale",
                f"must be > 0; got {self.deform_scale}")
        require(0.0 <= self.null_fraction < 1.0, "null_fraction", f"must be in [0, 1); got {self.null_fraction}")
        require(0.0 <= self.alpha_min < 1.0, "alpha_min", f"must be in [0, 1); got {self.alpha_min}")
        require(self.alpha_min <= self.alpha_max < 1.0, "alpha_max",
                f"must be in [alpha_min, 1) = [{self.alpha_min}, 1); got {self.alpha_max}")
        for name in ("geometric_lr_scale", "alpha_lr_scale"):
            require(getattr(self, name) > 0, name, f"must be > 0; got {getattr(self, name)}")
        require(len(self.cv_band) == 2 and 0 <= self.cv_band[0] < self.cv_band[1], "cv_band",
                f"must be [low, high] with 0 <= low < high; got {self.cv_band}")
        require(self.cv_patience >= 0, "cv_patience", f"must be >= 0 (0 = off); got {self.cv_patience}")


@dataclasses.dataclass
class ModulatorConfig:
    """The geometric residual modulator (LERP or field), trained with the LM frozen."""

    kind: Literal["lerp", "field"] = "lerp"
    """`lerp`: the seed's LERP injection toward geo(x) P (sections 7-10); `field`: the multi-expert
    geometric field modulator (section 12), params in `field`."""
    seeds: int = 3
    """Runs over seeds of training, for each headline figure's mean and `_sd`
    (lookahead.core.seeds); the first, with the configured seeds, writes the outputs."""
    layers: list[int] | Literal["all"] = "all"
    """Blocks whose incoming residual stream is modulated (0-based), or `all`."""
    target: Literal["plain", "pca"] = "plain"
    """`plain`: geo(x) P, the seed's formula; `pca`: μ + s · geo(x) P, the gloss-encoding point it maps to."""
    alpha_init: float = 0.01
    """α at the start (every modulated layer); a fixed α keeps this value."""
    alpha_mode: Literal["learned", "fixed"] = "learned"
    """`learned`: α is a trained logit ("alpha finds itself"); `fixed`: α stays at alpha_init."""
    alpha_shared: bool = False
    """One α for every modulated layer instead of one per layer."""
    train_table: bool = False
    """Train the geometric table geo (V × n_geo) too."""
    train_projection: bool = False
    """Train the projection P (n_geo × hidden) too."""
    seq_len: int = 0
    """Tokens per training and evaluation window (0 = the model's max_position_embeddings)."""
    eval_tokens: int = 32768
    """Val tokens scored for the val NLL, from the start of the val stream (0 = all)."""
    eval_batch_size: int = 16
    """Windows per forward pass when scoring."""
    train: TrainConfig = dataclasses.field(default_factory=lambda: TrainConfig(
        steps=200, batch_size=8, lr=3e-2, warmup_steps=20, weight_decay=0.0, eval_every=50, checkpoint_every=50))
    """Optimisation of the modulator's parameters (batch_size = train windows per step)."""
    field: FieldConfig = dataclasses.field(default_factory=FieldConfig)
    """The field modulator's params (read when kind is `field`)."""

    def __post_init__(self) -> None:
        require(self.kind in ("lerp", "field"), "kind", f"must be `lerp` or `field`; got {self.kind!r}")
        require(self.seeds >= 1, "seeds", f"must be >= 1; got {self.seeds}")
        if self.layers != "all":
            require(len(self.layers) >= 1, "layers", "must list at least one layer, or be `all`")
            require(all(layer >= 0 for layer in self.layers), "layers", f"must be layer indices >= 0; got {self.layers}")
            require(len(set(self.layers)) == len(self.layers), "layers", f"must not repeat a layer; got {self.layers}")
        if self.alpha_mode == "learned":
            require(math.isfinite(self.alpha_init) and 0.0 < self.alpha_init < 1.0, "alpha_init",
                    f"must be in (0, 1) when alpha_mode is `learned` (it is stored as a logit); got {self.alpha_init}")
        else:
            require(math.isfinite(self.alpha_init) and 0.0 <= self.alpha_init <= 1.0, "alpha_init",
                    f"must be in [0, 1]; got {self.alpha_init}")
        if self.kind == "field":
            lo, hi = self.field.alpha_min, self.field.alpha_max
            require(lo <= self.alpha_init <= hi, "alpha_init",
                    f"must lie in the field modulator's clamp [alpha_min, alpha_max] = [{lo}, {hi}]; got {self.alpha_init}")
            for name in ("alpha_shared", "train_table", "train_projection"):
                require(not getattr(self, name), name, "applies to the LERP modulator only (kind: lerp)")
        require(self.seq_len >= 0, "seq_len", f"must be >= 0 (0 = the model's context length); got {self.seq_len}")
        require(self.eval_tokens >= 0, "eval_tokens", f"must be >= 0 (0 = all); got {self.eval_tokens}")
        require(self.eval_batch_size >= 1, "eval_batch_size", f"must be >= 1; got {self.eval_batch_size}")

    @property
    def trains(self) -> bool:
        """Whether anything is trainable (a fixed α with table and projection frozen trains nothing;
        the field modulator's experts always train)."""
        return self.kind == "field" or self.alpha_mode == "learned" or self.train_table or self.train_projection


@dataclasses.dataclass
class AlignmentConfig:
    """What the modulator stage reads of the ``probe`` section: relational alignment is measured
    exactly as the probe stage measures it (lookahead.pipeline.probe.build)."""

    seeds: list[int] = dataclasses.field(default_factory=lambda: [0, 1, 2])
    """Seeds of the sampled statistics (bootstrap of the correlations, pentachoron draws)."""
    pentachora: int = 300
    """Random 5-point simplices per seed for the Cayley-Menger volume CV."""
    chain_depth: int = 4
    """Hypernym-chain steps for the cosine decay."""
    max_text_tokens: int = 64
    """Truncate glosses to this many tokens when encoding."""
    encode_batch_size: int = 64
    """Texts per forward pass when encoding glosses."""

    def __post_init__(self) -> None:
        require(len(self.seeds) >= 1 and len(set(self.seeds)) == len(self.seeds), "seeds", "must list distinct seeds")
        for name in ("pentachora", "chain_depth", "max_text_tokens", "encode_batch_size"):
            require(getattr(self, name) >= 1, name, f"must be >= 1; got {getattr(self, name)}")
