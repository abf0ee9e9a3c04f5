"""What a per-token router could gain, and whether one routes per token (issue: phase 1 that
routes per token).

Oracles choose each position's heads with the dense model's own output as the guide, never the
label: a head's **leave-one-out KL** at t is KL(dense ‖ the model without that head) at t, with
the head removed at every position at once (one forward per head); the oracle keeps each
position's K heads of largest KL. The **greedy** oracle removes heads one at a time, each position
dropping the head whose removal (on top of that position's earlier removals) moves its output the
least; it costs (L·H − K) · L·H forwards of a window, which it stacks along the batch (every
candidate removal of a step in one pass, :func:`greedy_gates`). Dropping each position's r
cheapest heads per step (``per_round``) cuts that to ⌈(L·H − K)/r⌉ · L·H; trying at each step only
each position's c heads of lowest latest cost (``candidates``, a lazy greedy) cuts it to about
L·H + (L·H − K) · c / r: the oracles for graphs of hundreds of heads (benchmarks/greedy_rounds.py
measures their gap to the exact one).

Routing statistics of hard gates (positions, L·H): ``dynamic_fraction`` = (1/N) Σ_h min(p_h,
1 − p_h), p_h the share of positions where head h runs (0 for any static mask, 0.5 at most), and
``gate_entropy_bits``, the mean over layers of the entropy of the layer's on/off pattern across
positions (0 for a static mask, H bits at most).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from lookahead.graph.plan import gated_forward
from lookahead.lm.nll import token_nll


def kl_to_dense(dense_logp: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(dense ‖ q) per position (B, T), q = softmax(logits)."""
    logq = F.log_softmax(logits.float(), -1)
    return (dense_logp.exp() * (dense_logp - logq)).sum(-1)


class DenseKL:
    """KL(dense ‖ q) per position against one dense distribution, for many q: Σ p log p − Σ p z +
    logsumexp z from q's logits z, without materialising log q (the oracles' trial forwards are
    bound by these passes over the vocabulary). :func:`kl_to_dense`'s value to float rounding."""

    def __init__(self, dense_logp: torch.Tensor):
        self.p = dense_logp.exp()  # (B, T, V)
        self.neg_entropy = (self.p * dense_logp).sum(-1)  # (B, T)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (…, B, T, V) → KL (…, B, T)."""
        z = logits.float()
        return self.neg_entropy - (z * self.p).sum(-1) + torch.logsumexp(z, -1)


@torch.no_grad()
def leave_one_out_kl(lm, ids: torch.Tensor, n_layers: int, n_heads: int, skip: str) -> torch.Tensor:
    """KL(dense ‖ without head h) at every position: (B, T, L·H). Each removal runs the head-gate plan
    (:func:`gated_forward`, what ``execute`` runs for these gates) with the head off at every position."""
    kl = DenseKL(F.log_softmax(lm(input_ids=ids).logits.float(), -1))
    n = 1 + n_layers * n_heads
    out = []
    for h in range(n_layers * n_heads):
        gates = torch.ones(n, device=ids.device)
        gates[1 + h] = 0
        out.append(kl(gated_forward(lm, ids, gates, skip).logits))
    return torch.stack(out, -1)


GREEDY_ROWS = 8
"""Sequences per forward of :func:`greedy_gates` (windows × candidate removals, at least one
removal). More is not faster on CPU: the forward under per-position gates and the KL over the
vocabulary are bound by memory (benchmarks/greedy_oracle.py: at one 128-token window per call of
the default base, 177 positions/s with 8 rows, 141 with 32, 126 with 128)."""


def greedy_order(lm, ids: torch.Tensor, n_layers: int, n_heads: int, k: int, skip: str,
                 max_rows: int = GREEDY_ROWS, fixed: Sequence[int] = (), per_round: int = 1,
                 candidates: int = 0) -> torch.Tensor:
    """The greedy label-free oracle's removal order (B, T, L·H) down to k heads per position: the
    rank in which each head was dropped, L·H for the k heads it keeps. Its keep set at any budget
    k' >= k is the heads of order >= L·H − k' (:func:`greedy_keep`). ``fixed``: heads never
    dropped (shared heads), part of the k kept. ``per_round``, ``candidates``: see
    :func:`greedy_targets`."""
    return greedy_targets(lm, ids, n_layers, n_heads, k, skip, max_rows, fixed, per_round, candidates)[0]


@torch.no_grad()
def greedy_targets(lm, ids: torch.Tensor, n_layers: int, n_heads: int, k: int, skip: str,
                   max_rows: int = GREEDY_ROWS, fixed: Sequence[int] = (), per_round: int = 1,
                   candidates: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy oracle's removal order (:func:`greedy_order`) and the cost of its first step,
    which is every head's leave-one-out KL (B, T, L·H) (:func:`leave_one_out_kl`, from batched
    forwards: equal to float rounding).

    Each of its L·H − k steps tries every head's removal at once: the candidate removals are
    stacked along the batch (``max_rows`` sequences per forward), the dense distribution is the one
    pass made first, and each position drops the head still on whose removal moves its output the
    least (the first such head on a tie). ``fixed`` heads (e.g. shared heads that run at every
    token) are never candidates: they stay on, their first-step cost is +inf, and the k kept
    count them.

    ``per_round`` r > 1: each step drops each position's r cheapest heads still on at once, ranked
    in the order of their cost (the last step fewer, to end at k): ⌈(L·H − k)/r⌉ steps in place of
    L·H − k, an approximation of the exact oracle (r = 1).

    ``candidates`` c > 0: a lazy greedy. After the first step (every head's leave-one-out KL), a
    step tries at each position only the c heads still on whose latest measured cost is lowest,
    and drops the r cheapest of those; the others keep their earlier cost. A trial forward j drops
    each position's j-th candidate, so positions drop different heads in one forward (the exact
    oracle's trial drops one head at every position). L·H + (steps − 1) · c trial forwards in place
    of steps · L·H; c = 0 tries every head still on (the exact oracle)."""
    if per_round < 1:
        raise ValueError(f"greedy oracle: per_round must be at least 1, got {per_round}")
    if candidates < 0 or 0 < candidates < per_round:
        raise ValueError(f"greedy oracle: candidates must be 0 (every head) or at least per_round ({per_round}), "
                         f"got {candidates}")
    batch, length = ids.shape
    kl = DenseKL(F.log_softmax(lm(input_ids=ids).logits.float(), -1))  # against (B, T, V)
    total = n_layers * n_heads
    gates = torch.ones(batch, length, 1 + total, device=ids.device)
    order = torch.full((batch, length, total), total, dtype=torch.long, device=ids.device)
    per = max(1, max_rows // batch)  # candidate removals per forward
    droppable = torch.tensor(sorted(set(range(total)) - set(fixed)), dtype=torch.long, device=ids.device)
    if len(droppable) < total - k:
        raise ValueError(f"greedy oracle: {len(fixed)} fixed heads leave {len(droppable)} to drop, "
                         f"fewer than the {total - k} the budget of {k} needs")

    # trial forwards run the head-gate plan directly (what ``execute`` runs for such gates, without
    # building and checking a (rows, T, N, N) adjacency: O(N²) per position, the cost at hundreds of heads)
    def trial_cost(heads: torch.Tensor, cost: torch.Tensor) -> None:
        """Trial c drops, at every position, head heads[c] (C, B, T) on top of ``gates``: each
        trial's KL to dense goes to ``cost`` (B, T, L·H) at the head it dropped."""
        trial = gates.expand(len(heads), -1, -1, -1).clone()  # (C, B, T, N)
        trial.scatter_(-1, 1 + heads[..., None], 0.0)
        logits = gated_forward(lm, ids.repeat(len(heads), 1), trial.reshape(-1, length, 1 + total), skip).logits
        cost.scatter_(-1, heads.permute(1, 2, 0), kl(logits.view(len(heads), batch, length, -1)).permute(1, 2, 0))

    def removal_cost() -> torch.Tensor:  # KL to dense of dropping each head on top of ``gates`` (B, T, L·H)
        cost = torch.full((batch, length, total), math.inf, device=ids.device)
        for start in range(0, len(droppable), per):  # trial c drops the same head at every position
            trial_cost(droppable[start : start + per, None, None].expand(-1, batch, length), cost)
        return cost

    def candidate_cost(known: torch.Tensor, slots: int) -> torch.Tensor:  # the lazy greedy's step
        pick = torch.sort(known, dim=-1, stable=True).indices[..., :slots]  # (B, T, c): lowest known cost first
        cost = torch.full((batch, length, total), math.inf, device=ids.device)
        for start in range(0, slots, per):  # trial c drops each position's c-th candidate
            trial_cost(pick[..., start : start + per].permute(2, 0, 1), cost)
        known.scatter_(-1, pick, cost.gather(-1, pick))
        return cost

    first = removal_cost()  # every head's leave-one-out KL, also when no head is to be dropped (k = L·H)
    known = first.clone()  # the lazy greedy's latest cost of each head (+inf: fixed, or off)
    for rank in range(0, total - k, per_round):
        if rank == 0:
            cost = first.clone()
        elif candidates:
            known[gates[..., 1:] == 0] = math.inf
            cost = candidate_cost(known, min(candidates, len(droppable) - rank))  # the heads still on
        else:
            cost = removal_cost()
        cost[gates[..., 1:] == 0] = math.inf  # a head already off cannot be dropped again
        n = min(per_round, total - k - rank)
        drop = torch.sort(cost, dim=-1, stable=True).indices[..., :n]  # (B, T, n), cheapest first: the first on a tie
        gates.scatter_(-1, 1 + drop, 0.0)
        order.scatter_(-1, drop, torch.arange(rank, rank + n, device=ids.device).expand_as(drop))
    return order, first


def greedy_trials(total: int, k: int, per_round: int = 1, candidates: int = 0) -> int:
    """Trial forwards per window of :func:`greedy_targets` down to k of ``total`` heads (the dense
    pass not counted): every head at each step, or after the first only ``candidates`` per step."""
    steps = math.ceil((total - k) / per_round) if k < total else 0
    if not candidates:
        return max(steps, 1) * total
    return total + sum(min(candidates, total - s * per_round) for s in range(1, steps))

def greedy_keep(order: torch.Tensor, k: int) -> torch.Tensor:
    """Per-position gates (…, N) of the greedy oracle's keep set of k heads from its removal order
    (…, L·H) (:func:`greedy_order`, run down to k heads or fewer); the source on."""
    keep = (order >= order.shape[-1] - k).float()
    return torch.cat([torch.ones_like(keep[..., :1]), keep], -1)


def greedy_gates(lm, ids: torch.Tensor, n_layers: int, n_heads: int, k: int, skip: str,
                 max_rows: int = GREEDY_ROWS, per_round: int = 1, candidates: int = 0) -> torch.Tensor:
    """The greedy label-free oracle's gates (B, T, N) keeping k heads per position (:func:`greedy_order`)."""
    return greedy_keep(greedy_order(lm, ids, n_layers, n_heads, k, skip, max_rows, per_round=per_round,
                                    candidates=candidates), k)


@torch.no_grad()
def gates_nll(lm, windows: torch.Tensor, gates: torch.Tensor, n_layers: int, n_heads: int, skip: str) -> torch.Tensor:
    """Per-position NLL (B, T) of windows (B, T+1) run over per-position head gates (B, T, N)."""
    logits = gated_forward(lm, windows[:, :-1], gates, skip).logits  # execute's plan for 0/1 gates
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
