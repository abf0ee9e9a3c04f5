"""Scoring head graphs with a frozen LM (phase 1, pairs, evaluation): per-position NLL, the
init stage's geometric features of each token, and the two baselines every comparison is made at
the same active-head fraction against — static pruning of the least important heads (the probe's
importance, Michel et al. 2019) and random per-position heads."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from lookahead.graph.nodes import baseline_graph, random_topology, static_gates
from lookahead.graph.plan import execute
from lookahead.lm.nll import token_nll


def geo_features(input_ids: torch.Tensor, geo_table: torch.Tensor, geo_mask: torch.Tensor) -> torch.Tensor:
    """The init stage's geometric embedding of each token and a matched flag (zeros for tokens
    without a WordNet match). (B, T) → (B, T, n_geo + 1); depends on the token at t only."""
    return torch.cat([geo_table[input_ids], geo_mask[input_ids, None]], dim=-1)


@dataclasses.dataclass
class GeoLookup:
    """The init stage's geometric table: features of the token at each position (docs/design.md: f_t)."""

    table: torch.Tensor  # (V, n_geo)
    mask: torch.Tensor  # (V,)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return geo_features(ids, self.table, self.mask)

    def to(self, device) -> GeoLookup:
        return GeoLookup(self.table.to(device), self.mask.to(device))


def static_token_nll(lm, windows: torch.Tensor, importance: torch.Tensor, k: int, skip: str = "full") -> torch.Tensor:
    """Per-position NLL (B, T) of ``windows`` (B, T + 1) with only the LM's ``k`` most important heads
    (probe importance, (L, H)): one topology for every position, the baseline graph among the heads kept."""
    n_layers, n_heads = importance.shape
    gates = static_gates(importance, k)
    adjacency = baseline_graph(gates, n_layers, n_heads, skip)
    ids = windows[:, :-1]
    return token_nll(execute(lm, ids, adjacency.to(ids.device), gates.to(ids.device), skip), windows[:, 1:])


def static_pruning_curve(lm, batches: list[torch.Tensor], importance: torch.Tensor, skip: str = "full") -> list[dict]:
    """NLL of the LM with only its k most important heads (probe importance, (L, H)), for every
    k = 0 … L·H: a shared topology, the baseline graph among the heads kept
    (:func:`lookahead.graph.nodes.baseline_graph`). Rows of k, fraction, nll."""
    n_layers, n_heads = importance.shape
    rows = []
    for k in range(n_layers * n_heads + 1):
        total, count = 0.0, 0
        for windows in batches:
            nll = static_token_nll(lm, windows, importance, k, skip)
            total, count = total + nll.sum().item(), count + nll.numel()
        rows.append({"heads_kept": k, "active_head_fraction": k / (n_layers * n_heads), "nll": total / count})
    return rows


def interpolate_curve(curve: list[dict], fraction: float) -> float:
    """NLL at an active-head fraction, linear between the nearest whole-head counts."""
    x = fraction * (len(curve) - 1)
    lo = min(int(math.floor(x)), len(curve) - 2)
    w = x - lo
    return (1 - w) * curve[lo]["nll"] + w * curve[lo + 1]["nll"]


def random_heads_nll(lm, batches: list[torch.Tensor], fraction: float, n_layers: int, n_heads: int,
                     draws: int, seed: int, skip: str = "full") -> float:
    """Mean NLL over ``draws`` draws of random per-position heads, exactly round(fraction · L·H) at
    each position (:func:`random_heads_scores`)."""
    return float(random_heads_scores(lm, batches, fraction, n_layers, n_heads, draws, seed, skip).mean())


def random_heads_scores(lm, batches: list[torch.Tensor], fraction: float, n_layers: int, n_heads: int,
                        draws: int, seed: int, skip: str = "full") -> np.ndarray:
    """Per-position NLL (P,), the mean over ``draws`` draws of random per-position heads: exactly
    round(fraction · L·H) heads at each position, a uniform choice
    (:func:`lookahead.graph.nodes.random_topology` with ``exact``)."""
    results = []
    for draw in range(draws):
        gen = torch.Generator().manual_seed(seed * 1000 + draw)
        per_batch = []
        for windows in batches:
            ids = windows[:, :-1]
            adjacency, gates = (x.to(ids.device) for x in random_topology(n_layers, n_heads, fraction,
                                                                           tuple(ids.shape), gen, skip, exact=True))
            per_batch.append(token_nll(execute(lm, ids, adjacency, gates, skip), windows[:, 1:]).flatten().double().cpu())
        results.append(torch.cat(per_batch).numpy())
    return np.mean(results, axis=0)


def shuffled(inputs: list[tuple[torch.Tensor, torch.Tensor | None]], seed: int) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Router inputs, batch by batch ``(context (B, T, F), geo (B, T, G) or None)``, permuted across all
    their positions (a fixed draw of ``seed``) and returned in the same shapes: the context shuffle."""
    context = torch.cat([c.reshape(-1, c.shape[-1]) for c, _ in inputs])
    perm = torch.randperm(len(context), generator=torch.Generator().manual_seed(seed)).to(context.device)
    geo = None if inputs[0][1] is None else torch.cat([g.reshape(-1, g.shape[-1]) for _, g in inputs])[perm]
    context, start, out = context[perm], 0, []
    for c, _ in inputs:
        size = c.shape[0] * c.shape[1]
        out.append((context[start : start + size].view(c.shape),
                    None if geo is None else geo[start : start + size].view(*c.shape[:2], -1)))
        start += size
    return out


def capture(static: float, router: float, oracle: float | None) -> float | None:
    """(NLL_static − NLL_router) / (NLL_static − NLL_oracle): the share of the oracle's gain over
    static pruning the router gets (None without an oracle or when the oracle gains nothing)."""
    if oracle is None or static - oracle <= 0:
        return None
    return (static - router) / (static - oracle)
