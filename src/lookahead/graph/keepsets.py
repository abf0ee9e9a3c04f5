"""Per-token head keep sets as the objects decoders predict (issue: a structure decoder that captures
several good topologies), and the label-free ground truth they are judged on.

Under head gates with a budget (``predictor.gate: head``, ``budget: topk``) a position's topology
*is* its keep set: the K of the L·H heads that run there (every allowed edge out of an active head).
Here a keep set is a bool vector (…, L·H), layer-major, with exactly K ones.

**Ground truth** (:func:`search_keep_sets`): at every position of a window, candidate keep sets are
scored by KL(dense ‖ routed) at that position, a label-free cost. The candidates are the greedy
oracle's set (:func:`lookahead.graph.oracle.greedy_order`) and its single swaps (one kept head out,
one dropped head in: K·(L·H − K) of them), then ``rounds − 1`` more rounds of the single swaps of
each position's best set so far (a hill climb). Every position of a window runs its own candidate in
one forward (candidate c of position t next to candidate c of the others), the approximation the
greedy oracle makes too. :func:`eps_good` keeps, per position, the distinct sets within ε of the
best found: how many there are is the position's multi-modality.

**Nulls** a decoder's samples are judged beside: :func:`marginal_sets` (independent heads at given
inclusion probabilities, at the budget, through Gumbel-top-K of their logits) and
:func:`recall_at` for how many of a position's ε-good sets N samples recover (exact set match).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lookahead.graph.gating import gumbel_noise
from lookahead.graph.nodes import head_graph, topk_set
from lookahead.graph.oracle import DenseKL, greedy_keep, greedy_order
from lookahead.graph.plan import execute
from lookahead.lm.nll import token_nll


def as_gates(keep: torch.Tensor) -> torch.Tensor:
    """Keep sets (…, L·H) → gates (…, N) with the source on."""
    return torch.cat([torch.ones_like(keep[..., :1], dtype=torch.float32), keep.float()], -1)


def gumbel_topk(logits: torch.Tensor, k: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """A keep set of k heads drawn without replacement in proportion to softmax(logits) (top-k of
    logits + Gumbel noise, Kool et al. 2019)."""
    return topk_set(logits + gumbel_noise(logits.shape, logits.device, logits.dtype, generator), k)


def marginal_sets(probs: torch.Tensor, k: int, generator: torch.Generator | None = None, eps: float = 1e-3
                  ) -> torch.Tensor:
    """Keep sets of k heads whose heads are drawn independently of each other at the inclusion
    probabilities ``probs`` (…, L·H): Gumbel-top-k of their logits (clamped to [eps, 1 − eps])."""
    p = probs.float().clamp(eps, 1 - eps)
    return gumbel_topk(torch.log(p) - torch.log1p(-p), k, generator)


def single_swaps(keep: torch.Tensor, which: torch.Tensor | None = None) -> torch.Tensor:
    """Every single swap of keep sets (…, L·H) with exactly K ones each: (K·(L·H − K), …, L·H), swap
    s = i·(L·H − K) + j drops the i-th kept head and adds the j-th dropped one (in head order);
    ``which``: only those swaps s, in that order (:func:`sampled_swaps`)."""
    total = keep.shape[-1]
    flat = keep.reshape(-1, total)
    k = int(flat[0].sum())
    if not bool((flat.sum(-1) == k).all()):
        raise ValueError("single_swaps needs keep sets of one size")
    order = torch.sort((~flat).long(), dim=-1, stable=True).indices  # kept heads first, each group in head order
    kept, dropped = order[:, :k], order[:, k:]
    swaps = range(k * (total - k)) if which is None else which.tolist()
    out = flat.expand(len(swaps), -1, -1).clone()  # (S, P, L·H)
    rows = torch.arange(flat.shape[0], device=keep.device)
    for n, s in enumerate(swaps):
        i, j = divmod(int(s), total - k)
        out[n, rows, kept[:, i]] = False
        out[n, rows, dropped[:, j]] = True
    return out.view(-1, *keep.shape)


def sampled_swaps(k: int, total: int, n: int, generator: torch.Generator) -> torch.Tensor | None:
    """``n`` of the K·(L·H − K) single swaps (:func:`single_swaps`' indices), drawn without replacement
    from ``generator`` — each position's own i-th kept and j-th dropped head; None where ``n`` is 0 or
    reaches them all (every swap)."""
    count = k * (total - k)
    if n == 0 or n >= count:
        return None
    return torch.randperm(count, generator=generator)[:n].sort().values


@torch.no_grad()
def score_keep_sets(lm, ids: torch.Tensor, targets: torch.Tensor | None, candidates: torch.Tensor, kl: DenseKL,
                    n_layers: int, n_heads: int, skip: str, max_rows: int = 8
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """KL(dense ‖ routed) and, with ``targets``, the NLL at every position of windows ``ids`` (B, T)
    for each candidate (C, B, T, L·H) run at every position at once: ((C, B, T), (C, B, T) or None).
    ``max_rows`` sequences per forward."""
    count, batch, length = candidates.shape[:3]
    per = max(1, max_rows // batch)
    kls, nlls = [], []
    for start in range(0, count, per):
        part = candidates[start : start + per]
        gates = as_gates(part).flatten(0, 1)  # (c·B, T, N)
        logits = execute(lm, ids.repeat(part.shape[0], 1), head_graph(gates, n_layers, n_heads), gates, skip)
        logits = logits.view(part.shape[0], batch, length, -1)
        kls.append(kl(logits))
        if targets is not None:
            nlls.append(token_nll(logits.flatten(0, 1), targets.repeat(part.shape[0], 1)).view(part.shape[0], batch, length))
    return torch.cat(kls), (torch.cat(nlls) if targets is not None else None)


@torch.no_grad()
def search_keep_sets(lm, ids: torch.Tensor, targets: torch.Tensor | None, n_layers: int, n_heads: int, k: int,
                     skip: str, rounds: int = 1, max_rows: int = 8, per_round: int = 1, candidates: int = 0,
                     swaps: int = 0, generator: torch.Generator | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Candidate keep sets of k heads at every position of windows ``ids`` (B, T) and their costs:
    (sets (C, B, T, L·H) bool, KL to dense (C, B, T), NLL (C, B, T) or None). Candidate 0 is the
    greedy oracle's set (its search: ``per_round``, ``candidates``, :func:`lookahead.graph.oracle.greedy_targets`);
    then its single swaps; then, for each further round, the single swaps of each position's best set
    so far — every one, or ``swaps`` of them drawn from ``generator`` each round (:func:`sampled_swaps`:
    K·(L·H − K) is 18 225 on SmolLM2). Candidates may repeat (a swap of a swap); :func:`eps_good`
    keeps distinct ones."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1; got {rounds}")
    kl = DenseKL(F.log_softmax(lm(input_ids=ids).logits.float(), -1))
    order = greedy_order(lm, ids, n_layers, n_heads, k, skip, max_rows, per_round=per_round, candidates=candidates)
    greedy = greedy_keep(order, k)[..., 1:] > 0.5
    sets, kls, nlls = [], [], []
    best = greedy
    for _ in range(rounds + 1):  # the greedy set, then each round's swaps of the best so far
        which = None if not sets else sampled_swaps(k, n_layers * n_heads, swaps, generator)
        trial = greedy[None] if not sets else single_swaps(best, which)
        kl_c, nll_c = score_keep_sets(lm, ids, targets, trial, kl, n_layers, n_heads, skip, max_rows)
        sets.append(trial)
        kls.append(kl_c)
        nlls.append(nll_c)
        all_sets, all_kl = torch.cat(sets), torch.cat(kls)
        pick = all_kl.argmin(0)  # (B, T)
        best = torch.gather(all_sets, 0, pick[None, ..., None].expand(1, *all_sets.shape[1:])).squeeze(0)
    return all_sets, all_kl, (torch.cat(nlls) if targets is not None else None)


def eps_good(sets: torch.Tensor, kl: torch.Tensor, eps: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per position (flattened in (B, T) order), the distinct candidate sets within ``eps`` of its
    lowest KL, lowest first: a list of (indices into the candidates (m,), KL (m,)), m >= 1. sets
    (C, B, T, L·H), kl (C, B, T)."""
    flat_sets = sets.flatten(1, 2).transpose(0, 1).cpu().numpy()  # (P, C, L·H)
    flat_kl = kl.flatten(1).transpose(0, 1).cpu()  # (P, C)
    out = []
    for p in range(flat_sets.shape[0]):
        order = torch.sort(flat_kl[p], stable=True).indices
        good = order[flat_kl[p][order] <= flat_kl[p][order[0]] + eps]
        seen, keep = set(), []
        for c in good.tolist():
            key = flat_sets[p, c].tobytes()
            if key not in seen:
                seen.add(key)
                keep.append(c)
        idx = torch.tensor(keep, dtype=torch.long)
        out.append((idx, flat_kl[p][idx]))
    return out


def recall_at(samples: torch.Tensor, truth: torch.Tensor, valid: torch.Tensor, ns=(1, 4, 8)) -> dict[int, torch.Tensor]:
    """Per position, the share of its true sets (P, M, L·H) (``valid`` (P, M)) that one of the first n
    samples (P, S, L·H) equals, for each n in ``ns`` (n > S counts the S there are): {n: (P,)}."""
    same = (truth[:, :, None, :] == samples[:, None, :, :]).all(-1)  # (P, M, S)
    out = {}
    for n in ns:
        hit = same[..., :n].any(-1) & valid
        out[n] = hit.sum(-1).float() / valid.sum(-1).clamp_min(1).float()
    return out


class KeepSetAR(nn.Module):
    """An autoregressive decoder over keep sets of exactly k heads, conditioned on a context vector:
    p(b | x) = Π_i p(b_i | b_<i, x), head by head in layer-major order, with logit_i = a_i(x) + Σ_{j<i}
    W_ij b_j + c_i · r_i, r_i the share of the heads still to run among those left. Decisions the
    budget forces (no room left, or every head left needed) have probability 1, so the likelihood is
    exact over the C(L·H, k) sets and sampling never leaves them."""

    def __init__(self, context_dim: int, total: int, k: int, hidden: int = 128, prior: bool = False):
        super().__init__()
        self.context_dim, self.total, self.k, self.prior = context_dim, total, k, prior
        self.net = nn.Sequential(nn.Linear(context_dim, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, total))
        self.pair = nn.Parameter(torch.zeros(total, total))
        self.rate = nn.Parameter(torch.zeros(total))
        self.register_buffer("lower", torch.ones(total, total).tril(-1), persistent=False)
        self.register_buffer("shift", torch.zeros(context_dim))  # input standardisation (set by the trainer)
        self.register_buffer("scale", torch.ones(context_dim))

        self.prior_weight = nn.Parameter(torch.ones(total))

    def base(self, x: torch.Tensor) -> torch.Tensor:
        """a(x): the per-head logits of the context alone (P, L·H). With ``prior``, the last L·H
        inputs are per-head prior logits (e.g. another router's keep logits), added with a learned
        weight per head (1 at the start) to the MLP's."""
        out = self.net((x - self.shift) / self.scale)
        if self.prior:
            out = out + self.prior_weight * x[..., -self.total :]
        return out

    def _logits(self, base: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
        """logit_i for every i given bits (…, L·H) as the earlier decisions (teacher forcing)."""
        before = torch.cumsum(bits, -1) - bits  # kept among heads < i
        left = self.total - torch.arange(self.total, device=bits.device, dtype=bits.dtype)  # heads i … end
        share = (self.k - before) / left
        return base + bits @ (self.pair * self.lower).T + self.rate * share

    def _free(self, bits: torch.Tensor) -> torch.Tensor:
        """Decisions the budget leaves free at each head, given the earlier ones (…, L·H) bool."""
        before = torch.cumsum(bits, -1) - bits
        left = self.total - torch.arange(self.total, device=bits.device, dtype=bits.dtype)
        return (before < self.k) & (self.k - before < left)

    def log_prob(self, x: torch.Tensor, sets: torch.Tensor) -> torch.Tensor:
        """log p(set | x) of keep sets (P, L·H) with exactly k heads each. (P,)"""
        bits = sets.float()
        logits = self._logits(self.base(x), bits)
        per_head = -F.binary_cross_entropy_with_logits(logits, bits, reduction="none")
        return (per_head * self._free(bits)).sum(-1)

    @torch.no_grad()
    def sample(self, x: torch.Tensor, generator: torch.Generator | None = None, greedy: bool = False,
               temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """One keep set per row of x (P, C) and its log-probability under the sampled distribution:
        (P, L·H) bool, (P,). ``temperature`` divides every free decision's logit (< 1: nearer the mode)."""
        base = self.base(x)
        bits = torch.zeros(x.shape[0], self.total, device=x.device)
        logp = torch.zeros(x.shape[0], device=x.device)
        for i in range(self.total):
            logit = self._logits(base, bits)[:, i] / temperature
            taken = bits[:, :i].sum(-1)
            left = self.total - i
            p = torch.sigmoid(logit)
            draw = (p > 0.5).float() if greedy else \
                (torch.rand(p.shape, device=p.device, generator=generator) < p).float()
            draw = torch.where(taken >= self.k, 0.0, torch.where(self.k - taken >= left, 1.0, draw))
            free = (taken < self.k) & (self.k - taken < left)
            logp += torch.where(free, -F.binary_cross_entropy_with_logits(logit, draw, reduction="none"), 0.0)
            bits[:, i] = draw
        return bits > 0.5, logp
