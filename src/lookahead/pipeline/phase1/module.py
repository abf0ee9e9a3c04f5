"""Phase 1's step object (:class:`Phase1Module`: the batches, the loss, the periodic evaluation on the
context cache's val windows) and the distillation loss it trains the router with."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.oracle_targets import OracleTargets
from lookahead.core.devices import eval_mode
from lookahead.core.windows import set_label
from lookahead.graph.gating import balance_loss, budget_terms, l0_penalty, listwise_loss, topk_mask, z_loss
from lookahead.graph.nodes import keep_count, n_edges, top_k_gates
from lookahead.graph.oracle import (gates_nll, greedy_gates, greedy_keep, greedy_targets, kl_to_dense, leave_one_out_kl,
                                   routing_stats)
from lookahead.graph.plan import execute, gated_forward
from lookahead.graph.predictor import StructurePredictor
from lookahead.graph.router_inputs import lm_input, router_context, states_before
from lookahead.graph.runtime import forward_with_topology
from lookahead.graph.scoring import (GeoLookup, capture, interpolate_curve, random_heads_nll, shuffled,
                                     static_pruning_curve)
from lookahead.lm.nll import PositionTotals, token_nll
from lookahead.pipeline.phase1.config import BELOW_MARGIN, Phase1Config
from lookahead.train.loop import logs_step


PERIODIC_RANDOM_DRAWS = 3
"""Draws of the random-heads baseline in the periodic evaluation (the curves, on the cache's val
windows); ``phase1.random_draws`` is the scoring stage's, on the scoring windows, so that changing it
reruns scoring only."""


CACHE_KEYS = ("dense_nll", "soft_nll", "hard_nll", "active_head_fraction", "active_edge_fraction",
              "below_dense_fraction", "static_pruning_nll", "random_heads_nll", "oracle_nll", "oracle_capture",
              "oracle_recall_at_k", "dynamic_fraction", "gate_entropy_bits", "context_shuffle_dnll")
"""The periodic evaluation's figures a training run reports (the cache's val windows, ``cache_val``)."""


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
        # the greedy search of the oracle stage's targets, also the report's greedy oracle (exact without targets)
        self.search = oracle.search if oracle is not None else {}
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
                context = lm_input(emb, states_before(out.hidden.float()))
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
                    scores = self.greedy_gates(ids, self.keep_k())[..., 1:]
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
            self._greedy[keep] = [self.greedy_gates(w[:, :-1], keep) for w, _, _ in self._val_batches()]
        return self._greedy[keep]

    def greedy_gates(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        """The greedy label-free oracle's gates (B, T, N) of ``ids`` keeping ``keep`` heads, with the
        oracle stage's search (``oracle.per_round``, ``oracle.candidates``)."""
        return greedy_gates(self.lm, ids, self.n_layers, self.n_heads, keep, self.skip, **self.search)

    def greedy_targets(self, ids: torch.Tensor, keep: int) -> dict[str, torch.Tensor]:
        """:meth:`greedy_gates` (``gates``) and the search's first step (``first``: every head's
        leave-one-out KL, (B, T, L·H)), from one search."""
        order, first = greedy_targets(self.lm, ids, self.n_layers, self.n_heads, keep, self.skip, **self.search)
        return {"gates": greedy_keep(order, keep), "first": first}

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
        total, count = 0.0, 0
        for (windows, _, _), (context, geo) in zip(batches, shuffled([(c, g) for _, c, g in batches], self.cfg.train.seed)):
            adjacency, gates = model(context, geo, tau=self.tau_now, hard=True)
            nll = token_nll(execute(self.lm, windows[:, :-1], adjacency, gates, self.skip), windows[:, 1:])
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
                                      PERIODIC_RANDOM_DRAWS, self.cfg.train.seed, self.skip)
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
        return listwise_loss(F.log_softmax(groups, -1).reshape(z.shape), target, kept)
    _, theta = topk_mask(z, k, n_layers, per_layer)
    return F.binary_cross_entropy_with_logits((groups - theta).reshape(z.shape), target)
