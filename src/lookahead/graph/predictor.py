"""The lookahead structure predictor and its cascading gate (docs/design.md).

Per position t, from the context alone:

    f_t = [e_t ; geometric features]  →  MLP  →  U_t, V_t  (N × r)
    Z_t = U_t V_tᵀ + B                        B: learned static logits, from U0 V0ᵀ + init_bias
    A_raw = M ⊙ σ((Z_t + L) / τ)              L logistic noise in training, none in eval
    hard: A_raw = 1[Z_t + L > 0], g = 1[s > 0]   straight-through to the soft cascade in training

then :func:`cascade` turns A_raw into the executed graph (A, g) in layer order. ``e_t`` comes from a
causal context encoder (docs/pipeline.md) and the geometric features from the init stage's table for the
token at t, so the predictor — a per-position function — never sees tokens after t.

The V half of the MLP's output layer starts at zero, so Z_t = B at initialisation (near the dense
graph: σ(init_bias) on every allowed edge) while U and V still receive gradients.

``gate: head`` replaces the cascade with one keep logit per head and position, z_t = W h_t + b
(b starts at the probe's head importance, so under a budget the untrained router is static
importance pruning; W starts at zero), turned into gates by :mod:`lookahead.graph.gating` (an
exact per-token top-K or a threshold, straight-through or hard-concrete), and every allowed edge
out of an active head (each head reads the standard stream). ``input`` chooses what f_t holds:
the context cache's encoding, or the LM's own states before t (:mod:`lookahead.graph.router_inputs`),
each block brought to unit RMS.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from lookahead.core.errors import LookaheadError, require
from lookahead.core.inputs import read_safetensors
from lookahead.graph.gating import (BUDGETS, ESTIMATORS, GATE_KINDS, NOISES, bound_logits, gate_noise, head_gates,
                                    logistic_noise, softmax_weights, static_layer_counts, straight_through)
from lookahead.graph.nodes import allowed_mask, keep_count, n_nodes

INPUTS = ("cache", "lm", "embedding", "layer")
WEIGHTS = ("binary", "softmax")
ALWAYS_ON_LOGIT = 1e4  # added to a shared head's keep logit: above any other head's score
EDGES = ("all", "learned")


class PredictorError(LookaheadError, ValueError):
    """Inputs that do not fit the predictor."""


@dataclasses.dataclass
class PredictorConfig:
    """The lookahead structure predictor (docs/design.md)."""

    rank: int = 8
    """Rank r of the per-token node factors U, V (N × r)."""
    hidden: int = 256
    """Width of the MLP from context features to U, V."""
    geo_features: bool = True
    """Append the init stage's geometric embedding of the token (and a matched flag) to the context."""
    tau: float = 1.0
    """Temperature τ of the edge sigmoid (phase 1 anneals it)."""
    gate_k: float = 2.0
    """Sharpness k of the head gate g = 1 − exp(−k·s), s = gated incoming weight."""
    init_bias: float = 3.0
    """Added to U0 V0ᵀ in the static logits B: every edge starts at about σ(init_bias)."""
    hard: bool = False
    """Threshold edges and gates (straight-through gradients in training) instead of soft values."""
    gate: str = "head"
    """cascade: heads gated by their incoming edge weight (the seed's); head: one keep logit per head
    and position, read from the router (``lookahead.graph.gating``)."""
    edges: str = "all"
    """Head gates: all = every allowed edge out of an active head (each head reads the standard
    stream, the graph static pruning runs); learned = the low-rank edge logits as well."""
    estimator: str = "st"
    """Head gates: st (sigmoid straight-through at soft values) or hard_concrete (Louizos et al. 2018)."""
    budget: str = "topk"
    """Head gates: none (a penalty sets the fraction), topk (exact per-token top-K of all heads) or
    topk_layer (the top K/L of each layer's heads) or topk_layer_static (the top K_l of layer l, K_l
    the heads static importance pruning keeps there: its per-layer shape, routed within layers)."""
    keep: float = 0.5
    """Head gates under a budget: fraction of heads kept per token."""
    noise: str = "none"
    """Head gates' training noise on the keep scores: logistic, gumbel (top-K of z + Gumbel draws
    samples heads without replacement) or none; phase 1 anneals its scale."""
    logit_bound: float = 0.0
    """Head gates: keep logits bounded to c·tanh(z/c), c = logit_bound (0 = unbounded)."""
    input: str = "lm"
    """Router input: cache (the context cache's encoder), lm (the frozen base LM's token embedding at
    t and final hidden state at t−1), embedding (the token embedding at t alone) or layer (one router
    per layer reading the residual stream entering that layer at t: head gates, a per-layer budget
    or none)."""
    always_on: list[int] = dataclasses.field(default_factory=list)
    """Head gates under a budget: heads (0 … L·H − 1, layer-major) that run at every token (MoH's shared
    heads); the router picks the rest of the budget among the others (phase2.shared_heads sets them)."""
    weights: str = "binary"
    """Head gates under a budget: ``binary`` (a kept head's gate is 1) or ``softmax`` (MoH's gate-weighted
    heads: a kept routed head's gate is its softmax weight among the kept routed heads' keep logits, over
    the largest such weight; shared heads 1; phase2.gate_weights sets it)."""

    @classmethod
    def cascade(cls, **changes) -> PredictorConfig:
        """The seed's predictor: cascade gates over the context cache's contexts, logistic noise."""
        return cls(**{"gate": "cascade", "budget": "none", "noise": "logistic", "input": "cache", **changes})

    def __post_init__(self) -> None:
        require(self.gate in GATE_KINDS, "gate", f"must be one of {', '.join(GATE_KINDS)}; got {self.gate!r}")
        require(self.edges in EDGES, "edges", f"must be one of {', '.join(EDGES)}; got {self.edges!r}")
        require(self.estimator in ESTIMATORS, "estimator", f"must be one of {', '.join(ESTIMATORS)}; got {self.estimator!r}")
        require(self.budget in BUDGETS, "budget", f"must be one of {', '.join(BUDGETS)}; got {self.budget!r}")
        require(self.noise in NOISES, "noise", f"must be one of {', '.join(NOISES)}; got {self.noise!r}")
        require(self.input in INPUTS, "input", f"must be one of {', '.join(INPUTS)}; got {self.input!r}")
        require(0 < self.keep <= 1, "keep", f"must be in (0, 1]; got {self.keep}")
        require(math.isfinite(self.logit_bound) and self.logit_bound >= 0, "logit_bound",
                f"must be a finite number >= 0 (0 = unbounded); got {self.logit_bound}")
        require(not self.always_on or (self.gate == "head" and self.budget != "none"), "always_on",
                "needs predictor.gate: head with a budget (the router fills the rest of it)")
        require(len(set(self.always_on)) == len(self.always_on) and all(h >= 0 for h in self.always_on), "always_on",
                f"must be distinct head indices >= 0; got {self.always_on}")
        require(self.gate == "head" or self.budget == "none", "budget",
                f"needs predictor.gate: head (the cascade gates heads by their edges); got {self.budget!r}")
        require(self.input != "layer" or (self.gate == "head" and self.edges == "all"
                                          and self.budget in ("topk_layer", "topk_layer_static", "none")), "input",
                "layer decides each layer's heads from that layer's input, inside the forward: it needs "
                "predictor.gate: head, edges: all and budget: topk_layer, topk_layer_static or none (a budget over all layers "
                f"would need later layers' inputs); got gate {self.gate!r}, edges {self.edges!r}, budget {self.budget!r}")
        require(self.weights in WEIGHTS, "weights", f"must be one of {', '.join(WEIGHTS)}; got {self.weights!r}")
        require(self.weights == "binary" or (self.gate == "head" and self.budget != "none"), "weights",
                "softmax gate weights need predictor.gate: head with a budget")
        require(self.rank >= 1, "rank", f"must be >= 1; got {self.rank}")
        require(self.hidden >= 1, "hidden", f"must be >= 1; got {self.hidden}")
        require(self.tau > 0, "tau", f"must be > 0; got {self.tau}")
        require(self.gate_k > 0, "gate_k", f"must be > 0; got {self.gate_k}")
        require(math.isfinite(self.init_bias), "init_bias", f"must be finite; got {self.init_bias}")


def cascade(a_raw: torch.Tensor, n_layers: int, n_heads: int, k: float = 4.0,
            hard: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Gate heads in layer order: g_0 = 1, s_j = Σ_i g_i A_raw[i, j], g_j = 1 − exp(−k s_j),
    A[i, j] = g_i A_raw[i, j].

    The gate is exactly 0 when a head receives no gated weight (σ(k s), the seed's gate, is ≥ 0.5 for
    every s ≥ 0 and never closes), and a closed head closes its outgoing edges in turn.

    ``hard``: edges are thresholded (A_raw > 1/2, i.e. a positive logit) and g = 1[s > 0], with
    straight-through gradients **evaluated at the soft values**: the backward pass is that of the
    soft cascade of the soft A_raw, so a head that is off (g = 0, s = 0) still learns how its
    incoming logits would change the loss. (The surrogate at the hard counts, k·e^(−k·s) at integer
    s, vanishes: about 2.5e-5 at s = 3 for k = 4, and would freeze the topology.)

    Args:
        a_raw: (…, N, N) soft edge weights in [0, 1], zero outside the allowed mask.
    Returns:
        A (…, N, N) and g (…, N).
    """
    n = n_nodes(n_layers, n_heads)
    if a_raw.shape[-2:] != (n, n):
        raise PredictorError(f"a_raw must end in ({n}, {n}) for {n_layers} layers x {n_heads} heads; "
                             f"got {tuple(a_raw.shape)}")
    g_soft = _gates(a_raw, n_layers, n_heads, k, binary=False)
    if not hard:
        return g_soft[..., :, None] * a_raw, g_soft
    bits = (a_raw > 0.5).to(a_raw.dtype)
    g = straight_through(_gates(bits, n_layers, n_heads, k, binary=True), g_soft)
    return g[..., :, None] * straight_through(bits, a_raw), g


def _gates(a: torch.Tensor, n_layers: int, n_heads: int, k: float, binary: bool) -> torch.Tensor:
    """Head gates (…, N) of edge weights a (…, N, N), layer by layer: 1 − exp(−k s), or 1[s > 0]."""
    gates = [torch.ones(*a.shape[:-2], 1, dtype=a.dtype, device=a.device)]  # g_0 = 1
    for layer in range(n_layers):
        first = 1 + layer * n_heads
        g_src = torch.cat(gates, dim=-1)  # (…, first): the source and every earlier head
        s = torch.einsum("...i,...ij->...j", g_src, a[..., :first, first:first + n_heads])  # (…, H)
        gates.append((s > 0).to(a.dtype) if binary else -torch.expm1(-k * s))  # 1 − exp(−k s), exact near 0
    return torch.cat(gates, dim=-1)


class StructurePredictor(nn.Module):
    """Context features (…, F) → edge logits Z (…, N, N); :meth:`forward` returns (A, g)."""

    def __init__(self, cfg: PredictorConfig, n_layers: int, n_heads: int, context_dim: int, geo_dim: int = 0,
                 u0: torch.Tensor | None = None, v0: torch.Tensor | None = None):
        super().__init__()
        self.cfg = cfg
        self.n_layers, self.n_heads = n_layers, n_heads
        self.context_dim, self.geo_dim = context_dim, geo_dim
        n = n_nodes(n_layers, n_heads)
        self.register_buffer("mask", allowed_mask(n_layers, n_heads), persistent=False)
        if cfg.input == "layer":  # a router per layer: its input (d) and the geometric features → hidden
            if context_dim % n_layers:
                raise PredictorError(f"input layer: {context_dim}-dim contexts do not split over {n_layers} layers")
            width = context_dim // n_layers + geo_dim
            bound = 1 / math.sqrt(width)  # nn.Linear's initialisation, per layer
            self.layer_in = nn.Parameter(torch.empty(n_layers, width, cfg.hidden).uniform_(-bound, bound))
            self.layer_in_bias = nn.Parameter(torch.empty(n_layers, cfg.hidden).uniform_(-bound, bound))
            self.layer_out = nn.Parameter(torch.zeros(n_layers, cfg.hidden, n_heads))  # W starts at zero
        else:
            self.mlp = nn.Sequential(nn.Linear(context_dim + geo_dim, cfg.hidden), nn.GELU())
        self.to_u = nn.Linear(cfg.hidden, n * cfg.rank)
        self.to_v = nn.Linear(cfg.hidden, n * cfg.rank)
        nn.init.zeros_(self.to_v.weight)  # Z = B at the start; U still moves V through the gradient
        nn.init.zeros_(self.to_v.bias)
        static = torch.full((n, n), float(cfg.init_bias))
        if (u0 is None) != (v0 is None):
            raise PredictorError("give both U0 and V0 or neither")
        if u0 is not None:
            if u0.shape != (n, cfg.rank) or v0.shape != (n, cfg.rank):
                raise PredictorError(f"U0, V0 must be ({n}, {cfg.rank}) (nodes x predictor.rank); got "
                                     f"{tuple(u0.shape)}, {tuple(v0.shape)}: rerun the init stage with this rank")
            static = static + u0.float() @ v0.float().T
        self.static = nn.Parameter(static)  # B (N, N)
        self.noise_scale = 1.0  # the head gates' training noise temperature (phase 1 anneals it)
        self.register_buffer("always_on", torch.zeros(n_layers * n_heads), persistent=False)  # (L·H,) shared heads
        if cfg.budget == "topk_layer_static":  # heads kept per layer (set from the importance: init_head_bias)
            per = keep_count(n_layers * n_heads, n_layers, cfg.keep, per_layer=True)
            self.register_buffer("layer_keep", torch.full((n_layers,), per, dtype=torch.long))
        self.set_always_on(cfg.always_on)
        if cfg.gate == "head" and cfg.input != "layer":  # keep logits z = W h + b; b starts at init_bias (or static importance)
            self.to_gate = nn.Linear(cfg.hidden, n_layers * n_heads)
            nn.init.zeros_(self.to_gate.weight)
            nn.init.zeros_(self.to_gate.bias)
        if cfg.gate == "head":
            self.head_bias = nn.Parameter(torch.full((n_layers * n_heads,), float(cfg.init_bias)))

    def init_head_bias(self, importance: torch.Tensor) -> None:
        """Start the keep logits at the probe's head importance (L, H), standardised and shifted by
        init_bias: under a budget the untrained router runs exactly static importance pruning."""
        flat = importance.flatten().float()
        with torch.no_grad():
            self.head_bias.copy_((flat - flat.mean()) / flat.std().clamp_min(1e-12) + self.cfg.init_bias)
            if self.cfg.budget == "topk_layer_static":
                self.layer_keep.copy_(static_layer_counts(importance, self.cfg.keep))

    def set_always_on(self, heads: list[int]) -> None:
        """Make ``heads`` (0 … L·H − 1) the shared heads that run at every token (``cfg.always_on``)."""
        heads = sorted(int(h) for h in heads)
        n = self.n_layers * self.n_heads
        per_layer = self.cfg.budget == "topk_layer"
        budget = keep_count(n, self.n_layers, self.cfg.keep, per_layer) * (self.n_layers if per_layer else 1)
        if heads and (self.cfg.gate != "head" or self.cfg.budget == "none"):
            raise PredictorError("shared heads need predictor.gate: head with a budget (the router fills the rest)")
        if any(h >= n for h in heads) or len(heads) > budget:
            raise PredictorError(f"shared heads {heads}: need indices < {n} and at most the budget's {budget} heads")
        self.cfg = dataclasses.replace(self.cfg, always_on=heads)
        self.always_on.zero_()
        self.always_on[heads] = 1.0

    @classmethod
    def from_init(cls, cfg: PredictorConfig, init_file: str | Path, context_dim: int) -> StructurePredictor:
        """A predictor whose static logits start from the init stage's U0, V0."""
        tensors, meta = load_init(init_file)
        geo_dim = tensors["geo_table"].shape[1] + 1 if cfg.geo_features else 0
        return cls(cfg, *init_nodes(tensors, meta, init_file), context_dim, geo_dim, tensors["U0"], tensors["V0"])

    def features(self, context: torch.Tensor, geo: torch.Tensor | None = None) -> torch.Tensor:
        """The MLP's hidden features h (…, hidden) of context (…, C) and geometric features (…, G);
        (…, L, hidden) for ``input: layer``, each layer's from its own input."""
        if context.shape[-1] != self.context_dim:
            raise PredictorError(f"context features must have {self.context_dim} dims; got {context.shape[-1]}")
        if self.cfg.input == "layer":
            x = context.unflatten(-1, (self.n_layers, -1))  # (…, L, d): each layer's input at unit RMS
            x = F.rms_norm(x, (x.shape[-1],), eps=1e-6)
            if self.geo_dim:
                self._check_geo(geo)
                x = torch.cat([x, geo.to(x.dtype).unsqueeze(-2).expand(*x.shape[:-1], self.geo_dim)], dim=-1)
            return F.gelu(torch.einsum("...lf,lfh->...lh", x, self.layer_in) + self.layer_in_bias)
        if self.cfg.input == "lm":  # the embedding and the hidden state differ in scale by ~100x: each to unit RMS
            context = torch.cat([F.rms_norm(x, (x.shape[-1],), eps=1e-6) for x in context.chunk(2, dim=-1)], dim=-1)
        elif self.cfg.input == "embedding":
            context = F.rms_norm(context, (context.shape[-1],), eps=1e-6)
        if self.geo_dim:
            self._check_geo(geo)
            context = torch.cat([context, geo.to(context.dtype)], dim=-1)
        return self.mlp(context)

    def _check_geo(self, geo: torch.Tensor | None) -> None:
        if geo is None or geo.shape[-1] != self.geo_dim:
            raise PredictorError(f"this predictor takes {self.geo_dim} geometric features per position "
                                 f"(predictor.geo_features); got {None if geo is None else geo.shape[-1]}")

    def logits(self, context: torch.Tensor, geo: torch.Tensor | None = None, h: torch.Tensor | None = None) -> torch.Tensor:
        """Z = U Vᵀ + B for context (…, C) and geometric features (…, G). (…, N, N)"""
        h = self.features(context, geo) if h is None else h
        n, r = self.static.shape[0], self.cfg.rank
        u = self.to_u(h).unflatten(-1, (n, r)) / math.sqrt(r)  # (…, N, r)
        v = self.to_v(h).unflatten(-1, (n, r))
        return u @ v.transpose(-1, -2) + self.static

    def edges(self, z: torch.Tensor, tau: float | None = None,
              generator: torch.Generator | None = None) -> torch.Tensor:
        """Soft A_raw = M ⊙ σ((Z + L)/τ), L logistic noise in training mode only. (…, N, N)"""
        tau = self.cfg.tau if tau is None else tau
        if self.training:
            z = z + logistic_noise(z.shape, z.device, z.dtype, generator)
        return torch.sigmoid(z / tau) * self.mask

    def head_logits(self, context: torch.Tensor, geo: torch.Tensor | None = None,
                    h: torch.Tensor | None = None) -> torch.Tensor:
        """Keep logits z (…, L·H) of the head gates, bounded by ``logit_bound``."""
        h = self.features(context, geo) if h is None else h
        if self.cfg.input == "layer":  # layer l's heads from layer l's features
            w = torch.einsum("...lh,lhk->...lk", h, self.layer_out).flatten(-2)
        else:
            w = self.to_gate(h)
        return bound_logits(w + self.head_bias, self.cfg.logit_bound)

    def route(self, context: torch.Tensor, geo: torch.Tensor | None = None, tau: float | None = None,
              hard: bool | None = None, generator: torch.Generator | None = None, keep: float | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(A (…, N, N), g (…, N), keep logits (…, L·H) or None for the cascade); ``keep`` overrides
        the budget's fraction (phase 2's annealed budget)."""
        hard = self.cfg.hard if hard is None else hard
        tau = self.cfg.tau if tau is None else tau
        if self.cfg.gate == "cascade":
            a_raw = self.edges(self.logits(context, geo), tau, generator)
            return (*cascade(a_raw, self.n_layers, self.n_heads, self.cfg.gate_k, hard), None)
        h = self.features(context, geo)
        z = self.head_logits(context, geo, h)
        if self.cfg.always_on:  # shared heads: above every other score, so top-K always takes them
            z = z + self.always_on * ALWAYS_ON_LOGIT
        noise = (gate_noise(self.cfg.noise, z.shape, z.device, z.dtype, generator, self.noise_scale)
                 if self.training else None)
        keep = self.cfg.keep if keep is None else keep
        g = head_gates(z, self.n_layers, self.cfg.estimator, self.cfg.budget, keep, tau, noise, hard,
                       getattr(self, "layer_keep", None))
        g = torch.cat([torch.ones_like(g[..., :1]), g], dim=-1)  # (…, N): the source always runs
        a = self.mask * g[..., :, None]  # every allowed edge out of an active head
        if self.cfg.weights == "softmax":  # the edges stay 0/1; the gates scale the kept heads' outputs
            g = torch.cat([g[..., :1], softmax_weights(g[..., 1:], z, self.always_on)], dim=-1)
        if self.cfg.edges == "learned":
            a_raw = self.edges(self.logits(context, geo, h), tau, generator)
            a = a * (straight_through((a_raw > 0.5).to(a_raw.dtype), a_raw) if hard else a_raw)
        return a, g, z

    def forward(self, context: torch.Tensor, geo: torch.Tensor | None = None, tau: float | None = None,
                hard: bool | None = None, generator: torch.Generator | None = None,
                keep: float | None = None, with_logits: bool = False) -> tuple[torch.Tensor, ...]:
        """(A (…, N, N), g (…, N)) for every position of context (…, C); ``hard`` thresholds
        the edges (A_raw > 1/2 ⇔ Z + L > 0) and gates, straight-through to the soft values.
        ``with_logits``: :meth:`route`'s triple (a training loss that needs the keep logits calls
        the module, not ``route``, so a DistributedDataParallel wrapper sees the forward)."""
        out = self.route(context, geo, tau, hard, generator, keep)
        return out if with_logits else out[:2]


def load_init(init_file: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """The init stage's tensors and its config metadata."""
    meta, tensors = read_safetensors(init_file, "pt", "config", PredictorError,
                                     "run `dvc repro init` (or restore it: `dvc checkout`)")
    return tensors, meta


PREDICTOR_FILE = "predictor.safetensors"


def init_nodes(tensors: dict, meta: dict, init_file) -> tuple[int, int]:
    """(layers, nodes per layer) of the head graph an init file's factors describe (:func:`load_init`'s
    tensors and metadata): its U0 has one row per node, the source first."""
    n_layers, n = int(meta["n_layers"]), tensors["U0"].shape[0]
    if n_layers < 1 or (n - 1) % n_layers:
        raise PredictorError(f"{init_file}: {n} nodes do not fit {n_layers} layers")
    return n_layers, (n - 1) // n_layers


def save_predictor(predictor: StructurePredictor, path: str | Path, extra: dict | None = None) -> None:
    """Weights (safetensors) with the resolved config and shapes in the metadata (STYLE 6), atomically."""
    from safetensors.torch import save_file

    from lookahead.core.atomic import atomic_file
    from lookahead.core.config import to_dict

    meta = {"predictor": to_dict(predictor.cfg), "n_layers": predictor.n_layers, "n_heads": predictor.n_heads,
            "context_dim": predictor.context_dim, "geo_dim": predictor.geo_dim, **(extra or {})}
    tensors = {k: v.detach().cpu().contiguous() for k, v in predictor.state_dict().items()}
    with atomic_file(path) as tmp:
        save_file(tensors, str(tmp), metadata={"config": json.dumps(meta, sort_keys=True)})  # one key: stable bytes


def load_predictor(path: str | Path) -> tuple[StructurePredictor, dict]:
    """A predictor saved by :func:`save_predictor`, in eval mode, and its metadata."""

    from lookahead.core.config import from_dict

    meta, tensors = read_safetensors(path, "pt", "config", PredictorError,
                                     "run `dvc repro -f phase1` (or restore it: `dvc checkout`)")
    cfg = from_dict(PredictorConfig, meta["predictor"])
    predictor = StructurePredictor(cfg, meta["n_layers"], meta["n_heads"], meta["context_dim"], meta["geo_dim"])
    predictor.load_state_dict(tensors)
    return predictor.eval(), meta


def seed_router_name(seed: int) -> str:
    """The file of phase 1's seed ``seed`` router (≥ 1; seed 0 is the stage's ``predictor.safetensors``)
    in its seeds directory: phase 2's seed i routes with it."""
    return f"predictor_seed{seed}.safetensors"


def twin_router_name(seed: int) -> str:
    """The file of phase 1's seed ``seed`` static twin (≥ 0: the router trained on zeroed inputs,
    ``phase1.static_twin``) in its twins directory."""
    return f"twin_seed{seed}.safetensors"
