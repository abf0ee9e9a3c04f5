"""Phase 1 (DESIGN §2 phase1, §4): train the lookahead structure predictor with the LM and the
context encoder frozen, on the cached contexts.

Loss per batch: NLL(A) + lambda_head · mean gate + lambda_edge · mean active edge weight, τ annealed
geometrically from ``tau_start`` to ``tau_end``. The estimator lets a head that is off come back
(§4): training always *executes* the soft graph (every head's output is computed and weighted by
its gate); edges and gates are soft with logistic noise, or — from ``hard_from_step`` on — hard in
the forward pass with straight-through gradients evaluated at the soft values
(:func:`lookahead.graph.predictor.cascade`). Evaluation runs the deterministic hard graph with the work of
off heads skipped (``forward_with_topology(hard=True)``), next to two baselines at the same
active-head fraction: static pruning of the least important heads (probe importance, Michel et al.
2019) and random per-position heads.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from lookahead.artifacts.contexts import ContextCache
from lookahead.core.config import to_dict
from lookahead.core.devices import eval_mode, resolve_device
from lookahead.core.errors import require
from lookahead.core.seeds import other_seeds, seeded_headline, with_spread
from lookahead.graph.nodes import n_edges
from lookahead.graph.predictor import PredictorConfig, StructurePredictor, budget_terms, load_init, save_predictor
from lookahead.graph.runtime import forward_with_topology
from lookahead.graph.scoring import GeoLookup, interpolate_curve, random_heads_nll, static_pruning_curve
from lookahead.lm.nll import PositionTotals, token_nll
from lookahead.train.checkpoints import checkpoint_dir
from lookahead.train.loop import TrainConfig, TrainResult, train
from lookahead.train.schedule import check_budget_schedule, tau_at


@dataclasses.dataclass
class Phase1Config:
    """Predictor training with the LM frozen (DESIGN §4)."""

    seeds: int = 3
    """Runs over seeds of training (batches, noise), for each headline figure's mean and `_sd`
    (lookahead.core.seeds); the first, with the configured seeds, writes the outputs."""
    lambda_head: float = 0.5
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
    """Draws of the random per-position heads baseline (its NLL is their mean)."""
    train: TrainConfig = dataclasses.field(default_factory=lambda: TrainConfig(
        steps=600, batch_size=8, lr=3e-2, warmup_steps=20, weight_decay=0.0, eval_every=100, checkpoint_every=100))
    """Optimisation of the predictor (batch_size = windows per step)."""

    def __post_init__(self) -> None:
        require(self.seeds >= 1, "seeds", f"must be >= 1; got {self.seeds}")
        check_budget_schedule(self)
        require(self.eval_sequences >= 0, "eval_sequences", f"must be >= 0 (0 = all); got {self.eval_sequences}")
        require(self.eval_batch_size >= 1, "eval_batch_size", f"must be >= 1; got {self.eval_batch_size}")
        require(self.random_draws >= 1, "random_draws", f"must be >= 1; got {self.random_draws}")

    def tau(self, step: int) -> float:
        """τ at ``step`` (:func:`lookahead.train.schedule.tau_at`)."""
        return tau_at(self.tau_start, self.tau_end, step, self.train.steps)


class Phase1Module:
    """The phase's step object for :func:`lookahead.train.loop.train`: the predictor trains, the LM is frozen."""

    def __init__(self, predictor: StructurePredictor, lm, cache: ContextCache, geo: GeoLookup,
                 importance: torch.Tensor, cfg: Phase1Config):
        self.model = predictor
        self.lm = lm.eval().requires_grad_(False)
        self.cache, self.geo, self.cfg = cache, geo, cfg
        self.importance = importance
        self.n_layers, self.n_heads = predictor.n_layers, predictor.n_heads
        self.n_edges = n_edges(self.n_layers, self.n_heads)
        self.device = torch.device("cpu")
        n_val = len(cache.windows("val"))
        self.val_rows = np.arange(n_val if cfg.eval_sequences == 0 else min(cfg.eval_sequences, n_val))
        self.tau_now = cfg.tau(0)
        self._dense: list[torch.Tensor] | None = None  # per-batch dense NLL (B, T): the LM is frozen
        self.static_curve: list[dict] | None = None
        self.last_eval: dict = {}

    def place(self, device) -> None:
        self.device = torch.device(device)
        self.lm.to(self.device)
        self.geo = self.geo.to(self.device)

    def batch(self, step: int) -> dict:
        t = self.cfg.train
        rows = np.random.default_rng([t.seed, step, 0, 50]).integers(0, len(self.cache.windows("train")), t.batch_size)
        windows, contexts = self.cache.batch("train", rows)
        self.tau_now = self.cfg.tau(step)
        hard = 0 <= self.cfg.hard_from_step <= step
        return {"windows": windows, "contexts": contexts, "tau": self.tau_now, "hard": hard}

    def loss(self, model, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        windows = batch["windows"]
        ids = windows[:, :-1]
        adjacency, gates = model(batch["contexts"], self.geo(ids), tau=batch["tau"], hard=batch["hard"])
        logits = forward_with_topology(self.lm, ids, adjacency, gates)  # soft execution: every head's output exists
        nll = token_nll(logits, windows[:, 1:]).mean()
        head, edge = budget_terms(adjacency, gates, self.n_layers, self.n_heads)
        loss = nll + self.cfg.lambda_head * head + self.cfg.lambda_edge * edge
        return loss, {"nll": nll.item(), "head_gate": head.item(), "edge_weight": edge.item(), "tau": batch["tau"]}

    def tokens(self, batch: dict) -> int:
        return batch["windows"][:, 1:].numel()

    def _val_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        size = self.cfg.eval_batch_size
        out = []
        for i in range(0, len(self.val_rows), size):
            windows, contexts = self.cache.batch("val", self.val_rows[i : i + size])
            out.append((windows.to(self.device), contexts.to(self.device)))
        return out

    @torch.no_grad()
    def evaluate(self, model) -> dict[str, float]:
        """Dense, soft and hard NLL on the val contexts, active fractions, and the baselines."""
        with eval_mode(model):
            batches = self._val_batches()
            if self._dense is None:
                self._dense = [token_nll(self.lm(input_ids=w[:, :-1]).logits, w[:, 1:]) for w, _ in batches]
            totals = PositionTotals()
            layer_on = torch.zeros(self.n_layers, device=self.device)
            for (windows, contexts), dense in zip(batches, self._dense):
                ids, targets = windows[:, :-1], windows[:, 1:]
                geo = self.geo(ids)
                adjacency, gates = model(contexts, geo, tau=self.tau_now, hard=False)
                soft = token_nll(forward_with_topology(self.lm, ids, adjacency, gates), targets)
                adjacency, gates = model(contexts, geo, tau=self.tau_now, hard=True)
                hard = token_nll(forward_with_topology(self.lm, ids, adjacency, gates, hard=True), targets)
                totals.add(dense.numel(), soft=soft.sum().item(), hard=hard.sum().item(), dense=dense.sum().item(),
                           below=(hard < dense).sum().item(),
                           edges=adjacency.sum((-2, -1)).sum().item() / self.n_edges)
                layer_on += gates[..., 1:].reshape(-1, self.n_layers, self.n_heads).sum((0, 2))
        per_layer = (layer_on / (totals.positions * self.n_heads)).tolist()
        fraction = float(np.mean(per_layer))
        if self.static_curve is None:
            self.static_curve = static_pruning_curve(self.lm, [w for w, _ in batches], self.importance)
        random_nll = random_heads_nll(self.lm, [w for w, _ in batches], fraction, self.n_layers, self.n_heads,
                                      self.cfg.random_draws, self.cfg.train.seed)
        metrics = {
            "dense_nll": totals.mean("dense"),
            "soft_nll": totals.mean("soft"),
            "hard_nll": totals.mean("hard"),
            "active_head_fraction": fraction,
            "active_edge_fraction": totals.mean("edges"),
            "below_dense_fraction": totals.mean("below"),
            "static_pruning_nll": interpolate_curve(self.static_curve, fraction),
            "random_heads_nll": random_nll,
            "tau": self.tau_now,
        }
        self.last_eval = {**metrics, "active_head_fraction_per_layer": per_layer}
        return metrics


# metrics/phase1.json (lookahead.core.report); throughput and per-layer figures stay in the report
# and the research figures over seeds (lookahead.core.seeds): the mean, then `_sd`
SEEDED = ("hard_nll", "active_head_fraction", "random_heads_nll", "hard_nll_increase", "static_pruning_nll_increase",
          "increase_over_static_increase")
HEADLINE = seeded_headline(("dense_nll", "soft_nll", "hard_nll", "active_head_fraction", "active_edge_fraction",
                            "below_dense_fraction", "static_pruning_nll", "random_heads_nll", "hard_nll_increase",
                            "static_pruning_nll_increase", "increase_over_static_increase"), SEEDED)

def build_phase1(cfg: Phase1Config, predictor_cfg: PredictorConfig, base_dir, contexts_dir, init_file, heads_file,
                 out_file, checkpoint_root=None, tracker=None) -> tuple[dict, TrainResult, Phase1Module]:
    """Train the predictor; write it to ``out_file``; return (metrics, training result, module)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    cache = ContextCache(contexts_dir)
    lm = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    tensors, _ = load_init(init_file)
    importance = load_file(str(heads_file))["importance"].float()
    torch.manual_seed(cfg.train.seed)
    predictor = StructurePredictor.from_init(predictor_cfg, init_file, cache.dim)
    if (predictor.n_layers, predictor.n_heads) != (lm.config.num_hidden_layers, lm.config.num_attention_heads) \
            or tuple(importance.shape) != (predictor.n_layers, predictor.n_heads):
        raise ValueError(f"init file {init_file} ({predictor.n_layers} x {predictor.n_heads}), head statistics "
                         f"{heads_file} {tuple(importance.shape)} and base model "
                         f"({lm.config.num_hidden_layers} x {lm.config.num_attention_heads}) disagree: "
                         "rerun `dvc repro` from the probe stage")
    geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float())
    module = Phase1Module(predictor, lm, cache, geo, importance, cfg)

    module.place(resolve_device(cfg.train.device, "phase1.train.device"))  # before the first evaluation
    initial = module.evaluate(predictor.to(module.device))  # the starting point: near the dense graph
    ckpt = checkpoint_dir(checkpoint_root, "phase1", {"phase1": to_dict(cfg), "predictor": to_dict(predictor_cfg)},
                          [init_file, Path(base_dir) / "model.safetensors"], [cache.fingerprint()])
    result = train(module, cfg.train, stage="phase1", checkpoint_dir=ckpt, tracker=tracker)
    result.eval_curve.insert(0, {"step": 0, **initial})
    predictor = module.model.cpu()
    save_predictor(predictor, out_file, extra={"phase1": to_dict(cfg), "encoder": cache.meta["encoder"]})
    final = module.last_eval
    metrics = {k: final[k] for k in ("dense_nll", "soft_nll", "hard_nll", "active_head_fraction",
                                     "active_edge_fraction", "below_dense_fraction", "static_pruning_nll",
                                     "random_heads_nll")}
    increase = final["hard_nll"] - final["dense_nll"]
    static_increase = final["static_pruning_nll"] - final["dense_nll"]
    metrics.update({
        "hard_nll_increase": increase,
        "static_pruning_nll_increase": static_increase,
        "increase_over_static_increase": increase / static_increase if static_increase > 0 else None,
        "init_soft_nll_minus_dense": initial["soft_nll"] - initial["dense_nll"],
        "train_steps": cfg.train.steps,
        "train_tokens_per_s": result.tokens_per_s,
    })
    return metrics, result, module


def build_phase1_seeds(cfg: Phase1Config, predictor_cfg: PredictorConfig, base_dir, contexts_dir, init_file, heads_file,
                       out_file, checkpoint_root=None, tracker=None) -> tuple[dict, TrainResult, Phase1Module]:
    """:func:`build_phase1`, then ``cfg.seeds - 1`` more trainings on other seeds (their predictors
    discarded): the metrics carry the :data:`SEEDED` figures' mean and sd (lookahead.core.seeds)."""
    metrics, result, module = build_phase1(cfg, predictor_cfg, base_dir, contexts_dir, init_file, heads_file, out_file,
                                           checkpoint_root, tracker)
    others = other_seeds(cfg, cfg.seeds, lambda c, scratch: build_phase1(
        c, predictor_cfg, base_dir, contexts_dir, init_file, heads_file, scratch / "predictor.safetensors",
        checkpoint_root)[0], "phase1")
    return with_spread(metrics, others, SEEDED), result, module
