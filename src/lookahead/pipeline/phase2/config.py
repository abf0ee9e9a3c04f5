"""The ``phase2`` params section: phase 2's joint training, and the keys its dense control reads."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from lookahead.core.errors import ConfigError, require
from lookahead.train.loop import TrainConfig
from lookahead.train.schedule import check_budget_schedule, tau_at

DECODERS = ("mlp", "diffusion")
WINDOWS = ("stream", "cache")
CONNECTIVITY = ("none", "static", "dynamic", "both")
ADAPTERS = ("none", "lora")
# The module that holds a decoder's sampler, imported by name only when that decoder runs, so that at
# `decoder: mlp` phase 2 neither imports nor depends on the diffusion head's code. dvc.yaml lists a
# decoder's inputs through the `decoder_inputs` params section (DVC cannot choose deps from
# `phase2.decoder`): what `decoder: diffusion` needs there is DECODER_INPUTS["diffusion"].
DECODER_MODULES = {"diffusion": "lookahead.graph.denoiser"}
DECODER_INPUTS = {"mlp": {"weights": "models/phase1/seeds", "code": "src/lookahead/pipeline/phase2/build.py"},
                  "diffusion": {"weights": "models/diffusion", "code": "src/lookahead/graph"}}


@dataclasses.dataclass
class DecoderInputs:
    """The ``decoder_inputs`` section: what the phase2 stage reads for its decoder, templated into its deps
    in dvc.yaml (DVC cannot choose deps from ``phase2.decoder``). The defaults are the mlp decoder's:
    inputs phase 2 reads anyway."""

    weights: str = DECODER_INPUTS["mlp"]["weights"]
    """The decoder's weights: the diffusion head's directory (``models/diffusion``) under decoder diffusion."""
    code: str = DECODER_INPUTS["mlp"]["code"]
    """The code the decoder runs: ``src/lookahead/graph`` (the diffusion head's) under decoder diffusion."""

    def __post_init__(self) -> None:
        require(bool(self.weights), "weights", "must name a path (the mlp decoder's: models/phase1/seeds)")
        require(bool(self.code), "code", f"must name a path (the mlp decoder's: {DECODER_INPUTS['mlp']['code']})")


def check_decoder_inputs(decoder: str, inputs: DecoderInputs) -> None:
    """``decoder_inputs`` (the paths dvc.yaml templates into phase 2's deps) must cover what ``decoder``
    reads: under `diffusion` the diffusion head's code directory (its weights' directory is checked
    when they load); under `mlp` they name inputs phase 2 reads anyway."""
    want = DECODER_INPUTS[decoder]
    code = inputs.code.rstrip("/")
    if decoder in DECODER_MODULES and not (want["code"] + "/").startswith(code + "/"):
        settings = " ".join(f"-S decoder_inputs.{k}={v}" for k, v in want.items())
        raise ConfigError("decoder_inputs.code", f"phase2.decoder {decoder} imports {DECODER_MODULES[decoder]}, which "
                          f"{code} does not cover, so its edits would not rerun phase 2: run with {settings}")


@dataclasses.dataclass
class Phase2Config:
    """Joint continued pretraining; the controls read `train`, `windows`, `replay` and the eval keys (and the static
    control `distill`) (docs/pipeline.md)."""

    seeds: int = 3
    """Runs over seeds of training (phase 2 and the dense control each), for each headline figure's mean and `_sd`
    (lookahead.core.seeds); the first, with the configured seeds, writes the outputs."""
    decoder: Literal["mlp", "diffusion"] = "mlp"
    """Topologies from the phase-1 predictor, trained on (`mlp`), or sampled from the frozen diffusion head."""
    lambda_head: float = 0.0
    """mlp: weight of the mean head gate (pushes heads off; for head gates under a budget the budget sets the fraction)."""
    lambda_edge: float = 0.0
    """mlp: weight of the mean active edge weight."""
    tau_start: float = 1.0
    """mlp: edge-sigmoid temperature at step 0."""
    tau_end: float = 1.0
    """mlp: temperature at the last step (geometric annealing in between)."""
    hard_from_step: int = 0
    """mlp: straight-through hard edges and gates from this step on (-1 = never: soft training)."""
    predictor_lr_scale: float = 0.0
    """mlp: the predictor's learning rate as a multiple of train.lr (0 = the phase-1 router stays frozen)."""
    refresh_every: int = 0
    """mlp: every N steps the router distils a fresh greedy oracle of the LM being trained (0 = never): its keep
    sets on ``refresh_windows`` of the step's windows, the shared heads fixed, by phase 1's listwise loss, with an
    optimiser of its own (AdamW at ``refresh_lr``, no weight decay); the NLL's gradient never reaches the router."""
    refresh_oracle: Literal["greedy", "loo"] = "greedy"
    """The refresh's oracle: ``greedy`` (phase 1's distillation target) or ``loo`` (the leave-one-out KL's top-K)."""
    refresh_windows: int = 4
    """Windows of the step's batch the refresh's greedy oracle scores (the first ones)."""
    refresh_lr: float = 3.0e-3
    """Learning rate of the router's own optimiser under ``refresh_every``."""
    refresh_steps: int = 1
    """Router updates per refresh, on the refresh's targets."""
    windows: Literal["stream", "cache"] = "stream"
    """Where each step's windows come from: `stream` = fresh windows of the whole train token stream (the router
    computes its inputs online: predictor.input lm or embedding); `cache` = the context cache's train windows
    (the slow path, needed by predictor.input cache and by decoder diffusion)."""
    shared_heads: int = 0
    """mlp, head gates under a budget: the S most important heads (probe importance) run at every token and
    the router picks the rest of its budget among the others (MoH's shared heads; 0 = every head routed)."""
    gate_weights: Literal["binary", "softmax"] = "binary"
    """mlp, head gates under a budget: ``binary`` 0/1 gates, or ``softmax`` — MoH's gate-weighted sum: each kept
    routed head's output scaled by its softmax weight among the kept routed heads (over the largest)."""
    budget_warmup: int = 0
    """Steps over which the kept fraction falls linearly from every head to the target (head gates under a top-K
    budget: the router's `keep`; the static control: its fraction); 0 = the target from step 0."""
    keep: float | None = None
    """mlp, head gates under a budget: the fraction of heads phase 2 runs per token (None: the router's own
    predictor.keep; 1.0: every head, the router left out)."""
    connectivity: Literal["none", "static", "dynamic", "both"] = "none"
    """mlp: free head-to-head weights on the router's graph, 1 at the start (lookahead.graph.connectivity):
    ``static`` one learned weight per allowed edge (DenseFormer-like), ``dynamic`` per token from the router's
    input, low rank (MUDDFormer-like), ``both`` their sum; ``none`` the plain residual stream."""
    connectivity_rank: int = 4
    """Rank of the dynamic connectivity's per-token factors U, V (N x r)."""
    connectivity_hidden: int = 64
    """Width of the dynamic connectivity's MLP from the router's input."""
    connectivity_lr_scale: float = 10.0
    """Learning rate of the weights phase 2 adds (connectivity, value residual, adapter) as a multiple of train.lr."""
    value_residual: bool = False
    """Value residual learning (ResFormer): layer l >= 1 mixes its values with the first layer's, lambda_1 v_l +
    lambda_2 v_0, starting at (1, 0) — a connectivity baseline that is not a head DAG (stock forward: needs
    keep 1.0 and connectivity none)."""
    adapter: Literal["none", "lora"] = "none"
    """``lora``: a low-rank adapter on every layer's attention output projection, its rank chosen so that it has as
    many parameters as the dynamic connectivity of these settings (the parameter-matched control)."""
    train_lm: bool = True
    """False: the LM stays frozen and only the weights phase 2 adds train (phase 1's setting: the seed's "topologies
    that lower NLL against dense" with the LM fixed); the report adds the paired difference against the frozen LM."""
    replay: bool = False
    """Each step also trains on train.batch_size more windows of the whole train stream, dense (every run)."""
    distill: float = 0.0
    """Weight w of the KL from the frozen dense base's next-token distribution in the routed runs (phase 2 and the
    static control): loss = (1 - w) NLL + w KL; the dense control trains on NLL alone."""
    distill_top_k: int = 0
    """With ``distill``: the KL over the teacher's k most likely words and a tail bucket (0 = the whole vocabulary)."""
    eval_sequences: int = 0
    """Val windows of the context cache used for evaluation (0 = all of them)."""
    eval_batch_size: int = 8
    """Windows per forward pass when evaluating."""
    train: TrainConfig = dataclasses.field(default_factory=lambda: TrainConfig(
        steps=200, batch_size=16, lr=3e-4, warmup_steps=20, eval_every=100, checkpoint_every=100))
    """Optimisation of the LM (and the predictor) — both controls use the same (batch_size = windows per step)."""

    def __post_init__(self) -> None:
        require(self.seeds >= 1, "seeds", f"must be >= 1; got {self.seeds}")
        require(self.decoder in DECODERS, "decoder", f"must be one of {', '.join(DECODERS)}; got {self.decoder!r}")
        check_budget_schedule(self)
        require(self.windows in WINDOWS, "windows", f"must be one of {', '.join(WINDOWS)}; got {self.windows!r}")
        require(self.windows == "cache" or self.decoder == "mlp", "windows",
                "decoder diffusion samples from the context cache's encodings: set windows: cache")
        require(math.isfinite(self.predictor_lr_scale) and self.predictor_lr_scale >= 0, "predictor_lr_scale",
                f"must be a finite number >= 0 (0 = frozen); got {self.predictor_lr_scale}")
        require(self.refresh_every >= 0, "refresh_every", f"must be >= 0 (0 = never); got {self.refresh_every}")
        # a refresh reads the first refresh_windows of the step's batch and steps the router's own
        # optimiser: under micro-batches it would run once per micro-batch, on other windows
        require(self.refresh_every == 0 or self.train.accumulate == 1, "refresh_every",
                f"a refresh reads the step's whole batch once, so it cannot run under train.accumulate "
                f"{self.train.accumulate}: set train.accumulate to 1 or refresh_every to 0")
        require(self.refresh_every == 0 or (self.decoder == "mlp" and self.predictor_lr_scale == 0), "refresh_every",
                "the refreshed router learns from the oracle alone: needs decoder mlp and predictor_lr_scale 0")
        require(self.refresh_windows >= 1 and (self.refresh_every == 0 or self.refresh_windows <= self.train.batch_size),
                "refresh_windows",
                f"must be in [1, train.batch_size = {self.train.batch_size}]; got {self.refresh_windows}")
        require(self.refresh_oracle in ("greedy", "loo"), "refresh_oracle",
                f"must be greedy or loo; got {self.refresh_oracle!r}")
        require(math.isfinite(self.refresh_lr) and self.refresh_lr > 0, "refresh_lr",
                f"must be a finite number > 0; got {self.refresh_lr}")
        require(self.refresh_steps >= 1, "refresh_steps", f"must be >= 1; got {self.refresh_steps}")
        require(self.gate_weights in ("binary", "softmax"), "gate_weights",
                f"must be binary or softmax; got {self.gate_weights!r}")
        require(self.shared_heads >= 0, "shared_heads", f"must be >= 0; got {self.shared_heads}")
        require(0 <= self.budget_warmup < self.train.steps, "budget_warmup",
                f"must be a step count in [0, train.steps = {self.train.steps}); got {self.budget_warmup}")
        require(math.isfinite(self.distill) and 0 <= self.distill <= 1, "distill",
                f"must be in [0, 1]; got {self.distill}")
        require(self.distill_top_k >= 0, "distill_top_k", f"must be >= 0 (0 = the whole vocabulary); got {self.distill_top_k}")
        require(self.keep is None or 0 < self.keep <= 1, "keep", f"must be in (0, 1] or null (the router's); got {self.keep}")
        require(self.connectivity in CONNECTIVITY, "connectivity",
                f"must be one of {', '.join(CONNECTIVITY)}; got {self.connectivity!r}")
        require(self.connectivity == "none" or self.decoder == "mlp", "connectivity",
                "weights on the router's graph need decoder mlp")
        require(self.connectivity_rank >= 1, "connectivity_rank", f"must be >= 1; got {self.connectivity_rank}")
        require(self.connectivity_hidden >= 1, "connectivity_hidden", f"must be >= 1; got {self.connectivity_hidden}")
        require(math.isfinite(self.connectivity_lr_scale) and self.connectivity_lr_scale > 0, "connectivity_lr_scale",
                f"must be a finite number > 0; got {self.connectivity_lr_scale}")
        require(not self.value_residual or (self.keep == 1.0 and self.connectivity == "none" and self.decoder == "mlp"),
                "value_residual", "value residual runs the stock forward: it needs keep: 1.0, connectivity: none and "
                f"decoder mlp; got keep {self.keep}, connectivity {self.connectivity!r}, decoder {self.decoder!r}")
        require(self.adapter in ADAPTERS, "adapter", f"must be one of {', '.join(ADAPTERS)}; got {self.adapter!r}")
        require(self.train_lm or self.connectivity != "none" or self.value_residual or self.adapter != "none"
                or self.predictor_lr_scale > 0, "train_lm",
                "with the LM frozen something else must train: connectivity, value_residual, adapter or predictor_lr_scale")
        require(self.eval_sequences >= 0, "eval_sequences", f"must be >= 0 (0 = all); got {self.eval_sequences}")
        require(self.eval_batch_size >= 1, "eval_batch_size", f"must be >= 1; got {self.eval_batch_size}")

    def keep_at(self, step: int, target: float) -> float:
        """The kept fraction at ``step``: linear from 1 to ``target`` over ``budget_warmup`` steps, then ``target``."""
        if step >= self.budget_warmup:
            return target
        return 1.0 - (1.0 - target) * step / self.budget_warmup

    def tau(self, step: int) -> float:
        """τ at ``step`` (:func:`lookahead.train.schedule.tau_at`)."""
        return tau_at(self.tau_start, self.tau_end, step, self.train.steps)
