"""Routers as deployed: a head-gate router and what it reads (:class:`Router`), and windows routed
position by position the way generation routes them (:func:`self_consistent`; :func:`layer_routed`
for per-layer routers). The pipeline's stages evaluate routers with these; generation
(:mod:`lookahead.graph.generate`) runs them.
"""

from __future__ import annotations

import torch

from lookahead.core.errors import LookaheadError
from lookahead.graph.plan import KVCache, gated_forward
from lookahead.graph.router_inputs import lm_input, lm_states
from lookahead.graph.runtime import check_model


class GenerateError(LookaheadError, ValueError):
    """Settings or inputs generation cannot run with."""


class Router:
    """A head-gate structure predictor and what it reads: its gates (B, T, N) for positions whose
    token embeddings and previous hidden states are given."""

    def __init__(self, predictor, lm, geo=None):
        if predictor.cfg.gate != "head" or predictor.cfg.edges == "learned":
            raise GenerateError("generation runs head-gate routers (predictor.gate: head, edges among active heads); "
                                f"this one has gate {predictor.cfg.gate!r}, edges {predictor.cfg.edges!r}")
        if predictor.cfg.input not in ("lm", "embedding"):
            raise GenerateError(f"generation needs a router that reads the LM (predictor.input: lm or embedding); "
                                f"this one reads {predictor.cfg.input!r}")
        if predictor.geo_dim and geo is None:
            raise GenerateError("this router reads the init stage's geometric features: pass its file (--init)")
        self.predictor, self.lm, self.geo = predictor, lm, geo

    def features(self, ids: torch.Tensor, previous: torch.Tensor | None) -> torch.Tensor:
        """Router inputs for positions ``ids`` (B, T), given the final hidden states (B, T, d) of the
        positions before them (None: a dense pass over ``ids``, which must start the sequence)."""
        if previous is None:
            return lm_states(self.lm, ids, self.predictor.cfg.input)
        emb = self.lm.model.embed_tokens(ids).float()
        return emb if self.predictor.cfg.input == "embedding" else lm_input(emb, previous)

    @torch.no_grad()
    def gates(self, ids: torch.Tensor, previous: torch.Tensor | None = None) -> torch.Tensor:
        geo = self.geo(ids) if self.predictor.geo_dim else None
        return self.predictor(self.features(ids, previous), geo, hard=True)[1]


@torch.no_grad()
def self_consistent(lm, router: Router, ids: torch.Tensor, skip: str = "query") -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (B, T, V) and gates (B, T, N) of windows ``ids`` (B, T) routed as deployed: position
    by position through the KV cache, the router at t reading the final hidden state of the routed
    forward that ran at t − 1 (zeros at t = 0), not a dense pass's. Teacher-forced (the next input
    is the window's token), so its NLL is what generation's routed model assigns the window; for
    an ``embedding`` router, the same gates as :meth:`Router.gates` over the whole window."""
    check_model(lm)
    batch, length = ids.shape
    cache = KVCache(lm, batch, length, skip)
    previous = torch.zeros(batch, 1, lm.config.hidden_size, device=ids.device)
    logits, gates = [], []
    for t in range(length):
        step = router.gates(ids[:, t : t + 1], previous)
        out = gated_forward(lm, ids[:, t : t + 1], step, skip, cache)
        previous = out.hidden
        logits.append(out.logits)
        gates.append(step)
    return torch.cat(logits, 1), torch.cat(gates, 1)


@torch.no_grad()
def layer_routed(lm, predictor, ids: torch.Tensor, geo: torch.Tensor | None = None, skip: str = "query"
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (B, T, V) and gates (B, T, N) of windows ``ids`` (B, T) under a ``predictor.input:
    layer`` router as deployed: each layer's heads chosen from the residual stream that enters that
    layer in the *routed* forward. Layer l's input depends only on the gates of the layers before
    it, so starting from the dense streams each routed forward fixes one more layer: after L of
    them the gates are the fixed point — every layer's from its own routed input — and the last
    forward ran under them. (A deployment decides inside one forward; this evaluates the same
    function with whole-layer passes, in parallel over positions.)"""
    check_model(lm)
    context = lm_states(lm, ids, "layer")
    for _ in range(predictor.n_layers):
        gates = predictor(context, geo, hard=True)[1]
        out = gated_forward(lm, ids, gates, skip, layer_inputs=True)
        context = out.layer_inputs.float()
    return out.logits, gates
