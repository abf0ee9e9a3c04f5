"""The diffusion head (docs/pipeline.md): a conditional discrete diffusion model over head graphs.

What it models: for one position's context, the distribution of the *good* topologies the pairs
stage found (executed graphs that beat the dense NLL), so that several different good graphs can
be drawn for one context — which the phase-1 predictor, whose edges are independent Bernoulli
draws around one mode, cannot represent.

**State.** The E allowed-edge bits of a topology (``lookahead.graph.nodes``: i → j with layer(i) <
layer(j)). Only allowed edges are ever noised or sampled, so every state on the chain — noisy ones
included — is an acyclic head graph the runtime can execute.

**Forward noise: Bernoulli toward the pair set's edge marginals** (DiGress, Vignac et al. 2023),

    q(a_t = 1 | a_0) = ᾱ(t) · a_0 + (1 − ᾱ(t)) · m_e,    ᾱ(t) = cos²(π/2 · (t + s)/(1 + s)) / cos²(π/2 · s/(1 + s))

for each edge e independently, t ∈ [0, 1] (cosine schedule, Nichol & Dhariwal 2021). The
transitions Q(α) = α·I + (1 − α)·1 m_eᵀ compose as Q(α)Q(β) = Q(αβ), so q(a_t | a_s) for any s < t
is Q(ᾱ(t)/ᾱ(s)) and sampling can take any number of steps. Why marginal rather than absorbing
(masking) noise: the chain's end point q(a_1) is the pair set's own edge distribution (a density
like the pairs', a graph the LM can run) rather than an all-masked state outside the graph space;
the denoiser only ever sees real graphs; and DiGress found marginal-prior noise better than
uniform for graph generation. With densities far from 1/2 (about 0.2 here) uniform noise would
also start every sample at the wrong density.

**Denoiser.** Predicts a_0 logits from (a_t, t, context embedding, the token's geometric
features): node states start from a per-node embedding plus the normalised in/out degrees of a_t
and the conditioning; ``layers`` blocks of message passing along a_t (mean of incoming and of
outgoing neighbours, plus the graph mean) with FiLM from the conditioning; a low-rank bilinear
read-out ``P Qᵀ / √r`` over nodes, plus a learned logit per edge (started at logit(m_e)) and a
time-dependent weight on a_t's own bit. Cost O(N²·d) per graph through dense N × N products and
O(N·r) read-out factors — never a token per edge — so 16 × 16 heads (N = 257) trains as easily as
4 × 4.

**Loss.** BCE of the a_0 logits on the allowed edges, t ~ U(0, 1].

**Sampling.** Ancestral, with the x0-parameterised posterior of D3PM (Austin et al. 2021):
p(a_s | a_t) ∝ Σ_{a_0} q(a_t | a_s) q(a_s | a_0) p̂(a_0 | a_t), over ``sample_steps`` equal steps
from t = 1 to 0; the last step draws a_0 from p̂. Samples are returned as executed graphs (the
cascade of :mod:`lookahead.graph.predictor`: a head without an active input is off, its outgoing edges
with it).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch
from torch import nn

from lookahead.core.errors import LookaheadError, require
from lookahead.core.inputs import recorded
from lookahead.graph.nodes import allowed_mask, n_edges, n_nodes, to_dense, to_edges, topk_set
from lookahead.graph.predictor import cascade

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
MARGINAL_EPS = 1e-3  # m_e is kept in [eps, 1 − eps]: a prior of exactly 0 or 1 would make some posteriors 0/0


class DiffusionError(LookaheadError, ValueError):
    """Inputs that do not fit the diffusion head."""


@dataclasses.dataclass
class DenoiserConfig:
    """Shape of the denoiser network (saved with the model)."""

    hidden: int = 32
    """Width d of the node states."""
    layers: int = 3
    """Message-passing blocks."""
    rank: int = 16
    """Rank r of the bilinear edge read-out."""
    cond_hidden: int = 128
    """Width of the conditioning vector (context, geometric features, time)."""
    schedule_offset: float = 0.008
    """s of the cosine schedule."""

    def __post_init__(self) -> None:
        for name in ("hidden", "layers", "rank", "cond_hidden"):
            require(getattr(self, name) >= 1, name, f"must be >= 1; got {getattr(self, name)}")
        require(math.isfinite(self.schedule_offset) and 0 < self.schedule_offset < 1, "schedule_offset",
                f"must be in (0, 1); got {self.schedule_offset}")


# ---------------------------------------------------------------------------------------- the chain


def alpha_bar(t: torch.Tensor, offset: float = 0.008) -> torch.Tensor:
    """Cosine schedule ᾱ(t), t ∈ [0, 1]: 1 at t = 0, about 0 at t = 1."""
    f = lambda x: torch.cos((x + offset) / (1 + offset) * math.pi / 2) ** 2  # noqa: E731
    return (f(t) / f(torch.zeros_like(t))).clamp(0.0, 1.0)


def q_probs(a0: torch.Tensor, abar: torch.Tensor, marginal: torch.Tensor) -> torch.Tensor:
    """q(a_t = 1 | a_0) = ᾱ a_0 + (1 − ᾱ) m per edge. a0 (…, E), abar broadcastable (…, 1), m (E,)."""
    return abar * a0 + (1 - abar) * marginal


def posterior_probs(a_t: torch.Tensor, p0: torch.Tensor, abar_t: torch.Tensor, abar_s: torch.Tensor,
                    marginal: torch.Tensor) -> torch.Tensor:
    """p(a_s = 1 | a_t) for s < t with the x0-parameterisation (D3PM):
    ∝ Σ_{a_0} q(a_t | a_s) q(a_s | a_0) p̂(a_0), per edge; ``p0`` = p̂(a_0 = 1 | a_t).

    Because q(a_s = 1 | a_0) is linear in a_0, the sum over a_0 is q(a_s = 1 | a_0 = p0). With a
    one-hot p0 this is the exact posterior q(a_s | a_t, a_0).
    """
    alpha = torch.where(abar_s > 0, abar_t / abar_s.clamp_min(1e-12), torch.zeros_like(abar_t))
    prior1 = q_probs(p0, abar_s, marginal)  # Σ_{a_0} q(a_s = 1 | a_0) p̂(a_0)
    stay = alpha + (1 - alpha) * marginal  # q(a_t = 1 | a_s = 1)
    rise = (1 - alpha) * marginal  # q(a_t = 1 | a_s = 0)
    lik1 = torch.where(a_t > 0.5, stay, 1 - stay)
    lik0 = torch.where(a_t > 0.5, rise, 1 - rise)
    num1, num0 = lik1 * prior1, lik0 * (1 - prior1)
    return num1 / (num1 + num0).clamp_min(1e-30)


def bernoulli(p: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """0/1 draws with probabilities p (same dtype as p)."""
    return (torch.rand(p.shape, device=p.device, dtype=p.dtype, generator=generator) < p).to(p.dtype)


def timestep_embedding(t: torch.Tensor, dim: int = 32) -> torch.Tensor:
    """Sinusoidal features of t ∈ [0, 1] (scaled to 0…1000). (…,) → (…, dim)"""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    angles = 1000.0 * t.float()[..., None] * freqs
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)


# ------------------------------------------------------------------------------------- the network


class _Block(nn.Module):
    """Message passing along a_t (incoming mean, outgoing mean, graph mean), FiLM from the conditioning."""

    def __init__(self, d: int, cond: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mix = nn.Sequential(nn.Linear(4 * d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.film = nn.Linear(cond, 2 * d)
        nn.init.zeros_(self.film.weight)  # FiLM starts as the identity
        nn.init.zeros_(self.film.bias)

    def forward(self, h, a, in_norm, out_norm, cond):
        u = self.norm(h)  # (B, N, d)
        incoming = a.transpose(-1, -2) @ u * in_norm  # mean over the sources of each node
        outgoing = a @ u * out_norm  # mean over its targets
        pooled = u.mean(-2, keepdim=True).expand_as(u)  # the whole graph
        x = self.mix(torch.cat([u, incoming, outgoing, pooled], dim=-1))
        gamma, beta = self.film(cond)[:, None, :].chunk(2, dim=-1)
        return h + x * (1 + gamma) + beta


class Denoiser(nn.Module):
    """(a_t (B, E), t (B,), context (B, C), geo (B, G)) → logits of a_0 (B, E)."""

    def __init__(self, cfg: DenoiserConfig, n_layers: int, n_heads: int, context_dim: int, geo_dim: int,
                 marginal: torch.Tensor):
        super().__init__()
        self.cfg = cfg
        self.n_layers, self.n_heads = n_layers, n_heads
        self.context_dim, self.geo_dim = context_dim, geo_dim
        n, e, d = n_nodes(n_layers, n_heads), n_edges(n_layers, n_heads), cfg.hidden
        if marginal.shape != (e,):
            raise DiffusionError(f"edge marginals must have {e} entries for {n_layers} x {n_heads} heads; "
                                 f"got {tuple(marginal.shape)}")
        mask = allowed_mask(n_layers, n_heads)
        self.register_buffer("mask", mask, persistent=False)
        self.register_buffer("marginal", marginal.float().clamp(MARGINAL_EPS, 1 - MARGINAL_EPS))
        # the context features are standardised (router inputs mix scales: a token embedding, an LM state);
        # the diffusion stage sets these from its training pairs (lookahead.pipeline.diffusion.build)
        self.register_buffer("context_shift", torch.zeros(context_dim))
        self.register_buffer("context_scale", torch.ones(context_dim))
        # normalisers of the degree features: how many edges each node could have at most
        self.register_buffer("max_in", mask.sum(0).clamp_min(1).float(), persistent=False)
        self.register_buffer("max_out", mask.sum(1).clamp_min(1).float(), persistent=False)
        self.cond = nn.Sequential(nn.Linear(context_dim + geo_dim + 32, cfg.cond_hidden), nn.GELU(),
                                  nn.Linear(cfg.cond_hidden, cfg.cond_hidden))
        self.node = nn.Parameter(0.02 * torch.randn(n, d))
        self.degree = nn.Linear(2, d)
        self.cond_to_node = nn.Linear(cfg.cond_hidden, d)
        self.blocks = nn.ModuleList(_Block(d, cfg.cond_hidden) for _ in range(cfg.layers))
        self.out_norm = nn.LayerNorm(d)
        self.to_p = nn.Linear(d, cfg.rank, bias=False)
        self.to_q = nn.Linear(d, cfg.rank, bias=False)
        self.edge_bias = nn.Parameter(torch.logit(self.marginal.clone()))  # p̂ starts at the marginals
        self.self_weight = nn.Linear(32, 1)  # how much a_t's own bit says about a_0, by time
        self.meta: dict = {}  # the saved config (load_denoiser): its input kind and budget

    def forward(self, a_t: torch.Tensor, t: torch.Tensor, context: torch.Tensor,
                geo: torch.Tensor | None = None) -> torch.Tensor:
        if context.shape[-1] != self.context_dim:
            raise DiffusionError(f"context features must have {self.context_dim} dims; got {context.shape[-1]}")
        if self.geo_dim and (geo is None or geo.shape[-1] != self.geo_dim):
            raise DiffusionError(f"this diffusion head takes {self.geo_dim} geometric features per position; "
                                 f"got {None if geo is None else geo.shape[-1]}")
        context = (context - self.context_shift.to(context.dtype)) / self.context_scale.to(context.dtype)
        temb = timestep_embedding(t).to(context.dtype)
        parts = [context, geo.to(context.dtype), temb] if self.geo_dim else [context, temb]
        cond = self.cond(torch.cat(parts, dim=-1))  # (B, cond)
        a = to_dense(a_t.to(context.dtype), self.mask)  # (B, N, N)
        in_deg, out_deg = a.sum(-2), a.sum(-1)  # (B, N)
        h = self.node + self.degree(torch.stack([in_deg / self.max_in, out_deg / self.max_out], dim=-1)) \
            + self.cond_to_node(cond)[:, None, :]
        in_norm, out_norm = 1.0 / (in_deg + 1)[..., None], 1.0 / (out_deg + 1)[..., None]
        for block in self.blocks:
            h = block(h, a, in_norm, out_norm, cond)
        h = self.out_norm(h)
        bilinear = self.to_p(h) @ self.to_q(h).transpose(-1, -2) / math.sqrt(self.cfg.rank)  # (B, N, N)
        own = self.self_weight(temb) * (2 * a_t.to(context.dtype) - 1)  # (B, 1) · (B, E)
        return to_edges(bilinear, self.mask) + self.edge_bias + own

    def noisy(self, a0: torch.Tensor, t: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """a_t ~ q(a_t | a_0) for each row of a0 (B, E) at its time t (B,)."""
        abar = alpha_bar(t.float(), self.cfg.schedule_offset)[:, None]
        return bernoulli(q_probs(a0.float(), abar, self.marginal), generator)

    @torch.no_grad()
    def sample(self, context: torch.Tensor, geo: torch.Tensor | None, steps: int,
               generator: torch.Generator | None = None, temperature: float = 1.0,
               with_probs: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Raw a_0 samples (B, E) of 0/1: one graph per row of context (B, C), by ancestral sampling.
        ``temperature`` < 1 sharpens p̂ at every step (fewer, surer edits; 1 = the model's distribution).
        ``with_probs``: also the last step's p̂(a_0) (B, E)."""
        rows = context.shape[0]
        x = bernoulli(self.marginal.expand(rows, -1).contiguous(), generator)  # a_1 ~ q(a_1) = the marginals
        times = torch.linspace(1.0, 0.0, steps + 1, device=context.device)
        abars = alpha_bar(times, self.cfg.schedule_offset)
        for k in range(steps):
            t = times[k].expand(rows)
            p0 = torch.sigmoid(self(x, t, context, geo).float() / temperature)
            if k == steps - 1:
                x = bernoulli(p0, generator)  # the last step draws a_0 from p̂
            else:
                x = bernoulli(posterior_probs(x, p0, abars[k], abars[k + 1], self.marginal), generator)
        return (x, p0) if with_probs else x

    @torch.no_grad()
    def sample_keep_sets(self, context: torch.Tensor, geo: torch.Tensor | None, steps: int, k: int,
                         generator: torch.Generator | None = None, temperature: float = 1.0) -> torch.Tensor:
        """Keep sets of exactly k heads (B, L·H) bool, for head gates under a budget: a sample's heads
        (those its edges reach, the cascade's), brought to k by the last step's p̂ of each head's edge
        from the source — the sample's heads first, most probable first, then the most probable others."""
        bits, p0 = self.sample(context, geo, steps, generator, temperature, with_probs=True)
        on = self.executed(bits)[1][..., 1:]  # (B, L·H)
        source = to_dense(p0, self.mask)[..., 0, 1:]  # p̂ of source → head
        score = on + source  # in [0, 2]: a sampled head outranks every other
        return topk_set(score, k)

    def executed(self, bits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The executed graph (A (…, N, N), g (…, N)) of raw allowed-edge bits (…, E): the hard cascade."""
        return cascade(to_dense(bits.float(), self.mask), self.n_layers, self.n_heads, hard=True)


# ------------------------------------------------------------------------------------ file format


def save_denoiser(model: Denoiser, out_dir: str | Path, extra: dict | None = None) -> None:
    """``out_dir/model.safetensors`` (weights and edge marginals) and ``out_dir/config.json``, atomically."""
    from safetensors.torch import save_file

    from lookahead.core.atomic import atomic_dir
    from lookahead.core.config import to_dict

    config = {"denoiser": to_dict(model.cfg), "n_layers": model.n_layers, "n_heads": model.n_heads,
              "context_dim": model.context_dim, "geo_dim": model.geo_dim, **(extra or {})}
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    with atomic_dir(out_dir) as tmp:
        save_file(tensors, str(tmp / MODEL_FILE), metadata={"config": json.dumps(config, sort_keys=True)})
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def load_denoiser(model_dir: str | Path) -> tuple[Denoiser, dict]:
    """A diffusion head saved by :func:`save_denoiser`, in eval mode, and its config."""
    from safetensors.torch import load_file

    from lookahead.core.config import from_dict

    model_dir = Path(model_dir)
    weights, config_file = model_dir / MODEL_FILE, model_dir / CONFIG_FILE
    if not weights.is_file() or not config_file.is_file():
        raise DiffusionError(f"diffusion head not found in {model_dir} (run `dvc repro diffusion`)")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
        tensors = load_file(str(weights))
    except Exception as err:  # truncated or foreign files
        raise DiffusionError(f"{model_dir} does not hold a readable diffusion head ({err}): run `dvc checkout` "
                             "or `dvc repro -f diffusion`") from None
    model = Denoiser(from_dict(DenoiserConfig, config["denoiser"]), config["n_layers"], config["n_heads"],
                     config["context_dim"], config["geo_dim"], tensors["marginal"])
    model.load_state_dict(tensors)
    model.meta = config  # what its users feed it (draw_topology)
    return model.eval(), config


def sampling_settings(meta: dict, model_dir: str | Path) -> tuple[int, float]:
    """(sample steps, temperature) the diffusion stage trained and scored its denoiser with, from
    the metadata :func:`load_denoiser` returns: phase 2 and evaluate sample with the same."""
    where = Path(model_dir) / CONFIG_FILE
    return (int(recorded(meta, "diffusion", "sample_steps", stage="diffusion", source=where)),
            float(recorded(meta, "diffusion", "sample_temperature", stage="diffusion", source=where)))


def denoiser_input(meta: dict) -> str:
    """The router input kind a saved diffusion head reads (``predictor.input``; ``cache`` for heads
    saved before it was recorded)."""
    return meta.get("input") or "cache"


@torch.no_grad()
def draw_topology(denoiser: Denoiser, lm, ids: torch.Tensor, cached: torch.Tensor | None,
                  geo: torch.Tensor | None, steps: int, temperature: float, generator: torch.Generator | None,
                  gate_kind: str = "cascade") -> tuple[torch.Tensor, torch.Tensor]:
    """One diffusion sample per position of windows ``ids`` (B, T) as the executed graph (A (B, T, N, N),
    g (B, T, N)). The head reads what it was trained on (its saved config ``denoiser.meta``,
    :func:`denoiser_input`: the context cache's
    ``cached`` features, or ``lm``'s states) and ``geo`` (B, T, G) when it takes geometric features;
    a head trained on keep sets (``heads_kept`` in its metadata) under head gates returns sets of
    exactly that many heads (:meth:`Denoiser.sample_keep_sets`)."""
    from lookahead.graph.nodes import head_graph
    from lookahead.graph.router_inputs import router_context
    from lookahead.graph.sampling import executed_topology

    b, t = ids.shape
    context = router_context(denoiser_input(denoiser.meta), lm, ids, cached).flatten(0, 1)
    flat_geo = geo.flatten(0, 1) if denoiser.geo_dim else None
    k = denoiser.meta.get("heads_kept")
    if k and gate_kind == "head":
        keep = denoiser.sample_keep_sets(context, flat_geo, steps, int(k), generator, temperature)
        gates = torch.cat([torch.ones_like(keep[..., :1], dtype=context.dtype), keep.to(context.dtype)], -1)
        adjacency = head_graph(gates, denoiser.n_layers, denoiser.n_heads)
    else:
        bits = denoiser.sample(context, flat_geo, steps, generator, temperature)
        adjacency, gates = executed_topology(bits, denoiser.mask, denoiser.n_layers, denoiser.n_heads, gate_kind)
    return adjacency.view(b, t, *adjacency.shape[1:]), gates.view(b, t, -1)


# ------------------------------------------------------------------------- a frozen head as a decoder


class TopologySampler:
    """A frozen diffusion head used as a decoder (phase 2's ``decoder: diffusion``): one sampled topology
    per position, stored as its executed graph's allowed-edge bits, with the sample steps and temperature
    the diffusion stage scored it with. ``gate_kind``: how the bits execute (:mod:`lookahead.graph.sampling`)."""

    def __init__(self, model_dir: str | Path, gate_kind: str):
        self.denoiser, meta = load_denoiser(model_dir)
        self.denoiser.requires_grad_(False)
        self.steps, self.temperature = sampling_settings(meta, model_dir)
        self.weights = Path(model_dir) / MODEL_FILE
        self.gate_kind = gate_kind

    def bits(self, lm, ids: torch.Tensor, cached: torch.Tensor | None, geo: torch.Tensor | None,
             generator: torch.Generator | None) -> torch.Tensor:
        """Allowed-edge bits (B, T, E) uint8 on the CPU of one sample per position of ``ids`` (B, T)."""
        from lookahead.graph.sampling import stored_edges

        d = self.denoiser
        adjacency, gates = draw_topology(d, lm, ids, cached, geo, self.steps, self.temperature, generator,
                                         self.gate_kind)
        return stored_edges(adjacency, gates, d.mask).to(torch.uint8).cpu()

    def executed(self, bits: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
        """The executed graph (A, g) of stored bits."""
        from lookahead.graph.sampling import executed_topology

        d = self.denoiser
        return executed_topology(bits.to(device), d.mask, d.n_layers, d.n_heads, self.gate_kind)
