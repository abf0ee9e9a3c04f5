"""Phase 2's step object (:class:`Phase2Module`): the batches its decoder routes, the loss, the periodic
evaluation on the cache's val windows and the final scoring."""

from __future__ import annotations

import numpy as np
import torch

from lookahead.artifacts.contexts import ContextCache
from lookahead.core.devices import eval_mode
from lookahead.graph.cost import gate_macs, router_macs
from lookahead.graph.gating import budget_terms
from lookahead.graph.deployed import Router, self_consistent
from lookahead.graph.nodes import running_heads
from lookahead.graph.plan import execute
from lookahead.graph.runtime import forward_with_topology
from lookahead.graph.scoring import GeoLookup
from lookahead.lm.nll import PositionTotals, token_nll
from lookahead.pipeline.phase2.common import routed_loss, step_tokens, step_windows
from lookahead.pipeline.phase2.common import val_batches, val_rows, windows_loss
from lookahead.pipeline.phase2.config import Phase2Config
from lookahead.pipeline.phase2.model import Phase2Model
from lookahead.pipeline.phase2.refresh import Refresher


DEPLOYED_WINDOWS = 64
"""Windows decoded together when scoring the router as deployed (one cached step of each per forward)."""


class Phase2Module:
    """The step object of phase 2: the LM trains under the topologies of its decoder — the predictor,
    training with it (``mlp``), or a sample of the frozen denoiser per position (``diffusion``)."""

    def __init__(self, model: Phase2Model, cache: ContextCache, geo: GeoLookup, cfg: Phase2Config,
                 sampler=None, stream: np.ndarray | None = None, teacher=None):
        self.model = model
        self.stream = stream  # the train token stream (stream windows, replay)
        self.teacher = teacher  # distill > 0: the frozen dense base
        self.cache, self.geo, self.cfg = cache, geo, cfg
        self.sampler = sampler  # decoder diffusion: the frozen head's TopologySampler (lookahead.graph.denoiser)
        predictor = model.predictor
        self.geo_used = predictor is not None and predictor.geo_dim > 0
        self.device = torch.device("cpu")
        self.val_rows = val_rows(cfg, cache)
        self.last_eval: dict = {}
        self.refresher = None  # refresh_every > 0: made in place(), once the predictor is on its device
        self.last_refresh: dict = {}

    def place(self, device) -> None:
        self.device = torch.device(device)
        self.geo = self.geo.to(self.device)
        if self.cfg.refresh_every:
            self.model.predictor.to(self.device)
            self.refresher = Refresher(self.model.predictor, self.cfg.refresh_lr, self.cfg.refresh_steps,
                                       self.cfg.refresh_windows, self.cfg.refresh_oracle)
        for frozen in (self.sampler and self.sampler.denoiser, self.teacher, self.model.reference[0]):
            if frozen is not None:
                frozen.to(self.device)

    def lr_scale(self, name: str) -> float:
        """The weights phase 2 adds (connectivity, value residual, adapter) train at ``connectivity_lr_scale``
        times the LM's rate (the loop's parameter groups)."""
        added = name.startswith(("connectivity.", "value_residual.", "lora.")) or ".parametrizations.weight.0." in name
        return self.cfg.connectivity_lr_scale if added else 1.0

    def _sample(self, contexts: torch.Tensor | None, ids: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Allowed-edge bits (B, T, E) of one diffusion sample per position (its executed graph; the
        head reads its recorded inputs: the phase-2 LM's states, or the cache's)."""
        ids = ids.to(self.device)
        geo = self.geo(ids) if self.sampler.denoiser.geo_dim else None
        cached = contexts.to(self.device) if contexts is not None else None
        return self.sampler.bits(self.model.lm, ids, cached, geo, generator)

    def _executed(self, bits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sampler.executed(bits, self.device)

    def batch(self, step: int) -> dict:
        out, contexts = step_windows(self.cfg, self.cache, self.stream, step)
        if self.sampler is not None:
            generator = torch.Generator(device=self.device).manual_seed(self.cfg.train.seed * 1_000_003 + step)
            with torch.no_grad():
                out["bits"] = self._sample(contexts, out["windows"][:, :-1], generator)
            return out
        if contexts is not None:
            out["contexts"] = contexts
        out.update(tau=self.cfg.tau(step), hard=0 <= self.cfg.hard_from_step <= step)
        if self.cfg.budget_warmup:
            out["keep"] = self.cfg.keep_at(step, self.model.predictor.cfg.keep)
        if self.cfg.refresh_every and (step + 1) % self.cfg.refresh_every == 0:
            out["refresh"] = True
        return out

    def loss(self, model, batch: dict):
        windows = batch["windows"]
        ids, targets = windows[:, :-1], windows[:, 1:]
        parts = {}
        if self.sampler is not None:
            topology = self._executed(batch["bits"])
            logits, _ = model(ids, topology=topology)
            parts["head_gate"] = topology[1][..., 1:].mean().item()
        else:
            if batch.get("refresh"):  # before this step's forward: the router catches up with the LM as it is
                self.last_refresh = self.refresher.step(self.model.lm, self.model.predictor, self.model.skip, ids,
                                                        self.geo if self.geo_used else None)
            geo = self.geo(ids) if self.geo_used else None
            logits, topology = model(ids, batch.get("contexts"), geo, tau=batch["tau"], hard=batch["hard"],
                                     keep=batch.get("keep"))
            p = self.model.predictor
            if topology is None:  # the stock forward: every head, every edge
                head = edge = torch.ones(())
            else:
                head, edge = budget_terms(*topology, p.n_layers, p.n_heads)
            parts.update({"head_gate": head.item(), "edge_weight": edge.item(), "tau": batch["tau"]})
        loss = routed_loss(logits, targets, self.teacher, ids, self.cfg.distill, parts, self.cfg.distill_top_k)
        loss = windows_loss(loss, batch, lambda x: model(x, dense=True)[0], parts)
        if self.sampler is not None:
            return loss, parts
        return loss + self.cfg.lambda_head * head + self.cfg.lambda_edge * edge, parts

    tokens = staticmethod(step_tokens)

    @torch.no_grad()
    def evaluate(self, model) -> dict[str, float]:
        """Val NLL of the LM dense and under its decoder's hard topologies (and soft for mlp)."""
        with eval_mode(model):
            totals = PositionTotals()
            generator = torch.Generator(device=self.device).manual_seed(self.cfg.train.seed)  # same draws every eval
            for windows, contexts in val_batches(self.cache, self.val_rows, self.cfg.eval_batch_size, self.device):
                ids, targets = windows[:, :-1], windows[:, 1:]
                totals.add(targets.numel(), dense=token_nll(model.dense_logits(ids), targets).sum().item())
                if self.sampler is not None:
                    adjacency, gates = self._executed(self._sample(contexts, ids, generator).to(self.device))
                    hard = execute(model.lm, ids, adjacency, gates, model.skip)
                else:
                    geo = self.geo(ids) if self.geo_used else None
                    if model.stock:
                        soft = model.lm(input_ids=ids).logits
                    else:
                        adjacency, gates = model.route(ids, contexts, geo, tau=self.cfg.tau_end, hard=False)
                        soft = forward_with_topology(model.lm, ids, adjacency, gates, skip=model.skip)
                    totals.add(soft=token_nll(soft, targets).sum().item())
                    hard, gates = model.hard(ids, contexts, geo, self.cfg.tau_end)
                heads = 1.0 if gates is None else running_heads(gates).mean(-1)
                totals.add(hard=token_nll(hard, targets).sum().item(),
                           heads=float(ids.numel()) if gates is None else heads.sum().item())
        metrics = {"dense_nll": totals.mean("dense"), "hard_nll": totals.mean("hard"),
                   "active_head_fraction": totals.mean("heads")}
        if self.sampler is None:
            metrics["soft_nll"] = totals.mean("soft")
        self.last_eval = metrics
        return metrics


    def deployed_router(self, model) -> Router | None:
        """The router as generation runs it (its inputs from the routed model's own states), where it
        can run that way: a head-gate router of 0/1 gates reading the LM (``lm``, ``embedding``)."""
        p = model.predictor
        if (self.sampler is not None or p is None or p.cfg.gate != "head" or p.cfg.edges == "learned"
                or p.cfg.input not in ("lm", "embedding") or p.cfg.weights != "binary" or model.connectivity is not None
                or model.stock):
            return None
        return Router(p, model.lm, self.geo if self.geo_used else None)

    @torch.no_grad()
    def score(self, model, batches: list) -> dict[str, np.ndarray]:
        """Per-position NLLs (P,) of the trained LM on the final val set ``batches``
        (:func:`lookahead.pipeline.phase2.score.final_batches`): dense, and under its decoder's hard
        topologies through the execution plan (the router reading a dense pass's states); where the
        router can run as deployed (:meth:`deployed_router`), ``deployed``: its inputs from the routed
        model's own states, position by position (:func:`lookahead.graph.deployed.self_consistent`);
        and the mean active-head fraction; with ``deployed``, ``deployed_macs``: per position, the
        MACs of the forward its gates ran (:func:`lookahead.graph.cost.gate_macs`; the router not
        included) and ``deployed_macs_over_dense``: their mean plus the router's, over a dense forward's."""
        dense, hard, heads, deployed, macs = [], [], [], [], []
        router = self.deployed_router(model)
        with eval_mode(model):
            generator = torch.Generator(device=self.device).manual_seed(self.cfg.train.seed)
            for windows, contexts in batches:
                ids, targets = windows[:, :-1], windows[:, 1:]
                dense.append(token_nll(model.dense_logits(ids), targets).flatten())
                if self.sampler is not None:
                    adjacency, gates = self._executed(self._sample(contexts, ids, generator).to(self.device))
                    logits = execute(model.lm, ids, adjacency, gates, model.skip)
                else:
                    logits, gates = model.hard(ids, contexts, self.geo(ids) if self.geo_used else None, self.cfg.tau_end)
                hard.append(token_nll(logits, targets).flatten())
                heads.append(ids.new_ones(ids.numel(), dtype=torch.float32) if gates is None
                             else running_heads(gates).mean(-1).flatten())
            if router is not None:
                windows = torch.cat([w for w, _ in batches])
                config = model.lm.config
                for chunk in windows.split(DEPLOYED_WINDOWS):
                    logits, gates = self_consistent(model.lm, router, chunk[:, :-1], model.skip)
                    deployed.append(token_nll(logits, chunk[:, 1:]).flatten())
                    on = gates[..., 1:].reshape(*chunk[:, :-1].shape, config.num_hidden_layers, -1)  # (B, T, L, H)
                    macs.append(gate_macs(config, (on > 0).cpu(), model.skip).flatten())
        out = {"dense": torch.cat(dense).cpu().numpy(), "hard": torch.cat(hard).cpu().numpy(),
               "active_head_fraction": torch.cat(heads).double().mean().item()}
        if deployed:
            out["deployed"] = torch.cat(deployed).cpu().numpy()
            out["deployed_macs"] = torch.cat(macs).numpy()
            length = batches[0][0].shape[1] - 1
            dense_macs = gate_macs(config, torch.ones(1, length, config.num_hidden_layers, config.num_attention_heads),
                                   "query").mean().item()
            out["deployed_macs_over_dense"] = (float(out["deployed_macs"].mean()) + router_macs(model.predictor)) / dense_macs
        return out
