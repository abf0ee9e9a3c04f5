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
2019) and random per-position heads, and the label-free oracle (:mod:`lookahead.graph.oracle`).

Head gates (``predictor.gate: head``) add the router's regularisers: z-loss, load balance, the
closed-form L0 penalty of hard-concrete gates, and a noise temperature annealed like τ. Whether the
router routes per token is measured, not assumed: ``dynamic_fraction`` and ``gate_entropy_bits``
of its hard gates, ``context_shuffle_dnll`` (its router inputs permuted across val positions) and
``static_twin_gap`` (the same router trained on zeroed inputs, ``phase1.static_twin``).

Two sets of windows (DESIGN §12): the periodic evaluation (the curves and the Pareto picture)
scores the context cache's val windows, labelled ``cache_val`` in the report; every headline figure
— dense, the router on dense states and as deployed, static pruning, random heads, both oracles,
recall, the routing statistics, the context shuffle and the static twin — scores the ``scoring``
windows (the test set, or the selection set in comparisons; :mod:`lookahead.pipeline.phase1.final`),
every seed, and their per-position NLLs go to ``data/val_nll/phase1.safetensors``: the claims carry
95 % intervals over those positions and the seeds (:mod:`lookahead.core.intervals`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.oracle_targets import TARGETS_FILE, OracleTargets
from lookahead.artifacts.probe_heads import head_importance
from lookahead.artifacts.val_scores import ScoringConfig, save_scores, scoring_windows, set_label
from lookahead.core.atomic import atomic_dir
from lookahead.core.config import to_dict
from lookahead.core.devices import eval_mode, resolve_device
from lookahead.core.errors import ConfigError, require
from lookahead.core.intervals import CI_HIGH, CI_LOW, SE, claim_keys
from lookahead.core.seeds import final_evaluation_only, over_seeds
from lookahead.core.tracking import is_main_process
from lookahead.graph.cost import deployed_macs
from lookahead.graph.gating import balance_loss, keep_count, l0_penalty, topk_mask, z_loss
from lookahead.graph.nodes import n_edges
from lookahead.graph.oracle import gates_nll, greedy_gates, kl_to_dense, leave_one_out_kl, routing_stats, top_k_gates
from lookahead.graph.plan import execute, gated_forward
from lookahead.graph.predictor import PredictorConfig, StructurePredictor, budget_terms, load_init, save_predictor
from lookahead.graph.predictor import seed_router_name
from lookahead.graph.router_inputs import input_dim, router_context
from lookahead.graph.runtime import RuntimeConfig, forward_with_topology
from lookahead.graph.scoring import GeoLookup, interpolate_curve, random_heads_nll, static_pruning_curve
from lookahead.lm.nll import PositionTotals, token_nll
from lookahead.pipeline.phase1.final import (  # noqa: F401  (ScoringSet, deployed_nll: the final figures' API, here too)
    CLAIMS, ScoringSet, capture, claims, deployed_nll, routed, score_final, scoring_set, seed_figures)
from lookahead.train.checkpoints import checkpoint_dir
from lookahead.train.loop import TrainConfig, TrainResult, logs_step, train
from lookahead.train.schedule import check_budget_schedule, tau_at


@dataclasses.dataclass
class Phase1Config:
    """Predictor training with the LM frozen (DESIGN §4)."""

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
    """Draws of the random per-position heads baseline (its NLL is their mean)."""
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
    train: TrainConfig = dataclasses.field(default_factory=lambda: TrainConfig(
        steps=600, batch_size=8, lr=3e-2, warmup_steps=20, weight_decay=0.0, eval_every=200, checkpoint_every=100))
    """Optimisation of the predictor (batch_size = windows per step)."""

    def __post_init__(self) -> None:
        require(self.seeds >= 1, "seeds", f"must be >= 1; got {self.seeds}")
        check_budget_schedule(self)
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

    def tau(self, step: int) -> float:
        """τ at ``step`` (:func:`lookahead.train.schedule.tau_at`)."""
        return tau_at(self.tau_start, self.tau_end, step, self.train.steps)

    def noise(self, step: int) -> float:
        """The head gates' noise scale at ``step``, annealed like τ."""
        return tau_at(self.noise_start, self.noise_end, step, self.train.steps)


ORACLES = ("loo", "greedy", "none")
BELOW_MARGIN = 1e-4
"""A position counts as below dense when its hard NLL is lower by more than this (nats): at step 0
hard and dense agree to ~1e-7, and float ties are not improvements."""


class Phase1Module:
    """The phase's step object for :func:`lookahead.train.loop.train`: the predictor trains, the LM is frozen.

    ``zero_inputs``: the router sees zeros instead of its context and geometric features (the
    static twin: whatever it learns is one mask for every position). ``oracle``: the oracle stage's
    targets; its windows are the training windows of a router that does not read the cache."""

    def __init__(self, predictor: StructurePredictor, lm, cache: ContextCache, geo: GeoLookup,
                 importance: torch.Tensor, cfg: Phase1Config, skip: str = "full", zero_inputs: bool = False,
                 oracle_targets: dict | None = None, oracle: OracleTargets | None = None):
        self.model = predictor
        self.lm = lm.eval().requires_grad_(False)
        self.cache, self.geo, self.cfg = cache, geo, cfg
        self.importance = importance
        self.skip, self.zero_inputs = skip, zero_inputs
        self.n_layers, self.n_heads = predictor.n_layers, predictor.n_heads
        self.n_edges = n_edges(self.n_layers, self.n_heads)
        self.device = torch.device("cpu")
        n_val = len(cache.windows("val"))
        self.val_rows = np.arange(n_val if cfg.eval_sequences == 0 else min(cfg.eval_sequences, n_val))
        self.tau_now = cfg.tau(0)
        self._val: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None  # windows, inputs, geo
        self._dense: list[torch.Tensor] | None = None  # per-batch dense NLL (B, T): the LM is frozen
        self._loo: list[torch.Tensor] | None = None  # per-batch leave-one-out KL (B, T, L·H)
        self._oracle: dict[int, float] = {}  # heads kept per position -> the oracle's NLL
        # train window -> its oracle scores (T, L·H): leave-one-out KL, or the greedy oracle's 0/1 heads
        self._train_loo: dict[int, torch.Tensor] = {} if oracle_targets is None else oracle_targets
        self.oracle = oracle if predictor.cfg.input != "cache" else None
        if self.oracle is not None:
            self.oracle.check(skip, self.keep_k(), self.n_layers * self.n_heads, cache.context_length)
            self.n_train = len(self.oracle) if cfg.train_windows == 0 else min(cfg.train_windows, len(self.oracle))
        else:
            self.n_train = len(cache.windows("train"))
        self._greedy: dict[int, list[torch.Tensor]] = {}  # heads kept -> per-batch greedy oracle gates (B, T, N)
        self._train_inputs: dict[int, torch.Tensor] = {}  # oracle window -> the router's inputs (T, F): the LM is frozen
        self.static_curve: list[dict] | None = None
        self.last_eval: dict = {}

    def cache_label(self) -> str:
        """The :func:`lookahead.artifacts.val_scores.set_label` of the periodic evaluation's windows."""
        return set_label("cache-val", self.cache.windows("val")[self.val_rows])

    def place(self, device) -> None:
        self.device = torch.device(device)
        self.lm.to(self.device)
        self.geo = self.geo.to(self.device)

    def inputs(self, ids: torch.Tensor, contexts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The router's context and geometric features of windows ``ids`` (zeros for the twin)."""
        if self.zero_inputs:  # nothing to compute: zeros of the router's input widths
            geo_dim = self.model.geo_dim
            zeros = ids.new_zeros(*ids.shape, self.model.context_dim + geo_dim, dtype=torch.float32)
            return zeros[..., : self.model.context_dim], (zeros[..., self.model.context_dim:] if geo_dim else None)
        context = router_context(self.model.cfg.input, self.lm, ids, contexts)
        return context, (self.geo(ids) if self.model.geo_dim else None)

    def train_inputs(self, ids: torch.Tensor, batch: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`inputs` of a training batch. A router that reads the frozen LM's states trains on the
        oracle stage's windows, each drawn many times: its states are computed once per window, each
        window alone (the same numbers whatever batch first draws it, so a resumed run trains on the
        same inputs), and kept for every seed (:data:`VAL_STATE`)."""
        if self.zero_inputs or self.oracle is None or self.model.cfg.input not in ("lm", "embedding", "layer"):
            return self.inputs(ids, batch["contexts"])
        rows = [int(r) for r in batch["rows"]]
        for i, r in enumerate(rows):
            if r not in self._train_inputs:
                self._train_inputs[r] = router_context(self.model.cfg.input, self.lm, ids[i : i + 1], None)[0]
        context = torch.stack([self._train_inputs[r] for r in rows])
        return context, (self.geo(ids) if self.model.geo_dim else None)

    @torch.no_grad()
    def routed_inputs(self, model, ids: torch.Tensor, context: torch.Tensor, geo: torch.Tensor | None) -> torch.Tensor:
        """``phase1.input_rounds`` rounds of routing on the states of the LM routed by the router's
        hard gates (``predictor.input: lm`` or ``layer``; other inputs come back unchanged). For
        ``layer``, L − 1 rounds make every layer's input the routed forward's own (as deployed)."""
        kind = self.model.cfg.input
        if kind not in ("lm", "layer") or self.zero_inputs or not self.cfg.input_rounds:
            return context
        emb = context[..., : context.shape[-1] // 2]  # lm: the token embedding half stays
        for _ in range(self.cfg.input_rounds):
            with eval_mode(model):
                _, gates = model(context, geo, hard=True)
            out = gated_forward(self.lm, ids, gates, self.skip, layer_inputs=kind == "layer")
            if kind == "layer":
                context = out.layer_inputs.float()
            else:  # the routed final hidden state at t − 1 (zeros at t = 0)
                hidden = out.hidden.float()
                context = torch.cat([emb, torch.cat([torch.zeros_like(hidden[:, :1]), hidden[:, :-1]], 1)], -1)
        return context

    def keep_k(self) -> int:
        """Heads the router keeps per position (its top-K budget)."""
        return keep_count(self.n_layers * self.n_heads, self.n_layers, self.model.cfg.keep, per_layer=False)

    def batch(self, step: int) -> dict:
        t = self.cfg.train
        rows = np.random.default_rng([t.seed, step, 0, 50]).integers(0, self.n_train, t.batch_size)
        if self.oracle is not None:
            windows, contexts = self.oracle.windows[torch.from_numpy(rows)], None
        else:
            windows, contexts = self.cache.batch("train", rows)
        self.tau_now = self.cfg.tau(step)
        hard = 0 <= self.cfg.hard_from_step <= step
        finetune = step >= t.steps - self.cfg.finetune_steps
        return {"windows": windows, "contexts": contexts, "tau": self.tau_now, "hard": hard or finetune,
                "noise": self.cfg.noise(step), "rows": rows, "logged": logs_step(step, t), "finetune": finetune}

    def _oracle_targets(self, windows: torch.Tensor, rows) -> torch.Tensor:
        """The oracle's scores (B, T, L·H) of training windows — leave-one-out KL, or 1 for the greedy
        oracle's heads —, read from the oracle stage's file, or (a router that reads the cache)
        computed once per window and one window at a time (the same numbers whichever batch first
        needs a window: a resumed run trains on the same targets)."""
        if self.oracle is not None:
            return self.oracle.scores(self.cfg.distill_target, rows).to(self.device)
        for i, r in enumerate(int(x) for x in rows):
            if r not in self._train_loo:
                ids = windows[i : i + 1, :-1].to(self.device)
                if self.cfg.distill_target == "greedy":
                    scores = greedy_gates(self.lm, ids, self.n_layers, self.n_heads, self.keep_k(), self.skip)[..., 1:]
                else:
                    scores = leave_one_out_kl(self.lm, ids, self.n_layers, self.n_heads, self.skip)
                self._train_loo[r] = scores[0].cpu()
        return torch.stack([self._train_loo[int(r)] for r in rows]).to(self.device)

    def finetune_loss(self, model, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """KL(dense ‖ routed) per position, mean, through the straight-through hard gates (the LM frozen)."""
        windows = batch["windows"]
        ids = windows[:, :-1]
        context, geo = self.train_inputs(ids, batch)
        context = self.routed_inputs(model, ids, context, geo)
        self.model.noise_scale = batch["noise"]  # the predictor itself (``model`` may be its DDP wrapper)
        adjacency, gates, z = model(context, geo, tau=batch["tau"], hard=True, with_logits=True)
        with torch.no_grad():
            dense_logp = F.log_softmax(self.lm(input_ids=ids).logits.float(), -1)
        logits = forward_with_topology(self.lm, ids, adjacency, gates, skip=self.skip)
        kl = kl_to_dense(dense_logp, logits).mean()
        nll = token_nll(logits.detach(), windows[:, 1:]).mean()
        return kl, {"nll": nll.item(), "head_gate": gates[..., 1:].mean().item(), "tau": batch["tau"],
                    "finetune_kl": kl.item()}

    def loss(self, model, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        if batch.get("finetune"):
            return self.finetune_loss(model, batch)
        windows = batch["windows"]
        ids = windows[:, :-1]
        context, geo = self.train_inputs(ids, batch)
        context = self.routed_inputs(model, ids, context, geo)
        self.model.noise_scale = batch["noise"]  # the predictor itself (``model`` may be its DDP wrapper)
        adjacency, gates, z = model(context, geo, tau=batch["tau"], hard=batch["hard"], with_logits=True)
        # soft execution: every head's output exists. Without an NLL term (pure distillation) the LM
        # runs, without gradient, only for the training curve's NLL: on the steps the curve logs
        nll = None
        if self.cfg.nll_weight > 0 or batch.get("logged", True):
            with torch.set_grad_enabled(torch.is_grad_enabled() and self.cfg.nll_weight > 0):
                logits = forward_with_topology(self.lm, ids, adjacency, gates, skip=self.skip)
                nll = token_nll(logits, windows[:, 1:]).mean()
        head, edge = budget_terms(adjacency, gates, self.n_layers, self.n_heads)
        pcfg = self.model.cfg
        penalty = l0_penalty(z).mean() if z is not None and pcfg.estimator == "hard_concrete" else head
        loss = self.cfg.lambda_head * penalty
        if self.cfg.nll_weight > 0:
            loss = loss + self.cfg.nll_weight * nll
        if pcfg.gate == "cascade" or pcfg.edges == "learned":  # head gates with every edge: nothing to prune
            loss = loss + self.cfg.lambda_edge * edge
        figures = {"head_gate": head.item(), "edge_weight": edge.item(), "tau": batch["tau"]}
        if nll is not None:
            figures = {"nll": nll.item(), **figures}
        if z is not None:
            if self.cfg.z_loss:
                loss = loss + self.cfg.z_loss * z_loss(z)
            if self.cfg.balance:
                loss = loss + self.cfg.balance * balance_loss(gates[..., 1:], pcfg.keep)
            if self.cfg.distill:
                distill = distill_loss(z, self._oracle_targets(windows, batch["rows"]), pcfg.keep, self.n_layers,
                                       self.cfg.loss, per_layer=pcfg.budget in ("topk_layer", "topk_layer_static"),
                                       counts=getattr(self.model, "layer_keep", None))
                loss = loss + self.cfg.distill * distill
                figures["distill"] = distill.item()
            figures["logit_abs"] = z.detach().abs().mean().item()
        return loss, figures

    def tokens(self, batch: dict) -> int:
        return batch["windows"][:, 1:].numel()

    def _val_batches(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """(windows, router context, geometric features) per val batch, made once: the LM is frozen."""
        if self._val is None:
            size = self.cfg.eval_batch_size
            self._val = []
            for i in range(0, len(self.val_rows), size):
                windows, contexts = self.cache.batch("val", self.val_rows[i : i + size])
                windows = windows.to(self.device)
                self._val.append((windows, *self.inputs(windows[:, :-1], contexts.to(self.device))))
        return self._val

    def oracle_nll(self, keep: int) -> float:
        """NLL of the leave-one-out KL oracle keeping ``keep`` heads at every position."""
        batches = self._val_batches()
        if self._loo is None:
            self._loo = [leave_one_out_kl(self.lm, w[:, :-1], self.n_layers, self.n_heads, self.skip)
                         for w, _, _ in batches]
        if keep not in self._oracle:
            total, count = 0.0, 0
            for (windows, _, _), kl in zip(batches, self._loo):
                nll = gates_nll(self.lm, windows, top_k_gates(kl, keep), self.n_layers, self.n_heads, self.skip)
                total, count = total + nll.sum().item(), count + nll.numel()
            self._oracle[keep] = total / count
        return self._oracle[keep]

    @torch.no_grad()
    def greedy_val_gates(self, keep: int) -> list[torch.Tensor]:
        """The greedy label-free oracle's gates (B, T, N) keeping ``keep`` heads, per val batch
        (computed once per head count: the LM is frozen)."""
        if keep not in self._greedy:
            self._greedy[keep] = [greedy_gates(self.lm, w[:, :-1], self.n_layers, self.n_heads, keep, self.skip)
                                  for w, _, _ in self._val_batches()]
        return self._greedy[keep]

    @torch.no_grad()
    def greedy_oracle_nll(self, keep: int) -> float:
        """NLL of the greedy label-free oracle keeping ``keep`` heads at every position."""
        total, count = 0.0, 0
        for (windows, _, _), gates in zip(self._val_batches(), self.greedy_val_gates(keep)):
            nll = gates_nll(self.lm, windows, gates, self.n_layers, self.n_heads, self.skip)
            total, count = total + nll.sum().item(), count + nll.numel()
        return total / count

    def _hard_nll(self, model, batches) -> tuple[PositionTotals, torch.Tensor]:
        """Soft and hard NLL, below-dense share and active edges of the router's topologies, and its
        hard gates (positions, L·H)."""
        totals, on = PositionTotals(), []
        for (windows, context, geo), dense in zip(batches, self._dense):
            ids, targets = windows[:, :-1], windows[:, 1:]
            adjacency, gates = model(context, geo, tau=self.tau_now, hard=False)
            soft = token_nll(forward_with_topology(self.lm, ids, adjacency, gates, skip=self.skip), targets)
            adjacency, gates = model(context, geo, tau=self.tau_now, hard=True)
            hard = token_nll(execute(self.lm, ids, adjacency, gates, self.skip), targets)
            totals.add(dense.numel(), soft=soft.sum().item(), hard=hard.sum().item(), dense=dense.sum().item(),
                       below=(hard < dense - BELOW_MARGIN).sum().item(),
                       edges=adjacency.sum((-2, -1)).sum().item() / self.n_edges)
            on.append(gates[..., 1:].reshape(-1, self.n_layers * self.n_heads) > 0)
        return totals, torch.cat(on)

    def _shuffled_nll(self, model, batches) -> float:
        """Hard NLL with the router's inputs permuted across all val positions (a fixed draw)."""
        context = torch.cat([c.reshape(-1, c.shape[-1]) for _, c, _ in batches])
        perm = torch.randperm(len(context), generator=torch.Generator().manual_seed(self.cfg.train.seed)).to(self.device)
        context = context[perm]
        geo = None if batches[0][2] is None else torch.cat([g.reshape(-1, g.shape[-1]) for _, _, g in batches])[perm]
        total, count, start = 0.0, 0, 0
        for windows, c, _ in batches:
            size = c.shape[0] * c.shape[1]
            rows = slice(start, start + size)
            start += size
            g_b = None if geo is None else geo[rows].view(*c.shape[:2], -1)
            adjacency, gates = model(context[rows].view(c.shape), g_b, tau=self.tau_now, hard=True)
            ids = windows[:, :-1]
            nll = token_nll(execute(self.lm, ids, adjacency, gates, self.skip), windows[:, 1:])
            total, count = total + nll.sum().item(), count + nll.numel()
        return total / count

    @torch.no_grad()
    def evaluate(self, model) -> dict[str, float]:
        """Dense, soft and hard NLL on the val contexts, active fractions, routing statistics, the
        baselines at the same fraction and the label-free oracle."""
        with eval_mode(model):
            batches = self._val_batches()
            if self._dense is None:
                self._dense = [token_nll(self.lm(input_ids=w[:, :-1]).logits, w[:, 1:]) for w, _, _ in batches]
            totals, on = self._hard_nll(model, batches)
            shuffled = self._shuffled_nll(model, batches)
        per_layer = on.float().view(-1, self.n_layers, self.n_heads).mean((0, 2)).tolist()
        fraction = float(np.mean(per_layer))
        windows = [w for w, _, _ in batches]
        if self.static_curve is None:
            self.static_curve = static_pruning_curve(self.lm, windows, self.importance, self.skip)
        random_nll = random_heads_nll(self.lm, windows, fraction, self.n_layers, self.n_heads,
                                      self.cfg.random_draws, self.cfg.train.seed, self.skip)
        static = interpolate_curve(self.static_curve, fraction)
        hard = totals.mean("hard")
        keep = round(fraction * self.n_layers * self.n_heads)
        oracle = self.oracle_nll(keep) if self.cfg.oracle != "none" else None
        recall = None
        if self.cfg.oracle == "greedy" and keep > 0:  # |router's heads ∩ the greedy oracle's| / K per position
            greedy = torch.cat([g[..., 1:].reshape(-1, self.n_layers * self.n_heads) for g in self.greedy_val_gates(keep)])
            recall = ((greedy > 0) & on).sum(-1).double().mean().item() / keep
        metrics = {
            "dense_nll": totals.mean("dense"),
            "soft_nll": totals.mean("soft"),
            "hard_nll": hard,
            "active_head_fraction": fraction,
            "active_edge_fraction": totals.mean("edges"),
            "below_dense_fraction": totals.mean("below"),
            "static_pruning_nll": static,
            "random_heads_nll": random_nll,
            "oracle_nll": oracle,
            "oracle_capture": capture(static, hard, oracle),
            "oracle_recall_at_k": recall,
            "context_shuffle_dnll": shuffled - hard,
            **routing_stats(on, self.n_layers),
            "tau": self.tau_now,
        }
        self.last_eval = {**metrics, "active_head_fraction_per_layer": per_layer, "oracle_heads_kept": keep}
        return metrics


def distill_loss(z: torch.Tensor, scores: torch.Tensor, keep: float, n_layers: int, loss: str = "bce",
                 per_layer: bool = False, counts: torch.Tensor | None = None) -> torch.Tensor:
    """Distillation of keep logits z (…, L·H) toward the oracle's keep set, the top-K of its
    ``scores`` (…, L·H), K = round(keep · L·H): ``bce`` of z centred on its own top-K threshold
    against the keep set, or ``listwise``, −(1/K) Σ_{h kept} log softmax(z)_h. ``per_layer`` (the
    budgets ``topk_layer``, ``topk_layer_static``): the top K_l of each layer's scores — K/L, or
    ``counts`` (L,) —, the threshold and the softmax over each layer's heads."""
    k = counts if per_layer and counts is not None else keep_count(z.shape[-1], n_layers, keep, per_layer)
    kept = int(k.sum()) if isinstance(k, torch.Tensor) else k * (n_layers if per_layer else 1)
    target = topk_mask(scores, k, n_layers, per_layer=True)[0] if per_layer else top_k_gates(scores, k)[..., 1:]
    groups = z.unflatten(-1, (n_layers, -1)) if per_layer else z  # the heads a softmax or a threshold spans
    if loss == "listwise":
        return -(target * F.log_softmax(groups, -1).reshape(z.shape)).sum(-1).mean() / kept
    _, theta = topk_mask(z, k, n_layers, per_layer)
    return F.binary_cross_entropy_with_logits((groups - theta).reshape(z.shape), target)


# metrics/phase1.json (lookahead.core.report); throughput and per-layer figures stay in the report
# and the research figures over seeds (lookahead.core.seeds): the mean, then `_sd`
SEEDED = ("hard_nll", "deployed_nll", "active_head_fraction", "random_heads_nll", "hard_nll_increase",
          "increase_over_static_increase", "deployed_increase_over_static_increase", "oracle_capture",
          "greedy_capture", "oracle_recall_at_k", "static_recall_at_k", "dynamic_fraction", "context_shuffle_dnll",
          "static_twin_gap", "equal_macs_static_heads")
# every figure scores one set of windows: the scoring set (test or selection; the cache's val windows
# for a router that reads the cache), recorded as `window_set`; soft_nll, active_edge_fraction,
# gate_entropy_bits, the NLL ratios and the periodic evaluation's figures (`cache_val`) are in the report
HEADLINE = ("dense_nll", "hard_nll", "hard_nll_sd", "deployed_nll", "deployed_nll_sd", "active_head_fraction",
            "static_pruning_nll", "random_heads_nll", "oracle_nll", "greedy_oracle_nll",
            "greedy_capture", "greedy_capture_sd", f"greedy_capture{CI_LOW}", f"greedy_capture{CI_HIGH}",
            "oracle_recall_at_k", "oracle_recall_at_k_sd", "static_recall_at_k", "dynamic_fraction",
            "context_shuffle_dnll", "static_twin_gap",
            *[k for name, _, _ in CLAIMS for k in claim_keys(name) if not k.endswith(SE)], "seeds", "window_set")
"""The headline (36 keys at most; `dvc metrics show metrics/phase1.json` within 400 characters:
the claims' spreads and intervals in the sibling files); every other figure, and every other
``_sd``, is in the report."""


VAL_STATE = ("_val", "_dense", "_loo", "_oracle", "_greedy", "static_curve", "_train_inputs")
"""What a :class:`Phase1Module`'s periodic evaluation computes once and no seed changes: the val
batches and the router's inputs there, the frozen LM's dense NLL, the leave-one-out oracle (its KL
and its NLL per head count), the greedy oracle's gates per head count and the static-pruning curve."""


def _predictor(predictor_cfg: PredictorConfig, init_file, cache: ContextCache, lm, importance) -> StructurePredictor:
    """A fresh predictor for this cache and base LM (head gates start at static importance)."""
    predictor = StructurePredictor.from_init(predictor_cfg, init_file, input_dim(
        predictor_cfg.input, cache.dim, lm.config.hidden_size, lm.config.num_hidden_layers))
    if predictor_cfg.gate == "head":
        predictor.init_head_bias(importance)
    return predictor


def build_phase1(cfg: Phase1Config, predictor_cfg: PredictorConfig, base_dir, contexts_dir, init_file, heads_file,
                 out_file, checkpoint_root=None, tracker=None, runtime_cfg: RuntimeConfig | None = None,
                 oracle_targets: dict | None = None, scoring: ScoringSet | None = None,
                 val_state: dict | None = None, oracle: OracleTargets | None = None
                 ) -> tuple[dict, TrainResult, Phase1Module]:
    """Train the predictor; write it to ``out_file``; return (metrics, training result, module).
    ``oracle_targets``: the distillation targets by train window, shared between runs of the same
    inputs (the stage's seeds); filled as they are computed. ``scoring``: the val set the final
    dense, hard and static-pruning NLLs score (their per-position values in ``token_nll``); None:
    the cache's val windows, as the periodic evaluation. ``val_state``: the periodic evaluation's
    seed-independent figures (:data:`VAL_STATE`), shared between runs of the same inputs: read when
    filled, filled otherwise. ``oracle``: the oracle stage's targets, the training windows of a
    router that does not read the cache (None: the cache's train windows, targets computed here)."""
    from transformers import AutoModelForCausalLM

    runtime_cfg = runtime_cfg or RuntimeConfig()
    if predictor_cfg.gate == "cascade" and cfg.static_twin:  # zeroed inputs collapse its soft edges (~3 s/step)
        raise ConfigError("phase1.static_twin", "is for head-gate routers: the cascade trained on zeroed inputs "
                          "collapses (every edge logit the same: ~3 s/step for nothing); set it to false for "
                          "predictor.gate: cascade")
    if predictor_cfg.gate != "head":
        for name in ("distill", "z_loss", "balance"):
            require(getattr(cfg, name) == 0, name, f"acts on head gates' keep logits: set it to 0 for "
                    f"predictor.gate: {predictor_cfg.gate} (or use predictor.gate: head)")
    cache = ContextCache(contexts_dir)
    lm = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    tensors, _ = load_init(init_file)
    importance = head_importance(heads_file)
    torch.manual_seed(cfg.train.seed)
    predictor = _predictor(predictor_cfg, init_file, cache, lm, importance)
    if (predictor.n_layers, predictor.n_heads) != (lm.config.num_hidden_layers, lm.config.num_attention_heads) \
            or tuple(importance.shape) != (predictor.n_layers, predictor.n_heads):
        raise ValueError(f"init file {init_file} ({predictor.n_layers} x {predictor.n_heads}), head statistics "
                         f"{heads_file} {tuple(importance.shape)} and base model "
                         f"({lm.config.num_hidden_layers} x {lm.config.num_attention_heads}) disagree: "
                         "rerun `dvc repro` from the probe stage")
    geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float())
    oracle_targets = {} if oracle_targets is None else oracle_targets
    module = Phase1Module(predictor, lm, cache, geo, importance, cfg, runtime_cfg.skip, oracle_targets=oracle_targets,
                          oracle=oracle)
    for name, value in (val_state or {}).items():
        setattr(module, name, value)

    module.place(resolve_device(cfg.train.device, "phase1.train.device"))  # before the first evaluation
    initial = module.evaluate(predictor.to(module.device))  # the starting point: near the dense graph
    config = {"phase1": to_dict(cfg), "predictor": to_dict(predictor_cfg), "runtime": to_dict(runtime_cfg)}
    files = [init_file, Path(base_dir) / "model.safetensors"]
    if module.oracle is not None:  # its windows and targets are what the router trains on
        files.append(module.oracle.dir / TARGETS_FILE)
    ckpt = checkpoint_dir(checkpoint_root, "phase1", config, files, [cache.fingerprint()])
    result = train(module, cfg.train, stage="phase1", checkpoint_dir=ckpt, tracker=tracker)
    result.eval_curve.insert(0, {"step": 0, **initial})
    final = module.last_eval
    if val_state is not None and not val_state:
        val_state.update({name: getattr(module, name) for name in VAL_STATE})
    predictor = module.model
    cost = None
    if predictor_cfg.gate == "head":  # per-token MACs over a dense forward's, the router's inputs included
        length = scoring.window if scoring is not None else module.cache.context_length
        cost = lambda fraction, state=False: deployed_macs(  # noqa: E731
            lm.config, predictor, (length + 1) / 2, fraction, module.skip, state)
    scored = None
    if scoring is not None:
        scored = score_final(module, predictor, scoring,
                             None if cost is None else lambda fraction: cost(fraction)["total_over_dense"])
    predictor = predictor.cpu()
    save_predictor(predictor, out_file, extra={"phase1": to_dict(cfg), "encoder": cache.meta["encoder"],
                                               "runtime": to_dict(runtime_cfg)})
    # the periodic evaluation's last figures: the context cache's val windows (the curves)
    cache_keys = ("dense_nll", "soft_nll", "hard_nll", "active_head_fraction", "active_edge_fraction",
                  "below_dense_fraction", "static_pruning_nll", "random_heads_nll", "oracle_nll", "oracle_capture",
                  "oracle_recall_at_k", "dynamic_fraction", "gate_entropy_bits", "context_shuffle_dnll")
    metrics = {k: final[k] for k in cache_keys}
    metrics["cache_val"] = {"window_set": module.cache_label(), **{k: final[k] for k in cache_keys}}
    metrics["scored_positions"] = len(module.val_rows) * module.cache.context_length
    metrics["window_set"] = module.cache_label()
    if scored is not None:  # every headline figure on the scoring set
        metrics.update(seed_figures(scored))
        metrics.update({"scored_positions": len(scored["hard"]), "window_set": scoring.label,
                        "token_nll": {k: scored[k] for k in TOKEN_NLL if scored.get(k) is not None}})
    else:  # the cache's val windows alone: the greedy oracle there
        metrics.update({"greedy_oracle_nll": None, "greedy_capture": None, "deployed_nll": None})
        if cfg.oracle == "greedy":
            greedy = module.greedy_oracle_nll(final["oracle_heads_kept"])
            metrics.update({"greedy_oracle_nll": greedy,
                            "greedy_capture": capture(final["static_pruning_nll"], final["hard_nll"], greedy)})
        increase, static_increase = (metrics[k] - metrics["dense_nll"] for k in ("hard_nll", "static_pruning_nll"))
        metrics.update({"hard_nll_increase": increase, "static_pruning_nll_increase": static_increase,
                        "increase_over_static_increase": increase / static_increase if static_increase > 0 else None,
                        "deployed_increase_over_static_increase": None, "oracle_heads_kept": final["oracle_heads_kept"],
                        "static_recall_at_k": None, "equal_macs_static_heads": None})  # scoring-set figures
    metrics.update({
        "init_soft_nll_minus_dense": initial["soft_nll"] - initial["dense_nll"],
        "static_twin_gap": None,
        "train_steps": cfg.train.steps,
        "train_tokens_per_s": result.tokens_per_s,
    })
    metrics.update(dict.fromkeys(("deployed_macs_over_dense", "dense_state_macs_over_dense", "router_macs_over_dense")))
    if cost is not None:
        fraction = metrics["active_head_fraction"]
        metrics.update({"deployed_macs_over_dense": cost(fraction)["total_over_dense"],
                        "dense_state_macs_over_dense": cost(fraction, True)["total_over_dense"],
                        "router_macs_over_dense": cost(fraction)["router_over_dense"]})
    if cfg.static_twin:
        metrics.update(_static_twin(cfg, predictor_cfg, module, init_file, files, checkpoint_root, final, scoring,
                                    metrics["hard_nll"]))
    return metrics, result, module


TOKEN_NLL = ("dense", "hard", "static", "deployed", "random", "loo", "greedy", "static_equal_macs")
"""The per-position NLLs a seed's report carries to the score file (those measured)."""


def _static_twin(cfg: Phase1Config, predictor_cfg: PredictorConfig, module: Phase1Module, init_file, files,
                 checkpoint_root, final: dict, scoring: ScoringSet | None, hard_nll: float) -> dict:
    """Train the same router, same seed, on zeroed inputs; its hard NLL minus the router's
    (``hard_nll``), on the scoring set where there is one."""
    torch.manual_seed(cfg.train.seed)
    twin = _predictor(predictor_cfg, init_file, module.cache, module.lm, module.importance)
    twin_module = Phase1Module(twin, module.lm, module.cache, module.geo, module.importance, cfg, module.skip,
                               zero_inputs=True, oracle_targets=module._train_loo, oracle=module.oracle)
    for name in VAL_STATE:  # the same LM and val windows: the seed-independent work is the router's
        if name != "_val":  # the twin's inputs are zeros
            setattr(twin_module, name, getattr(module, name))
    twin_module.place(module.device)
    twin_cfg = final_evaluation_only(cfg)
    ckpt = checkpoint_dir(checkpoint_root, "phase1_twin", {"phase1": to_dict(twin_cfg),
                                                           "predictor": to_dict(predictor_cfg), "skip": module.skip},
                          files, [module.cache.fingerprint()])
    train(twin_module, twin_cfg.train, stage="phase1 twin", checkpoint_dir=ckpt)
    twin_eval = twin_module.last_eval
    out = {"static_twin_hard_nll": twin_eval["hard_nll"],
           "static_twin_active_head_fraction": twin_eval["active_head_fraction"],
           "static_twin_dynamic_fraction": twin_eval["dynamic_fraction"]}
    if scoring is not None:
        hard, on = routed(twin_module, twin_module.model, scoring)
        out.update({"static_twin_hard_nll": float(hard.mean()),
                    "static_twin_active_head_fraction": on.double().mean().item(),
                    "static_twin_dynamic_fraction": routing_stats(on, module.n_layers)["dynamic_fraction"]})
    out["static_twin_gap"] = out["static_twin_hard_nll"] - hard_nll
    return out


def build_phase1_seeds(cfg: Phase1Config, predictor_cfg: PredictorConfig, base_dir, contexts_dir, init_file, heads_file,
                       out_file, checkpoint_root=None, tracker=None, runtime_cfg: RuntimeConfig | None = None,
                       scoring_cfg: ScoringConfig | None = None, tokens_dir=None, scores_file=None, oracle_dir=None,
                       seeds_dir=None) -> tuple[dict, TrainResult, Phase1Module]:
    """:func:`build_phase1`, then ``cfg.seeds - 1`` more trainings on other seeds: the metrics carry
    the :data:`SEEDED` figures' mean and sd (lookahead.core.seeds). ``seeds_dir``: where seed i's
    router goes (``predictor_seed<i>.safetensors``, i ≥ 1: phase 2's seed i routes with it; None:
    discarded). With ``scoring_cfg``: every final figure scores its windows of ``tokens_dir``'s val
    stream (:mod:`lookahead.pipeline.phase1.final`), every seed's per-position NLLs go to
    ``scores_file`` (:func:`lookahead.artifacts.val_scores.save_scores`: ``dense`` (P,), the others
    (seeds, P), the seed-independent ones at each seed's head count) and the claims
    (:data:`lookahead.pipeline.phase1.final.CLAIMS`) get their intervals. ``oracle_dir``: the oracle
    stage's targets (:mod:`lookahead.artifacts.oracle_targets`)."""
    oracle = OracleTargets(oracle_dir) if oracle_dir is not None else None
    targets: dict = {}  # the oracle's targets do not depend on the seed: computed once
    val_state: dict = {}  # nor does the periodic evaluation's reference work
    scoring = None
    if scoring_cfg is not None:
        cache = ContextCache(contexts_dir)
        scoring = scoring_set(scoring_cfg, scoring_windows(tokens_dir, scoring_cfg, cache.context_length), cache,
                              predictor_cfg.input, resolve_device(cfg.train.device, "phase1.train.device"))
    keep_seeds = seeds_dir is not None and is_main_process()  # a worker's seed runs write to scratch only
    tokens: list = []  # every seed's per-position NLLs, popped from its report
    # the seeds' routers replace seeds_dir once every seed has trained (a killed run leaves nothing there)
    with atomic_dir(seeds_dir) if keep_seeds else contextlib.nullcontext() as seeds_tmp:

        def router_file(c: Phase1Config, scratch: Path | None) -> Path:
            if scratch is None:
                return Path(out_file)
            return seeds_tmp / seed_router_name(c.train.seed - cfg.train.seed) if keep_seeds \
                else scratch / "predictor.safetensors"

        out, result, module = over_seeds(cfg, "phase1", SEEDED, lambda c, scratch: build_phase1(
            c, predictor_cfg, base_dir, contexts_dir, init_file, heads_file, router_file(c, scratch), checkpoint_root,
            None if scratch else tracker, runtime_cfg, targets, scoring, val_state, oracle),
            lambda runs: tokens.extend(r.pop("token_nll", None) for r in runs))
    if scoring is not None:
        scores = {"dense": tokens[0]["dense"]}
        scores.update({k: np.stack([t[k] for t in tokens]) for k in TOKEN_NLL[1:] if all(k in t for t in tokens)})
        if scores_file is not None:
            save_scores(scores_file, scores, scoring.label)
        out.update(claims(scores, scoring))
    return out, result, module

