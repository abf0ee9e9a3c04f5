"""The router keeps up with the LM (``phase2.refresh_every``): every N steps of phase 2, a label-free
oracle of the LM *as it is now* — the greedy one, or the leave-one-out KL's top-K (one forward per
head: about a tenth of the greedy one's cost) — scores a few of the step's windows, and the router
distils its keep sets as phase 1 did (listwise: −(1/K) Σ_{h kept} log softmax(z)_h, over the
routed heads only — the shared ones run anyway and are never dropped by this oracle).

The router learns from the oracle alone: the LM's forward reads its gates without gradient (the
NLL's straight-through gradient hurt in phase 1 and in the co-training experiment), and it has an
optimiser of its own (AdamW, no weight decay) that steps only at a refresh, so the LM's optimiser,
its gradient clipping and its schedule are the ones the controls run. Under several processes each
process scores its own rows and the router's gradient is averaged across them before its step, so
every process keeps the same router.

Before each update the refresh records how much of the fresh oracle's keep set the router's top-K
already keeps (``recall``): how stale the router has gone since the last one.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from lookahead.core.devices import eval_mode
from lookahead.graph.gating import listwise_loss
from lookahead.graph.nodes import keep_count, running_heads, top_k_gates
from lookahead.graph.oracle import GREEDY_ROWS, greedy_keep, greedy_order, leave_one_out_kl
from lookahead.graph.router_inputs import router_context


def routed_listwise(z: torch.Tensor, keep: torch.Tensor, routed: torch.Tensor) -> torch.Tensor:
    """Phase 1's listwise distillation restricted to the ``routed`` heads (L·H,) bool: keep logits z
    (…, L·H), the oracle's keep set ``keep`` (…, L·H) bool; −(1/K_r) Σ_{routed h kept} log softmax(z_routed)_h."""
    logp = F.log_softmax(z[..., routed], -1)
    target = keep[..., routed].to(logp.dtype)
    return listwise_loss(logp, target, target.sum(-1).mean().clamp_min(1.0))


class Refresher:
    """The router's refresh: ``step(lm, predictor, skip, ids, geo)`` distils a fresh greedy oracle of
    ``lm`` on windows ``ids`` into ``predictor`` (in place) and returns its figures."""

    def __init__(self, predictor, lr: float, steps: int, windows: int, oracle: str = "greedy", rows: int = GREEDY_ROWS):
        self.steps, self.windows, self.rows, self.oracle = steps, windows, rows, oracle
        self.optimizer = torch.optim.AdamW(predictor.parameters(), lr=lr, weight_decay=0.0)
        total = predictor.n_layers * predictor.n_heads
        self.k = keep_count(total, predictor.n_layers, predictor.cfg.keep, per_layer=False)
        self.history: list[dict] = []

    def step(self, lm, predictor, skip: str, ids: torch.Tensor, geo_fn) -> dict:
        tic = time.perf_counter()
        ids = ids[: self.windows]
        shared = predictor.cfg.always_on
        with torch.no_grad(), eval_mode(lm):
            if self.oracle == "greedy":
                order = greedy_order(lm, ids, predictor.n_layers, predictor.n_heads, self.k, skip, self.rows, fixed=shared)
                keep = greedy_keep(order, self.k)[..., 1:].bool()  # (B, T, L·H)
            else:  # the K heads of largest leave-one-out KL, the shared ones first
                kl = leave_one_out_kl(lm, ids, predictor.n_layers, predictor.n_heads, skip)
                kl[..., shared] = torch.inf
                keep = top_k_gates(kl, self.k)[..., 1:].bool()
            context = router_context(predictor.cfg.input, lm, ids, None)
        geo = geo_fn(ids) if geo_fn is not None else None
        routed = predictor.always_on == 0
        params = list(predictor.parameters())
        recall = None
        predictor.requires_grad_(True)
        try:
            for i in range(self.steps):
                z = predictor.head_logits(context, geo)
                if i == 0:  # the router as it stood (its hard top-K), against the fresh oracle
                    with torch.no_grad(), eval_mode(predictor):
                        mine = running_heads(predictor.route(context, geo, hard=True)[1]).bool()
                        recall = ((mine & keep & routed).sum() / (keep & routed).sum().clamp_min(1)).item()
                loss = routed_listwise(z, keep, routed)
                grads = torch.autograd.grad(loss, params, allow_unused=True)
                for param, grad in zip(params, grads):
                    if grad is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
                        torch.distributed.all_reduce(grad)
                        grad /= torch.distributed.get_world_size()
                    param.grad = grad
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
        finally:
            predictor.requires_grad_(False)
        out = {"recall": recall, "loss": loss.item(), "seconds": time.perf_counter() - tic}
        self.history.append(out)
        return out

    def report(self) -> dict:
        """Refreshes made, the router's recall of the fresh oracle before each (mean, first, last)
        and the seconds they took."""
        if not self.history:
            return {"refreshes": 0}
        recall = [h["recall"] for h in self.history]
        return {"refreshes": len(self.history), "refresh_recall_mean": sum(recall) / len(recall),
                "refresh_recall_first": recall[0], "refresh_recall_last": recall[-1],
                "refresh_seconds": sum(h["seconds"] for h in self.history)}
