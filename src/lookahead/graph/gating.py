"""Per-token head gates (``predictor.gate: head``): from one keep logit per head and position to
gates in [0, 1], with a budget, and the regularisers of a router (docs/design.md).

Estimators, each a gate whose forward value is what runs and whose backward pass is a soft
surrogate's:

- ``st``: g = 1[z + n > θ] forward, σ((z + n − θ)/τ) backward (straight-through at the soft values);
  θ = 0 without a budget, the midpoint between the K-th and (K+1)-th largest score with one;
- ``hard_concrete`` (Louizos et al. 2018, as Voita et al. 2019 prune heads): a stretched, clamped
  concrete sample in training, whose probability of being non-zero has the closed form
  :func:`l0_penalty`; at evaluation the gate is 1[z > 0] (or the top-K of z).

Budgets (exact per token, so the comparison with static pruning is at exactly the same fraction):
``topk`` keeps the K largest scores of all L·H heads, ``topk_layer`` the K/L largest of each layer,
``topk_layer_static`` the K_l largest of layer l, K_l the count static importance pruning keeps
there (the counts the caller gives: the predictor's ``layer_keep``).
Noise n: logistic (the seed's), or Gumbel (``gumbel``: top-K of z + Gumbel draws samples heads
without replacement in proportion to softmax(z)); both scaled by a temperature annealed by the caller.
"""

from __future__ import annotations

import math

import torch

from lookahead.graph.nodes import keep_count, n_edges, static_gates

GATE_KINDS = ("cascade", "head")
ESTIMATORS = ("st", "hard_concrete")
BUDGETS = ("none", "topk", "topk_layer", "topk_layer_static")
NOISES = ("logistic", "gumbel", "none")


def logistic_noise(shape, device=None, dtype=torch.float32, generator: torch.Generator | None = None) -> torch.Tensor:
    """L = log u − log(1 − u), u ~ U(0, 1): σ(z + L) > 0.5 with probability σ(z)."""
    eps = torch.finfo(dtype).eps
    u = torch.rand(shape, device=device, dtype=dtype, generator=generator).clamp(eps, 1 - eps)
    return torch.log(u) - torch.log1p(-u)


def straight_through(hard: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
    """``hard`` in the forward pass, ``soft``'s gradient in the backward pass."""
    return hard + (soft - soft.detach())


# hard-concrete's stretch (Louizos et al. 2018): s̄ = s (ζ − γ) + γ, clamped to [0, 1]
HC_GAMMA, HC_ZETA, HC_BETA = -0.1, 1.1, 2.0 / 3.0


def gumbel_noise(shape, device=None, dtype=torch.float32, generator: torch.Generator | None = None) -> torch.Tensor:
    """−log(−log u), u ~ U(0, 1)."""
    eps = torch.finfo(dtype).eps
    u = torch.rand(shape, device=device, dtype=dtype, generator=generator).clamp(eps, 1 - eps)
    return -torch.log(-torch.log(u))


def topk_mask(scores: torch.Tensor, k: int | torch.Tensor, n_layers: int, per_layer: bool
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact top-k of scores (…, L·H) per token — of each layer's H when ``per_layer``, k an
    int or a (L,) tensor of per-layer counts — as a 0/1 mask, and the threshold θ (…, 1) or
    (…, L, 1): the midpoint between the k-th and (k+1)-th largest (ties broken by head index, lowest
    first, so the mask always holds exactly k; a layer with k = 0 gets θ above its largest score)."""
    shape = scores.shape
    s = scores.unflatten(-1, (n_layers, -1)) if per_layer else scores
    width = s.shape[-1]
    # a stable descending sort: equal scores keep head order
    order = torch.sort(s.detach(), dim=-1, descending=True, stable=True).indices
    if isinstance(k, torch.Tensor):  # per-layer counts
        counts = k.to(device=s.device, dtype=torch.long)[:, None]  # (L, 1)
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(width, device=s.device).expand_as(order))
        mask = (rank < counts).to(s.dtype)
        ranked = torch.gather(s.detach(), -1, order)  # (…, L, H) descending
        top = torch.gather(ranked, -1, (counts - 1).clamp(min=0).expand(*ranked.shape[:-1], 1))
        below = torch.gather(ranked, -1, counts.clamp(max=width - 1).expand(*ranked.shape[:-1], 1))
        top = torch.where(counts > 0, top, ranked[..., :1] + 2.0)
        below = torch.where(counts < width, below, ranked[..., -1:] - 2.0)
        return mask.reshape(shape), (top + below) / 2
    mask = torch.zeros_like(s).scatter_(-1, order[..., :k], 1.0)
    top = torch.gather(s.detach(), -1, order[..., k - 1 : k])
    below = torch.gather(s.detach(), -1, order[..., k : k + 1]) if k < width else top - 2.0
    theta = (top + below) / 2
    return mask.reshape(shape), theta


def static_layer_counts(importance: torch.Tensor, keep: float) -> torch.Tensor:
    """Heads per layer (L,) that static importance pruning keeps at fraction ``keep`` of the
    importance (L, H): the ``topk_layer_static`` budget's counts."""
    n_layers, n_heads = importance.shape
    kept = static_gates(importance.float(), keep_count(n_layers * n_heads, n_layers, keep, per_layer=False))
    return kept[1:].view(n_layers, n_heads).sum(-1).long()


def head_gates(z: torch.Tensor, n_layers: int, estimator: str, budget: str, keep: float, tau: float,
               noise: torch.Tensor | None, hard: bool, layer_counts: torch.Tensor | None = None) -> torch.Tensor:
    """Gates (…, L·H) from keep logits z (…, L·H): see the module docstring. ``noise`` (…, L·H)
    or None (evaluation: deterministic). A budget always runs its exact top-K (straight-through);
    without one, ``hard`` thresholds at 0 (straight-through) and soft gates are σ(z/τ), or the
    hard-concrete gate (a sample in training, its deterministic value at evaluation)."""
    scores = z if noise is None else z + noise
    if budget != "none":
        per_layer = budget in ("topk_layer", "topk_layer_static")
        k = layer_counts if budget == "topk_layer_static" else keep_count(z.shape[-1], n_layers, keep, per_layer)
        if k is None:
            raise ValueError("budget topk_layer_static needs the per-layer counts (layer_counts)")
        mask, theta = topk_mask(scores, k, n_layers, per_layer)
        centred = (scores.unflatten(-1, (n_layers, -1)) - theta).flatten(-2) if per_layer else scores - theta
    else:
        centred = scores
        mask = (centred > 0).to(z.dtype)
    if estimator == "hard_concrete":
        # a concrete sample in training (the logistic noise is its randomness), σ(z) at evaluation
        soft = (torch.sigmoid(centred / (HC_BETA if noise is not None else 1.0)) * (HC_ZETA - HC_GAMMA) + HC_GAMMA
                ).clamp(0.0, 1.0)
    else:
        soft = torch.sigmoid(centred / tau)
    if budget == "none" and not hard:
        return soft
    return straight_through(mask, soft)


def l0_penalty(z: torch.Tensor) -> torch.Tensor:
    """P(hard-concrete gate ≠ 0) = σ(z − β log(−γ/ζ)), the closed-form expected L0 norm. (…)"""
    return torch.sigmoid(z - HC_BETA * math.log(-HC_GAMMA / HC_ZETA))


def z_loss(z: torch.Tensor) -> torch.Tensor:
    """The router z-loss of MoA / ST-MoE, here for independent keep logits: mean z² (keeps logits
    from saturating, where no gradient reaches the gate any more)."""
    return z.float().pow(2).mean()


def balance_loss(gates: torch.Tensor, keep: float) -> torch.Tensor:
    """Load balance over routed heads: the squared deviation of each head's share of tokens from
    the mean share, normalised by keep (1 − keep). 0 when every head runs equally often; high when
    a few heads run everywhere and others nowhere (a static mask). gates (…, L·H)."""
    share = gates.reshape(-1, gates.shape[-1]).mean(0)
    return (share - share.mean()).pow(2).mean() / max(keep * (1 - keep), 1e-6)


def bound_logits(z: torch.Tensor, bound: float) -> torch.Tensor:
    """c · tanh(z / c) (c = bound); z itself when bound is 0."""
    return z if bound == 0 else bound * torch.tanh(z / bound)


def gate_noise(kind: str, shape, device, dtype, generator: torch.Generator | None, scale: float) -> torch.Tensor | None:
    """Training noise for the keep scores, times ``scale`` (the annealed noise temperature)."""
    if kind == "none" or scale == 0:
        return None
    draw = gumbel_noise if kind == "gumbel" else logistic_noise
    return scale * draw(shape, device, dtype, generator)


def listwise_loss(logp: torch.Tensor, keep: torch.Tensor, kept) -> torch.Tensor:
    """The listwise distillation of a router's keep logits toward an oracle's keep set: −(1/K) Σ_{h kept}
    log p_h, averaged over positions. ``logp`` (…, n): log-softmax of the keep logits over the heads the
    router chooses among; ``keep`` (…, n): the keep set, 0/1 in ``logp``'s dtype; ``kept``: K."""
    return -(keep * logp).sum(-1).mean() / kept


def softmax_weights(gates: torch.Tensor, z: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """MoH's gate weights: head gates (…, L·H) with each kept routed head's gate (kept: > 1/2; routed:
    ``shared`` (L·H,) is 0) times its softmax weight among the kept routed heads' keep logits z
    (…, L·H), divided by the largest such weight (gates stay in [0, 1]: the first routed head runs at
    1, the others at exp(z_h − z_max)); shared and off heads as they were."""
    routed_on = (gates > 0.5) & (shared == 0)
    logits = z.masked_fill(~routed_on, float("-inf"))
    w = torch.exp(logits - logits.amax(-1, keepdim=True)).nan_to_num(0.0)  # softmax / its largest weight
    return torch.where(routed_on, gates * w, gates)


def budget_terms(adjacency: torch.Tensor, gates: torch.Tensor, n_layers: int, n_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The two sparsity terms of phase 1's and phase 2's loss (λ_head and λ_edge weigh them): the
    mean head gate (the embedding node, gate 0, left out) and the mean number of active edges over
    the allowed ones. adjacency (..., N, N), gates (..., N)."""
    head = gates[..., 1:].mean()
    edge = adjacency.sum((-2, -1)).mean() / n_edges(n_layers, n_heads)
    return head, edge
