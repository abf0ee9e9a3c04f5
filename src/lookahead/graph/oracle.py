"""What a per-token router could gain, and whether one routes per token (issue: phase 1 that
routes per token).

Oracles choose each position's heads with the dense model's own output as the guide, never the
label: a head's **leave-one-out KL** at t is KL(dense ‖ the model without that head) at t, with
the head removed at every position at once (one forward per head); the oracle keeps each
position's K heads of largest KL. The **greedy** oracle removes heads one at a time, each position
dropping the head whose removal (on top of that position's earlier removals) moves its output the
least; it costs (L·H − K) · L·H forwards.

Routing statistics of hard gates (positions, L·H): ``dynamic_fraction`` = (1/N) Σ_h min(p_h,
1 − p_h), p_h the share of positions where head h runs (0 for any static mask, 0.5 at most), and
``gate_entropy_bits``, the mean over layers of the entropy of the layer's on/off pattern across
positions (0 for a static mask, H bits at most).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from lookahead.graph.nodes import head_graph
from lookahead.graph.runtime import forward_with_topology
from lookahead.lm.nll import token_nll


def _kl(dense_logp: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(dense ‖ q) per position (B, T)."""
    logq = F.log_softmax(logits.float(), -1)
    return (dense_logp.exp() * (dense_logp - logq)).sum(-1)


@torch.no_grad()
def leave_one_out_kl(lm, ids: torch.Tensor, n_layers: int, n_heads: int, skip: str) -> torch.Tensor:
    """KL(dense ‖ without head h) at every position: (B, T, L·H)."""
    dense_logp = F.log_softmax(lm(input_ids=ids).logits.float(), -1)
    n = 1 + n_layers * n_heads
    out = []
    for h in range(n_layers * n_heads):
        gates = torch.ones(n, device=ids.device)
        gates[1 + h] = 0
        logits = forward_with_topology(lm, ids, head_graph(gates, n_layers, n_heads), gates, hard=True, skip=skip)
        out.append(_kl(dense_logp, logits))
    return torch.stack(out, -1)


def top_k_gates(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Per-position gates (…, N) keeping the k heads of largest score (…, L·H); the source on."""
    keep = torch.zeros_like(scores).scatter_(-1, torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k], 1.0)
    return torch.cat([torch.ones_like(keep[..., :1]), keep], -1)


@torch.no_grad()
def greedy_gates(lm, ids: torch.Tensor, n_layers: int, n_heads: int, k: int, skip: str) -> torch.Tensor:
    """The greedy label-free oracle's gates (B, T, N) keeping k heads per position."""
    dense_logp = F.log_softmax(lm(input_ids=ids).logits.float(), -1)
    total = n_layers * n_heads
    gates = torch.ones(*ids.shape, 1 + total, device=ids.device)
    for _ in range(total - k):
        cost = torch.full((*ids.shape, total), math.inf, device=ids.device)
        for h in range(total):
            trial = gates.clone()
            trial[..., 1 + h] = 0
            logits = forward_with_topology(lm, ids, head_graph(trial, n_layers, n_heads), trial, hard=True, skip=skip)
            on = gates[..., 1 + h] > 0
            cost[..., h] = torch.where(on, _kl(dense_logp, logits), cost[..., h])
        drop = cost.argmin(-1)  # (B, T)
        gates.scatter_(-1, 1 + drop[..., None], 0.0)
    return gates


@torch.no_grad()
def gates_nll(lm, windows: torch.Tensor, gates: torch.Tensor, n_layers: int, n_heads: int, skip: str) -> torch.Tensor:
    """Per-position NLL (B, T) of windows (B, T+1) run over per-position head gates (B, T, N)."""
    ids = windows[:, :-1]
    logits = forward_with_topology(lm, ids, head_graph(gates, n_layers, n_heads), gates, hard=True, skip=skip)
    return token_nll(logits, windows[:, 1:])


def routing_stats(on: torch.Tensor, n_layers: int) -> dict[str, float]:
    """``dynamic_fraction`` and ``gate_entropy_bits`` of hard head gates ``on`` (positions, L·H)."""
    on = on.reshape(-1, on.shape[-1]).bool()
    share = on.float().mean(0)
    dynamic = torch.minimum(share, 1 - share).mean().item()
    entropies = []
    for layer in on.view(on.shape[0], n_layers, -1).unbind(1):  # (positions, H)
        codes = (layer.long() << torch.arange(layer.shape[-1], device=layer.device)).sum(-1)
        p = torch.bincount(codes).float()
        p = p[p > 0] / on.shape[0]
        entropies.append(float(-(p * p.log2()).sum()))
    return {"dynamic_fraction": dynamic, "gate_entropy_bits": sum(entropies) / len(entropies)}
