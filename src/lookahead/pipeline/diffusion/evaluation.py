"""Judging the diffusion head against the **baseline sampler** — the phase-1 predictor with its
logistic noise on — at the same K, on held-out contexts (docs/pipeline.md):

1. LM NLL of one sample (the mean over the K samples of each position) and best-of-K (per
   position, the lowest of K), on the cache's val windows, next to dense and the predictor's
   deterministic topology;
2. edge density and active-head fraction of the samples, next to the pair set's;
3. diversity: mean Hamming distance (bits of the executed graph) between the K samples of one
   position, and between samples of different positions;
4. mode recall: on held-out pairs' positions with ≥ 2 distinct kept topologies, the share of those
   topologies that some sample recovers within ``recall_radius`` bits;
5. samples/s of each sampler (sampling and the cascade, no LM).

Best-of-K scores every position of a sampled window in one LM forward (the pairs stage's
approximation, whose accuracy it measures). The report also carries the *exploration* sampler that
made the pairs (predictor plus ``pairs.flip_prob`` edge flips), a stronger baseline than the
predictor's own noise.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from lookahead.artifacts.contexts import ContextCache
from lookahead.graph.denoiser import Denoiser
from lookahead.graph.nodes import allowed_mask, n_edges
from lookahead.graph.plan import execute
from lookahead.graph.router_inputs import router_context
from lookahead.graph.sampling import executed_topology, sample_topologies, stored_edges
from lookahead.graph.scoring import GeoLookup
from lookahead.lm.nll import token_nll


@dataclasses.dataclass
class Sampler:
    """A way to draw hard executed topologies for a batch of positions: ``draw(contexts (P, C),
    geo (P, G), router (P, C')) -> (A (P, N, N), g (P, N))``; ``router``: the predictor's own
    context features (``predictor.input``), which every sampler reads (the diffusion head too)."""

    name: str
    draw: object
    seconds: float = 0.0
    graphs: int = 0

    def __call__(self, contexts: torch.Tensor, geo: torch.Tensor | None, router: torch.Tensor | None = None):
        tic = time.perf_counter()
        adjacency, gates = self.draw(contexts, geo, contexts if router is None else router)
        if adjacency.is_cuda:
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - tic
        self.graphs += contexts.shape[0]
        return adjacency, gates


def make_samplers(denoiser: Denoiser, predictor, sample_steps: int, temperature: float, flip_prob: float,
                  generator: torch.Generator) -> dict[str, Sampler]:
    """The diffusion head, the baseline (predictor noise) and the exploration sampler of the pairs stage.
    Each takes the geometric features only if its model was built with them."""
    def diffusion(contexts, geo, router):
        geo = geo if denoiser.geo_dim else None
        bits = denoiser.sample(router, geo, sample_steps, generator, temperature)  # it reads the router's inputs
        return executed_topology(bits, denoiser.mask, denoiser.n_layers, denoiser.n_heads, predictor.cfg.gate)

    def baseline(contexts, geo, router):
        return sample_topologies(predictor, router, geo if predictor.geo_dim else None, 0.0, generator)

    def explore(contexts, geo, router):
        return sample_topologies(predictor, router, geo if predictor.geo_dim else None, flip_prob, generator)

    return {"diffusion": Sampler("diffusion", diffusion), "baseline": Sampler("baseline", baseline),
            "explore": Sampler("explore", explore)}


def hamming(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Pairwise Hamming distances of 0/1 rows: x (…, K, E), y (…, M, E) → (…, K, M)."""
    x, y = x.float(), y.float()
    return x.sum(-1)[..., :, None] + y.sum(-1)[..., None, :] - 2 * x @ y.transpose(-1, -2)


class _Totals:
    """Running sums of one sampler's figures on the val windows."""

    def __init__(self):
        self.sample_nll = self.best_nll = self.edges = self.heads = 0.0
        self.within = self.across = 0.0
        self.positions = self.samples = self.within_pairs = self.across_pairs = 0

    def add(self, nll: torch.Tensor, edges: torch.Tensor, heads: torch.Tensor, n_e: int,
            perm: torch.Tensor) -> None:
        """nll (K, P), edges (K, P, E) executed bits, heads (K, P) active-head fractions."""
        k, p = nll.shape
        self.sample_nll += nll.sum().item()
        self.best_nll += nll.min(0).values.sum().item()
        self.edges += edges.float().sum().item() / n_e
        self.heads += heads.sum().item()
        self.positions += p
        self.samples += k * p
        if k >= 2:
            d = hamming(edges.transpose(0, 1), edges.transpose(0, 1))  # (P, K, K)
            upper = torch.triu(torch.ones(k, k, dtype=torch.bool, device=d.device), 1)
            self.within += d[:, upper].sum().item()
            self.within_pairs += p * int(upper.sum())
        self.across += (edges.float() - edges[:, perm].float()).abs().sum().item()  # sample k at p vs at perm(p)
        self.across_pairs += k * p

    def figures(self) -> dict[str, float]:
        return {
            "sample_nll": self.sample_nll / self.samples,
            "best_of_k_nll": self.best_nll / self.positions,
            "density": self.edges / self.samples,
            "active_head_fraction": self.heads / self.samples,
            "within_context_hamming": self.within / self.within_pairs if self.within_pairs else 0.0,
            "across_context_hamming": self.across / max(self.across_pairs, 1),
        }


@torch.no_grad()
def lm_comparison(lm, predictor, samplers: dict[str, Sampler], cache: ContextCache, geo: GeoLookup,
                  k: int, eval_sequences: int, batch_size: int, device, seed: int, skip: str = "full") -> dict:
    """Figures 1–3 on the val windows for every sampler, with dense and deterministic NLL."""
    n_val = len(cache.windows("val"))
    rows = np.arange(n_val if eval_sequences == 0 else min(eval_sequences, n_val))
    mask = allowed_mask(predictor.n_layers, predictor.n_heads).to(device)
    n_e = n_edges(predictor.n_layers, predictor.n_heads)
    totals = {name: _Totals() for name in samplers}
    dense_sum = det_sum = det_heads = 0.0
    count = 0
    perm_gen = torch.Generator().manual_seed(seed)
    predictor.eval()
    for start in range(0, len(rows), batch_size):
        windows, contexts = (x.to(device) for x in cache.batch("val", rows[start : start + batch_size]))
        ids, targets = windows[:, :-1], windows[:, 1:]
        b, t = ids.shape
        features = geo(ids)  # (B, T, G): every sampler picks what its model takes
        dense_sum += token_nll(lm(input_ids=ids).logits, targets).sum().item()
        router = router_context(predictor.cfg.input, lm, ids, contexts)
        adjacency, gates = predictor(router, features if predictor.geo_dim else None, hard=True)
        det_sum += token_nll(execute(lm, ids, adjacency, gates, skip),
                             targets).sum().item()
        det_heads += gates[..., 1:].mean(-1).sum().item()
        count += b * t
        flat_c, flat_r = contexts.flatten(0, 1), router.flatten(0, 1)
        perm = torch.randperm(b * t, generator=perm_gen).to(device)
        flat_g = features.flatten(0, 1)
        for name, sampler in samplers.items():
            nlls, edges, heads = [], [], []
            for _ in range(k):
                adjacency, gates = sampler(flat_c, flat_g, flat_r)  # (P, N, N), (P, N)
                adjacency, gates = adjacency.view(b, t, *adjacency.shape[1:]), gates.view(b, t, -1)
                nlls.append(token_nll(execute(lm, ids, adjacency, gates, skip),
                                      targets).flatten())
                edges.append(stored_edges(adjacency, gates, mask).flatten(0, 1) > 0.5)
                heads.append(gates[..., 1:].mean(-1).flatten())
            totals[name].add(torch.stack(nlls), torch.stack(edges), torch.stack(heads), n_e, perm)
    out = {name: tot.figures() for name, tot in totals.items()}
    out["dense_nll"] = dense_sum / count
    out["deterministic_nll"] = det_sum / count
    out["deterministic_active_head_fraction"] = det_heads / count
    out["positions"] = count
    return out


@torch.no_grad()
def mode_recall(samplers: dict[str, Sampler], predictor, pairs, features, k: int, radius: int,
                device, chunk: int = 256, router_features=None) -> dict:
    """Figure 4 on held-out positions with ≥ 2 distinct kept topologies, for every sampler.
    ``router_features(rows)``: the predictor's context features at cache rows (None: the cache's)."""
    held = pairs.heldout
    rows, inverse, counts = np.unique(pairs.rows[held], return_inverse=True, return_counts=True)
    multi = np.flatnonzero(counts >= 2)  # positions (indices into rows); pairs of one position are distinct
    found = {name: 0 for name in samplers}
    nearest = {name: 0.0 for name in samplers}
    topologies = 0
    mask = allowed_mask(predictor.n_layers, predictor.n_heads).to(device)
    for start in range(0, len(multi), chunk):
        sel = multi[start : start + chunk]
        contexts, geo = features(rows[sel])
        contexts, geo = contexts.to(device), (geo.to(device) if geo is not None else None)
        router = None if router_features is None else router_features(rows[sel]).to(device)
        # kept topologies of these positions: (P, M, E) padded, with a validity mask (P, M)
        per_position = [held[np.flatnonzero(inverse == i)] for i in sel]
        width = max(len(x) for x in per_position)
        kept = torch.zeros(len(sel), width, pairs.edges.shape[1], device=device)
        valid = torch.zeros(len(sel), width, dtype=torch.bool, device=device)
        for i, idx in enumerate(per_position):
            kept[i, : len(idx)] = pairs.edges[idx].float().to(device)
            valid[i, : len(idx)] = True
        topologies += int(valid.sum())
        for name, sampler in samplers.items():
            draws = torch.stack([stored_edges(*sampler(contexts, geo, router), mask) for _ in range(k)], dim=1)  # (P, K, E)
            dist = hamming(kept, draws).min(-1).values  # (P, M): nearest sample to each kept topology
            found[name] += int(((dist <= radius) & valid).sum())
            nearest[name] += float(dist[valid].sum())
    out = {"positions": int(len(multi)), "topologies": topologies}
    for name in samplers:
        out[name] = {"mode_recall": found[name] / topologies if topologies else None,
                     "nearest_hamming": nearest[name] / topologies if topologies else None}
    return out
