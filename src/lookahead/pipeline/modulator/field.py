"""The multi-expert geometric field modulator (seed notebook section 12; issue "field modulator"):
the geometry does not add a delta to the residual stream, it *constrains* it multiplicatively.

Three experts, k ∈ {1, 2, 4} (edge, triangle, pentachoron), shared by every modulated layer. Expert k
maps the residual's active dims x to deformations of a frozen regular k-simplex template in ``edim``
dims, vertices = template + deform_scale · (W x + b) (k+1, edim); a Cayley–Menger validator reads
the simplex — its pairwise squared distances and its squared volume, LayerNorm-ed — with a sigmoid
validity read-out, and a gate projection turns the same features into a sigmoid gate over the
active dims. At layer l the active dims become

    x ← x · Π_e [(1 − α_{l,e}) + α_{l,e} · gate_e(x)]

with α_{l,e} = clamp(σ(logit_{l,e}), alpha_min, alpha_max) (logits start at α = 0.01): α = 0 is the
identity, bit for bit. A fraction ``null_fraction`` of the dims (the tail, or a seeded scatter) is
never touched. At d = 512, 6 layers and the section's defaults this is 38 552 parameters, the
notebook's count (tests/test_field_modulator.py).

The modulator stage builds it with ``modulator.kind: field`` (:func:`build_field`); its monitors
are α per layer per expert and, per expert, the validity fraction — the share of tokens whose
deformed simplex has V² > 0 (a simplex of real points never has V² < 0: the fraction can only drop
where the deformation flattens it to V² = 0 in float arithmetic).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lookahead.pipeline.modulator.hooks import modulated_blocks

EXPERTS = (1, 2, 4)  # edge, triangle, pentachoron


def regular_simplex(k: int, edim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Vertices (k+1, edim) of a regular k-simplex with unit edges, centred at 0: the scaled basis
    vectors e_0..e_k / √2 of R^(k+1) (pairwise distance 1), zero-padded to ``edim`` ≥ k+1 dims."""
    if edim < k + 1:
        raise ValueError(f"a {k}-simplex template needs edim >= {k + 1}; got {edim}")
    points = torch.eye(k + 1, dtype=torch.float64) / math.sqrt(2.0)
    points = points - points.mean(0)
    return torch.cat([points, torch.zeros(k + 1, edim - k - 1, dtype=torch.float64)], dim=1).to(dtype)


def squared_distances(points: torch.Tensor) -> torch.Tensor:
    """Pairwise squared distances (..., n, n) of points (..., n, e), exactly 0 on the diagonal."""
    diff = points[..., :, None, :] - points[..., None, :, :]
    return diff.pow(2).sum(-1)


def cayley_menger_volume2(points: torch.Tensor) -> torch.Tensor:
    """Squared volume (...,) of the k-simplex spanned by n = k+1 points (..., n, e), from the
    Cayley–Menger determinant: V² = (−1)^(k+1) / (2^k (k!)²) · det [[0, 1ᵀ], [1, D]], D the squared
    distances. Differentiable; negative for an impossible distance matrix (the validity signal)."""
    n = points.shape[-2]
    k = n - 1
    d2 = squared_distances(points)
    cm = torch.ones(*d2.shape[:-2], n + 1, n + 1, dtype=d2.dtype, device=d2.device)
    cm[..., 0, 0] = 0
    cm[..., 1:, 1:] = d2
    return (-1) ** (k + 1) / (2**k * math.factorial(k) ** 2) * torch.linalg.det(cm)


class KSimplexChannelExpert(nn.Module):
    """One expert: active dims → a deformed k-simplex → validated geometric features → a gate."""

    def __init__(self, k: int, d_active: int, edim: int = 8, deform_scale: float = 0.05):
        super().__init__()
        self.k, self.edim, self.deform_scale = k, edim, deform_scale
        self.register_buffer("template", regular_simplex(k, edim))  # frozen
        self.deform = nn.Linear(d_active, (k + 1) * edim)
        self.pairs = torch.triu_indices(k + 1, k + 1, 1)
        n_features = self.pairs.shape[1] + 1  # upper-triangle squared distances, and V²
        self.norm = nn.LayerNorm(n_features)
        self.validity = nn.Linear(n_features, 1)
        self.gate = nn.Linear(n_features, d_active)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (..., d_active) → (gate (..., d_active) in (0, 1), validity (...,) in (0, 1), V² (...,))."""
        vertices = self.template + self.deform_scale * self.deform(x).unflatten(-1, (self.k + 1, self.edim))
        d2 = squared_distances(vertices)[..., self.pairs[0], self.pairs[1]]
        vol2 = cayley_menger_volume2(vertices)
        features = self.norm(torch.cat([d2, vol2[..., None]], dim=-1))
        return torch.sigmoid(self.gate(features)), torch.sigmoid(self.validity(features))[..., 0], vol2


def active_dims(hidden: int, null_fraction: float, null_mode: str = "tail", seed: int = 0) -> torch.Tensor:
    """Indices of the dims the experts read and gate (sorted); the rest — ``null_fraction`` of them,
    the tail or a seeded scatter — are never touched."""
    n_null = round(null_fraction * hidden)
    if null_mode == "tail":
        return torch.arange(hidden - n_null)
    if null_mode == "scatter":
        null = torch.randperm(hidden, generator=torch.Generator().manual_seed(seed))[:n_null]
        keep = torch.ones(hidden, dtype=torch.bool)
        keep[null] = False
        return keep.nonzero()[:, 0]
    raise ValueError(f"null_mode must be 'tail' or 'scatter'; got {null_mode!r}")


class FieldModulator(nn.Module):
    """The experts, α per layer per expert, and the null space; attached to an OLMo2 LM's blocks
    like the LERP modulator (``modulator(lm, input_ids)`` is the LM's output)."""

    def __init__(self, hidden: int, layers: list[int], experts: tuple[int, ...] = EXPERTS, edim: int = 8,
                 deform_scale: float = 0.05, null_fraction: float = 0.25, null_mode: str = "tail",
                 alpha_init: float = 0.01, alpha_min: float = 0.001, alpha_max: float = 0.35, seed: int = 0):
        super().__init__()
        if not 0 <= alpha_min <= alpha_init <= alpha_max < 1:
            raise ValueError(f"need 0 <= alpha_min <= alpha_init <= alpha_max < 1; got {alpha_min}, {alpha_init}, "
                             f"{alpha_max}")
        self.layers = list(layers)
        self.alpha_min, self.alpha_max = alpha_min, alpha_max
        self.register_buffer("active", active_dims(hidden, null_fraction, null_mode, seed))
        d_active = len(self.active)
        self.experts = nn.ModuleList(KSimplexChannelExpert(k, d_active, edim, deform_scale) for k in experts)
        logit = math.log(alpha_init / (1 - alpha_init)) if alpha_init > 0 else -math.inf
        self.alpha_logit = nn.Parameter(torch.full((len(self.layers), len(experts)), logit))
        self.ks = tuple(experts)
        self.last_validity = torch.zeros(len(self.layers), len(experts))  # share of V² > 0 in the last forward

    def alphas(self) -> torch.Tensor:
        """α (n_layers, n_experts), clamped to [alpha_min, alpha_max]."""
        return torch.sigmoid(self.alpha_logit).clamp(self.alpha_min, self.alpha_max)

    def modulate(self, h: torch.Tensor, layer: int) -> torch.Tensor:
        """The residual h (..., hidden) entering the ``layer``-th modulated block, constrained; the
        null dims are copied through untouched."""
        x = h[..., self.active]
        alphas = self.alphas()[layer].to(x.dtype)  # (n_experts,)
        factor = torch.ones_like(x)
        for e, expert in enumerate(self.experts):
            gate, _, vol2 = expert(x)
            factor = factor * ((1 - alphas[e]) + alphas[e] * gate)
            self.last_validity[layer, e] = (vol2.detach() > 0).float().mean().cpu()
        return h.index_copy(-1, self.active, x * factor)

    def attached(self, lm):
        """Within the block, ``lm``'s blocks in ``layers`` see the modulated stream."""
        return modulated_blocks(lm, self.layers, self.modulate)

    def monitor(self) -> dict[str, float]:
        """α per layer per expert (``alpha_l<layer>_k<k>``) and the validity fraction per expert
        over the layers of the last forward (``validity_k<k>``)."""
        alphas = self.alphas().detach().cpu()
        out = {f"alpha_l{layer}_k{k}": float(alphas[i, e]) for i, layer in enumerate(self.layers)
               for e, k in enumerate(self.ks)}
        return out | {f"validity_k{k}": float(self.last_validity[:, e].mean()) for e, k in enumerate(self.ks)}

    @torch.no_grad()
    def health(self) -> dict[str, dict[str, float]]:
        """Read from the weights, per expert: the norms of its deformation map and gate projection,
        the mean gate bias (σ of it: the gate of a zero feature vector), and its α over layers."""
        alphas = self.alphas().detach().cpu()
        return {f"k{k}": {"deform_weight_norm": float(expert.deform.weight.norm()),
                          "gate_weight_norm": float(expert.gate.weight.norm()),
                          "gate_at_zero_features": float(torch.sigmoid(expert.gate.bias).mean()),
                          "alpha_mean": float(alphas[:, e].mean()), "alpha_max": float(alphas[:, e].max())}
                for e, (k, expert) in enumerate(zip(self.ks, self.experts))}

    def forward(self, lm, input_ids: torch.Tensor, **kwargs):
        with self.attached(lm):
            return lm(input_ids=input_ids, **kwargs)


def build_field(cfg, hidden: int, layers: list[int]) -> FieldModulator:
    """The field modulator of a :class:`~lookahead.pipeline.modulator.config.ModulatorConfig` with
    ``kind: field`` for a model of width ``hidden``; α logits frozen when ``alpha_mode`` is fixed."""
    f = cfg.field
    modulator = FieldModulator(hidden, layers, tuple(f.experts), f.edim, f.deform_scale, f.null_fraction, f.null_mode,
                               cfg.alpha_init, f.alpha_min, f.alpha_max, seed=cfg.train.seed)
    modulator.alpha_logit.requires_grad_(cfg.alpha_mode == "learned")
    return modulator
