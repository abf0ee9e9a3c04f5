"""Structure decoders on equal terms (issue: a structure decoder that captures several good
topologies), judged on the pairs stage's ε-good keep sets of the val windows.

Every decoder reads the same inputs, the router's (``predictor.input``, under the lookahead contract)
with the token's geometric features, and returns keep sets of exactly K heads:

- ``router``: the phase-1 MLP router, top-K of its keep scores (deterministic, one set);
- ``baseline``: its sampler, the keep scores plus logistic noise of scale 1 through the top-K budget;
- ``autoregressive``: :class:`lookahead.graph.keepsets.KeepSetAR`, trained here by maximum likelihood
  on the train windows' ε-good sets (an exact distribution over the C(L·H, K) sets);
- ``diffusion``: the diffusion head (docs/pipeline.md) over the sets' edge bits, its last step's sample
  brought to K heads (:meth:`lookahead.graph.denoiser.Denoiser.sample_keep_sets`).

Beside each sampling decoder, three nulls: ``_marginals`` (independent heads at the decoder's own
per-context inclusion rates, estimated from its samples there), ``_frequency`` (independent heads at
its inclusion rates over all contexts: context-blind) and ``_shuffled`` (the decoder fed another
position's inputs); and one shared null, ``static``: the K heads most often in the train windows'
ε-good sets at every position.

Figures per sampler, on the val windows: ``recall_at_n`` (the mean over positions of the share of a
position's ε-good sets equal to one of its first n samples), ``sample_nll`` (the LM NLL, each
position running its own sample, one forward per sample index), ``best_of_k_label_free_nll``
(the NLL of the sample of least KL(dense ‖ routed) at each position: chosen without the label) and
``best_of_k_target_nll`` (the least NLL: chosen with the label, for reference only).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from lookahead.graph.keepsets import KeepSetAR, as_gates, marginal_sets, recall_at
from lookahead.graph.nodes import head_graph, topk_set
from lookahead.graph.oracle import DenseKL
from lookahead.graph.plan import execute
from lookahead.lm.nll import token_nll

FIGURES = ("recall_at_1", "recall_at_4", "recall_at_8", "sample_nll", "best_of_k_label_free_nll",
           "best_of_k_target_nll", "sample_kl", "distinct_per_position")
DECODERS = ("baseline", "autoregressive", "diffusion")
NULLS = ("marginals", "frequency", "shuffled")
SAMPLERS = ("router", "static", *(name for d in DECODERS for name in (d, *(f"{d}_{n}" for n in NULLS))))
"""Every sampler :func:`judge` reports, in the table's order: the references, then each decoder and its nulls."""

Draw = Callable[[torch.Tensor, torch.Tensor | None, torch.Generator], torch.Tensor]
"""(router inputs (P, C), geometric features (P, G) or None, generator) → keep sets (P, L·H) bool."""


def train_autoregressive(inputs: torch.Tensor, sets: torch.Tensor, k: int, steps: int, batch_size: int, lr: float,
                         seed: int, hidden: int = 128, scale: tuple[torch.Tensor, torch.Tensor] | None = None,
                         prior: bool = False) -> tuple[KeepSetAR, list[float]]:
    """Fit :class:`KeepSetAR` to (inputs (P, C), keep sets (P, L·H)) pairs by maximum likelihood (Adam,
    cosine decay); ``scale``: the inputs' (mean, sd) to standardise them by. Return the model (eval
    mode) and the loss every 50 steps. ``prior``: the inputs' last L·H columns are prior logits
    (:class:`KeepSetAR`)."""
    torch.manual_seed(seed)
    model = KeepSetAR(inputs.shape[1], sets.shape[1], k, hidden, prior)
    if scale is not None:
        model.shift.copy_(scale[0])
        model.scale.copy_(scale[1])
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(steps, 1), eta_min=lr * 0.1)
    gen = torch.Generator().manual_seed(seed)
    curve = []
    for step in range(steps):
        pick = torch.randint(0, inputs.shape[0], (batch_size,), generator=gen)
        loss = -model.log_prob(inputs[pick], sets[pick]).mean()
        if not torch.isfinite(loss):
            raise FloatingPointError(f"autoregressive decoder: loss {loss.item()} at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            curve.append(float(loss.detach()))
    return model.eval(), curve


class Scorer:
    """LM NLL and KL to dense, at every position of the val windows, of keep sets (P, S, L·H) given
    per position (P = windows · T in window order)."""

    def __init__(self, lm, windows: torch.Tensor, n_layers: int, n_heads: int, skip: str, batch_size: int):
        self.lm, self.windows, self.skip = lm, windows, skip
        self.n_layers, self.n_heads, self.batch_size = n_layers, n_heads, batch_size
        self.t_len = windows.shape[1] - 1
        self._kl, self.dense_nll = [], []
        with torch.no_grad():
            for start in range(0, len(windows), batch_size):
                w = windows[start : start + batch_size]
                logits = lm(input_ids=w[:, :-1]).logits
                self._kl.append(DenseKL(F.log_softmax(logits.float(), -1)))
                self.dense_nll.append(token_nll(logits, w[:, 1:]).flatten())
        self.dense_nll = torch.cat(self.dense_nll)

    @torch.no_grad()
    def __call__(self, sets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(NLL (P, S), KL (P, S))."""
        nlls, kls = [], []
        for b, start in enumerate(range(0, len(self.windows), self.batch_size)):
            w = self.windows[start : start + self.batch_size]
            ids, targets = w[:, :-1], w[:, 1:]
            part = sets[start * self.t_len : (start + len(w)) * self.t_len]  # (p, S, L·H)
            n, k = [], []
            for s in range(sets.shape[1]):
                gates = as_gates(part[:, s]).view(len(w), self.t_len, -1).to(ids.device)
                logits = execute(self.lm, ids, head_graph(gates, self.n_layers, self.n_heads), gates, self.skip)
                n.append(token_nll(logits, targets).flatten())
                k.append(self._kl[b](logits).flatten())
            nlls.append(torch.stack(n, -1))
            kls.append(torch.stack(k, -1))
        return torch.cat(nlls).cpu(), torch.cat(kls).cpu()


def figures_of(sets: torch.Tensor, nll: torch.Tensor, kl: torch.Tensor, truth: torch.Tensor, valid: torch.Tensor,
               has_truth: torch.Tensor) -> dict[str, float]:
    """A sampler's figures from its keep sets (P, S, L·H), their NLL and KL (P, S), and the ε-good sets
    (P, M, L·H) with ``valid`` (P, M) at the positions ``has_truth`` (P,) bool."""
    recall = recall_at(sets[has_truth], truth[has_truth], valid[has_truth])
    pick = kl.argmin(-1, keepdim=True)
    distinct = [len({row.numpy().tobytes() for row in sets[p]}) for p in range(sets.shape[0])]
    return {
        **{f"recall_at_{n}": float(r.mean()) for n, r in recall.items()},
        "sample_nll": float(nll.mean()), "best_of_k_label_free_nll": float(nll.gather(-1, pick).mean()),
        "best_of_k_target_nll": float(nll.min(-1).values.mean()), "sample_kl": float(kl.mean()),
        "distinct_per_position": float(np.mean(distinct)),
    }


TOKEN_FIGURES = ("recall_at_8", "best_of_k_label_free_nll")
"""The figures the decoders' paired claims read at every val position (:func:`token_figures_of`)."""


def token_figures_of(sets: torch.Tensor, nll: torch.Tensor, kl: torch.Tensor, truth: torch.Tensor,
                     valid: torch.Tensor) -> dict[str, np.ndarray]:
    """:data:`TOKEN_FIGURES` at every position (P,): recall@8 of the position's ε-good sets (0 where it
    has none: the claims weigh positions by ``has_truth``) and the NLL of the set of least KL to dense."""
    return {"recall_at_8": recall_at(sets, truth, valid, ns=(8,))[8].numpy(),
            "best_of_k_label_free_nll": nll.gather(-1, kl.argmin(-1, keepdim=True))[:, 0].numpy()}


def judge(draws: dict[str, Draw], deterministic: torch.Tensor, static: torch.Tensor, scorer: Scorer,
          inputs: torch.Tensor, geo: torch.Tensor | None, truth: torch.Tensor, valid: torch.Tensor,
          has_truth: torch.Tensor, k: int, samples: int, seed: int
          ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, np.ndarray]]]:
    """Every decoder of ``draws`` and its nulls, the deterministic router and the static null, side by
    side: ({sampler: figures}, {sampler: :func:`token_figures_of`} for the decoders and their
    frequency-matched nulls). ``inputs`` (P, C) and ``geo`` (P, G) are the val positions' inputs."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(inputs.shape[0], generator=gen)
    sets: dict[str, torch.Tensor] = {}
    seconds: dict[str, float] = {}
    for name, draw in draws.items():
        tic = time.perf_counter()
        sets[name] = torch.stack([draw(inputs, geo, gen) for _ in range(samples)], 1)  # (P, S, L·H)
        seconds[name] = time.perf_counter() - tic
        sets[f"{name}_shuffled"] = torch.stack([draw(inputs[perm], None if geo is None else geo[perm], gen)
                                                for _ in range(samples)], 1)
        own = sets[name].float().mean(1)  # (P, L·H) per-context inclusion rates
        sets[f"{name}_marginals"] = torch.stack([marginal_sets(own, k, gen) for _ in range(samples)], 1)
        every = own.mean(0).expand_as(own)
        sets[f"{name}_frequency"] = torch.stack([marginal_sets(every, k, gen) for _ in range(samples)], 1)
    sets["router"] = deterministic[:, None]
    sets["static"] = static.expand(inputs.shape[0], 1, -1)
    out, tokens = {}, {}
    for name, s in sets.items():
        nll, kl = scorer(s)
        out[name] = figures_of(s, nll, kl, truth, valid, has_truth)
        if name in seconds:
            out[name]["sets_per_s"] = inputs.shape[0] * samples / max(seconds[name], 1e-9)
        if name in seconds or name.endswith("_frequency"):
            tokens[name] = token_figures_of(s, nll, kl, truth, valid)
    out["dense"] = {"sample_nll": float(scorer.dense_nll.mean())}
    return out, tokens


def truth_sets(rows: np.ndarray, sets: torch.Tensor, positions: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ε-good sets by position: pairs' rows (n,) and keep sets (n, L·H) → (sets (P, M, L·H),
    valid (P, M), has_truth (P,)) over positions 0 … P − 1 (window index · T + position)."""
    counts = np.bincount(rows, minlength=positions)
    width = max(1, int(counts.max()))
    out = torch.zeros(positions, width, sets.shape[1], dtype=torch.bool)
    valid = torch.zeros(positions, width, dtype=torch.bool)
    order = np.argsort(rows, kind="stable")
    slot = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    out[rows[order], slot] = sets[order]
    valid[rows[order], slot] = True
    return out, valid, torch.from_numpy(counts > 0)


def static_set(sets: torch.Tensor, k: int) -> torch.Tensor:
    """The K heads most often in keep sets (n, L·H) (ties to the lower index): the static null."""
    return topk_set(sets.float().mean(0), k)
