"""The rows of the evaluate table: each an LM and a source of topologies, scored on the val windows
(NLL, active fractions, FLOPs) and timed against the stock dense forward.

Attention FLOPs of a (head, position) pair that runs: 2·d·D per projection for q, k, v and the
output (8·d·D) plus 4·D·n_keys for scores and the weighted sum, where n_keys counts the positions
≤ t at which that head runs (off positions have no key). Dense: every pair, n_keys = t + 1. Under
``runtime.skip: query`` every pair computes its key and value (4·d·D), and only a pair that runs its
query, output and attention over all t + 1 keys (4·d·D + 4·D·(t + 1)). The
head-graph mixing (2·d per edge into a head that runs: building that head's input stream) is not
in the stock model; it is reported beside, as ``mixing_flops_over_dense``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from lookahead.artifacts.contexts import ContextCache
from lookahead.graph.denoiser import draw_topology
from lookahead.graph.nodes import random_topology, running_heads, static_topology
from lookahead.graph.plan import execute
from lookahead.graph.router_inputs import router_context
from lookahead.graph.runtime import forward_with_topology
from lookahead.graph.scoring import GeoLookup
from lookahead.lm.families.base import Shape
from lookahead.lm.nll import token_nll


@dataclasses.dataclass
class Shapes:
    """What the figures of a topology need to know about the model: its layers, the nodes per layer
    (``n_heads``: query heads, or key/value groups under ``runtime.unit: group``, each counted as
    one head of its query heads' width ``d_head``), the model width and a node's width."""

    n_layers: int
    n_heads: int
    d_model: int
    d_head: int

    @classmethod
    def of(cls, lm, unit: str = "head") -> Shapes:
        c = lm.config
        shape = Shape.of(c)
        units = shape.units(unit)
        return cls(shape.n_layers, units, c.hidden_size, shape.head_dim * (shape.n_heads // units))


def position_figures(adjacency: torch.Tensor, gates: torch.Tensor, s: Shapes, skip: str = "full") -> dict[str, torch.Tensor]:
    """Per-position figures of per-position topologies A (B, T, N, N), g (B, T, N):

    heads (B, T, L): summed gates of each layer's heads; edges (B, T, L): summed edge weights into
    each layer's heads; attn_flops, dense_flops, mixing_flops (B, T): see the module docstring.
    """
    b, t = gates.shape[:2]
    L, H, d, D = s.n_layers, s.n_heads, s.d_model, s.d_head
    g = gates[..., 1:].reshape(b, t, L, H)
    into = adjacency[..., 1:].reshape(b, t, -1, L, H).sum(2)  # (B, T, L, H): weight into each head
    on = running_heads(gates).reshape(b, t, L, H).to(adjacency.dtype)  # soft gates: every head with any weight
    positions = torch.arange(1, t + 1, device=gates.device, dtype=adjacency.dtype)
    if skip == "query":  # keys and values everywhere; queries, outputs and attention rows where on
        attn = (4 * d * D + on * (4 * d * D + 4 * D * positions[None, :, None, None])).sum((-2, -1))
    else:
        keys = on.cumsum(1)  # (B, T, L, H): positions <= t at which the head runs
        attn = (on * (8 * d * D + 4 * D * keys)).sum((-2, -1))
    dense = L * H * (8 * d * D + 4 * D * positions).expand(b, t)
    edges_into_running = ((adjacency[..., 1:] != 0).to(adjacency.dtype).reshape(b, t, -1, L, H) * on[:, :, None]).sum((2, 3, 4))
    # heads that run: a head-gate graph's edges are 0/1 and its gates may weigh a running head
    # (phase2.gate_weights: softmax), which counts whole; the cascade's soft gates are summed
    head_gates = bool(((adjacency == 0) | (adjacency == 1)).all())
    return {"heads": (on if head_gates else g).sum(-1), "edges": into.sum(-1), "attn_flops": attn, "dense_flops": dense,
            "mixing_flops": 2 * d * edges_into_running}


class RowTotals:
    """Running sums of one table row."""

    def __init__(self, s: Shapes):
        self.s = s
        self.nll = self.flops = self.dense_flops = self.mixing = 0.0
        self.positions = 0
        self.heads = torch.zeros(s.n_layers, dtype=torch.float64)
        self.edges = torch.zeros(s.n_layers, dtype=torch.float64)
        self.has_topology = False

    def add(self, nll: torch.Tensor, figures: dict[str, torch.Tensor] | None) -> None:
        """nll (B, T); figures of :func:`position_figures` (None: dense)."""
        self.nll += nll.double().sum().item()
        self.positions += nll.numel()
        if figures is None:
            return
        self.has_topology = True
        self.heads += figures["heads"].double().sum((0, 1)).cpu()
        self.edges += figures["edges"].double().sum((0, 1)).cpu()
        self.flops += figures["attn_flops"].double().sum().item()
        self.dense_flops += figures["dense_flops"].double().sum().item()
        self.mixing += figures["mixing_flops"].double().sum().item()

    def row(self) -> dict:
        s, n = self.s, max(self.positions, 1)
        nll = self.nll / n
        out = {"nll": nll, "ppl": math.exp(min(nll, 700.0))}
        if not self.has_topology:
            ones = [1.0] * s.n_layers
            return {**out, "active_head_fraction": 1.0, "active_head_fraction_per_layer": ones,
                    "active_edge_fraction": 1.0, "active_edge_fraction_per_layer": ones,
                    "attention_only_flops_over_dense": 1.0, "mixing_flops_over_dense": 0.0}
        allowed = torch.tensor([s.n_heads * (1 + layer * s.n_heads) for layer in range(s.n_layers)], dtype=torch.float64)
        heads = (self.heads / (n * s.n_heads)).tolist()
        edges = (self.edges / (n * allowed)).tolist()
        return {**out, "active_head_fraction": float(np.mean(heads)), "active_head_fraction_per_layer": heads,
                "active_edge_fraction": float(self.edges.sum() / (n * allowed.sum())), "active_edge_fraction_per_layer": edges,
                "attention_only_flops_over_dense": self.flops / self.dense_flops,
                "mixing_flops_over_dense": self.mixing / self.dense_flops}


# A row's topology source: (ids (B, T), contexts (B, T, C), geo (B, T, G)) → K samples [(A, g)], each
# (B, T, N, N) and (B, T, N), or shared (N, N) and (N,); None: dense.
Topologies = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], list | None]


@dataclasses.dataclass
class RowSpec:
    name: str
    lm: object
    topologies: Topologies | None
    hard: bool = True
    best_of: str | None = None  # also a row of this name: per position, the sample with the lowest NLL
    skip: str = "full"  # the runtime's skip mode (the phase-1 predictor's)


def run_topology(spec: RowSpec, ids: torch.Tensor, adjacency: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
    """Logits of a row's LM over one topology: hard rows through the execution plan (which skips the
    off heads' work where the graph allows it), soft rows through the general runtime."""
    if spec.hard:
        return execute(spec.lm, ids, adjacency, gates, spec.skip)
    return forward_with_topology(spec.lm, ids, adjacency, gates, skip=spec.skip)


@torch.no_grad()
def score_rows(specs: list[RowSpec], cache: ContextCache, geo: GeoLookup, rows: np.ndarray, batch_size: int,
               device, per_token: dict[str, list] | None = None, unit: str = "head") -> dict[str, dict]:
    """Every row's figures over the val windows ``rows``; ``per_token`` (when given) gets each
    best-of row's per-position NLLs, batch by batch (flat tensors in window order). ``unit``: what
    a node of the rows' topologies is (``runtime.unit``)."""
    totals = {}  # in the specs' order, a best-of row right after its row: the table's order
    for spec in specs:
        totals[spec.name] = RowTotals(Shapes.of(spec.lm, unit))
        if spec.best_of:
            totals[spec.best_of] = RowTotals(Shapes.of(spec.lm, unit))
    for start in range(0, len(rows), batch_size):
        windows, contexts = (x.to(device) for x in cache.batch("val", rows[start : start + batch_size]))
        ids, targets = windows[:, :-1], windows[:, 1:]
        features = geo(ids)
        b, t = ids.shape
        for spec in specs:
            s = totals[spec.name].s
            samples = spec.topologies(ids, contexts, features) if spec.topologies else None
            if samples is None:
                totals[spec.name].add(token_nll(spec.lm(input_ids=ids).logits, targets), None)
                continue
            nlls, figures = [], []
            for adjacency, gates in samples:
                nlls.append(token_nll(run_topology(spec, ids, adjacency, gates), targets))
                if adjacency.dim() == 2:  # shared: the same figures at every position
                    adjacency, gates = adjacency.expand(b, t, *adjacency.shape), gates.expand(b, t, -1)
                figures.append(position_figures(adjacency, gates, s, spec.skip))
            for nll, fig in zip(nlls, figures):
                totals[spec.name].add(nll, fig)
            if spec.best_of:  # per position, the sample with the lowest NLL (and its figures)
                nll = torch.stack(nlls)  # (K, B, T)
                pick = nll.argmin(0)
                chosen = {k: torch.stack([f[k] for f in figures]) for k in figures[0]}
                gathered = {k: v.gather(0, pick.view(1, b, t, *([1] * (v.dim() - 3))).expand(1, *v.shape[1:]))[0]
                            for k, v in chosen.items()}
                totals[spec.best_of].add(nll.min(0).values, gathered)
                if per_token is not None:
                    per_token.setdefault(spec.best_of, []).append(nll.min(0).values.flatten().cpu())
    return {name: tot.row() for name, tot in totals.items()}


def _seconds(call: Callable[[], object], device: torch.device) -> float:
    tic = time.perf_counter()
    call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - tic


@torch.no_grad()
def time_rows(specs: list[RowSpec], ids: torch.Tensor, topologies: dict[str, tuple], rounds: int,
              device: torch.device) -> dict[str, float]:
    """Forward tokens/s of each row's LM with its topology (``topologies[name]``, drawn beforehand for the
    batch ``ids``), over the stock dense forward of the same LM and batch (rounds interleaved; medians).
    Models, ids and topologies are moved to ``device`` (and the models back where they were)."""
    ids = ids.to(device)
    out = {}
    for spec in specs:
        home = next(spec.lm.parameters()).device
        lm = spec.lm.to(device)
        adjacency, gates = (x.to(device) for x in topologies[spec.name])
        lm(input_ids=ids)  # warm-up
        run_topology(spec, ids, adjacency, gates)
        dense, graph = [], []
        for _ in range(rounds):
            dense.append(_seconds(lambda: lm(input_ids=ids), device))
            graph.append(_seconds(lambda: run_topology(spec, ids, adjacency, gates), device))
        out[spec.name] = statistics.median(dense) / statistics.median(graph)  # (tokens/s) / (dense tokens/s)
        spec.lm.to(home)
    return out


def predictor_topologies(predictor, hard: bool, lm=None, tau: float | None = None) -> Topologies:
    """The predictor's deterministic topology (eval mode: no noise), soft or hard; it reads the
    cache's contexts or ``lm``'s states (``predictor.input``). ``tau``: the edge temperature of the
    soft graph (the one its training evaluated at; None: ``predictor.tau``)."""
    def draw(ids, contexts, geo):
        router = router_context(predictor.cfg.input, lm, ids, contexts)
        return [predictor(router, geo if predictor.geo_dim else None, tau=tau, hard=hard)]

    return draw


def connected_topologies(draw: Topologies, connectivity, router_input: str, lm) -> Topologies:
    """``draw``'s graphs times phase 2's free connectivity weights (None: ``draw`` itself); the dynamic
    weights read the router's input (``predictor.input`` ``router_input``) from ``lm``."""
    if connectivity is None:
        return draw

    def connected(ids, contexts, geo):
        router = router_context(router_input, lm, ids, contexts) if connectivity.dynamic else None
        return [(connectivity.connect(a, router), g) for a, g in draw(ids, contexts, geo)]

    return connected


def diffusion_topologies(denoiser, k: int, steps: int, temperature: float, seed: int, device,
                         reseed: bool = False, gate_kind: str = "cascade", lm=None) -> Topologies:
    """K diffusion samples per position (:func:`lookahead.graph.denoiser.draw_topology`: the head
    reads its recorded inputs, ``lm``'s states or the cache's, and keeps its recorded budget).
    ``reseed``: the generator starts again from ``seed`` at every call (the causality check needs the
    same draws per call)."""
    generator = torch.Generator(device=device).manual_seed(seed)

    def draw(ids, contexts, geo):
        if reseed:
            generator.manual_seed(seed)
        return [draw_topology(denoiser, lm, ids, contexts, geo, steps, temperature, generator, gate_kind)
                for _ in range(k)]

    return draw


def static_topologies(importance: torch.Tensor, fraction: float, device, skip: str = "full") -> Topologies:
    adjacency, gates = static_topology(importance, fraction, skip)
    return lambda ids, contexts, geo: [(adjacency.to(device), gates.to(device))]


def random_topologies(n_layers: int, n_heads: int, fraction: float, draws: int, seed: int, device,
                      skip: str = "full") -> Topologies:
    generator = torch.Generator().manual_seed(seed)  # batches come in a fixed order: a fixed draw per batch

    def draw(ids, contexts, geo):
        return [tuple(x.to(device) for x in random_topology(n_layers, n_heads, fraction, tuple(ids.shape), generator,
                                                            skip, exact=True)) for _ in range(draws)]

    return draw
