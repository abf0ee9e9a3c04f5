"""The diffusion stage's training data and step object: the pairs' router inputs (:class:`PairFeatures`)
and :class:`DiffusionModule`, the denoiser's batches and loss for the one training loop."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.pairs import PairSet
from lookahead.core.errors import LookaheadError
from lookahead.graph.denoiser import Denoiser, alpha_bar, q_probs
from lookahead.graph.router_inputs import input_dim, lm_states
from lookahead.graph.scoring import GeoLookup
from lookahead.pipeline.diffusion.config import DiffusionConfig


SPLITS = ("train", "val")  # a pair's split (lookahead.artifacts.pairs) → the context cache's


class DiffusionDataError(LookaheadError, ValueError):
    """Pairs, contexts or a predictor that do not fit the diffusion stage."""


class PairFeatures:
    """Conditioning of pairs: the router's inputs (``kind``: ``predictor.input``; ``cache`` reads the
    context cache, the others the LM's states) and the token's geometric features at each pair's
    position, computed once per window."""

    def __init__(self, cache: ContextCache, geo: GeoLookup | None, kind: str = "cache", lm=None):
        self.cache, self.geo, self.kind, self.lm = cache, geo, kind, lm
        self.t_len = cache.context_length
        self._inputs: dict[tuple[int, int], torch.Tensor] = {}

    @property
    def dim(self) -> int:
        hidden = self.lm.config.hidden_size if self.lm is not None else 0
        layers = self.lm.config.num_hidden_layers if self.lm is not None else 1
        return input_dim(self.kind, self.cache.dim, hidden, layers)

    def _windows(self, split: int, windows: np.ndarray) -> torch.Tensor:
        """Router inputs (W, T, C) of windows of one split (0 train, 1 val)."""
        name = SPLITS[split]
        missing = [int(w) for w in np.unique(windows) if (split, int(w)) not in self._inputs]
        for start in range(0, len(missing), 8):
            part = np.asarray(missing[start : start + 8])
            if self.kind == "cache":
                states = torch.from_numpy(np.asarray(self.cache.contexts(name)[part], dtype=np.float32))
            else:
                device = next(self.lm.parameters()).device
                ids = torch.from_numpy(self.cache.windows(name)[part][:, :-1].astype(np.int64)).to(device)
                states = lm_states(self.lm, ids, self.kind).cpu()
            for i, w in enumerate(part):
                self._inputs[(split, int(w))] = states[i]
        return torch.stack([self._inputs[(split, int(w))] for w in windows])

    def __call__(self, rows: np.ndarray, split: np.ndarray | int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(inputs (P, C) float32, geo (P, G) or None) of cache rows (window · T + position) of
        ``split`` (one per row, or one for all)."""
        rows = np.asarray(rows)
        split = np.broadcast_to(np.asarray(split, dtype=np.int64), rows.shape)
        w, p = rows // self.t_len, rows % self.t_len
        inputs = torch.empty(len(rows), self.dim)
        ids = torch.empty(len(rows), dtype=torch.long)
        for s in np.unique(split):
            sel = np.flatnonzero(split == s)
            windows, inverse = np.unique(w[sel], return_inverse=True)
            inputs[sel] = self._windows(int(s), windows)[torch.from_numpy(inverse), torch.from_numpy(p[sel])]
            ids[sel] = torch.from_numpy(self.cache.windows(SPLITS[s])[w[sel], p[sel]].astype(np.int64))
        return inputs, (self.geo(ids) if self.geo is not None else None)


class DiffusionModule:
    """The stage's step object for :func:`lookahead.train.loop.train`: the denoiser learns a_0 from a_t."""

    def __init__(self, model: Denoiser, pairs: PairSet, features: PairFeatures, cfg: DiffusionConfig):
        self.model, self.pairs, self.features, self.cfg = model, pairs, features, cfg
        self.device = torch.device("cpu")
        n_val = min(cfg.val_pairs, len(pairs.heldout))
        pick = np.sort(np.random.default_rng([cfg.seed, 71]).choice(pairs.heldout, n_val, replace=False))
        # fixed noisy draws of the held-out pairs: the val BCE compares like with like across steps
        self.val = self._noised(pick, np.random.default_rng([cfg.seed, 72]))
        self.last_eval: dict = {}

    def place(self, device) -> None:
        self.device = torch.device(device)

    def _noised(self, idx: np.ndarray, rng: np.random.Generator) -> dict:
        a0 = self.pairs.edges[idx].float()
        t = torch.from_numpy(1.0 - rng.random(len(idx))).float()  # (0, 1]
        u = torch.from_numpy(rng.random(a0.shape, dtype=np.float32))
        probs = q_probs(a0, alpha_bar(t, self.model.cfg.schedule_offset)[:, None], self.model.marginal.cpu())
        contexts, geo = self.features(self.pairs.rows[idx], self.pairs.split[idx])
        batch = {"a0": a0, "a_t": (u < probs).float(), "t": t, "contexts": contexts}
        if geo is not None:
            batch["geo"] = geo
        return batch

    def batch(self, step: int) -> dict:
        t = self.cfg.train
        rng = np.random.default_rng([t.seed, step, 80])
        return self._noised(rng.choice(self.pairs.train, t.batch_size), rng)

    def loss(self, model, batch: dict) -> torch.Tensor:
        logits = model(batch["a_t"], batch["t"], batch["contexts"], batch.get("geo"))
        return F.binary_cross_entropy_with_logits(logits, batch["a0"])

    def tokens(self, batch: dict) -> int:
        return batch["a0"].shape[0]  # graphs

    @torch.no_grad()
    def evaluate(self, model) -> dict[str, float]:
        """BCE of the a_0 logits on the fixed noisy draws of held-out pairs, and bit accuracy."""
        total, correct, count = 0.0, 0.0, 0
        rows = self.val["a0"].shape[0]
        for start in range(0, rows, 512):
            part = {k: v[start : start + 512].to(self.device) for k, v in self.val.items()}
            logits = model(part["a_t"], part["t"], part["contexts"], part.get("geo")).float()
            total += F.binary_cross_entropy_with_logits(logits, part["a0"], reduction="sum").item()
            correct += ((logits > 0).float() == part["a0"]).sum().item()
            count += part["a0"].numel()
        self.last_eval = {"val_bce": total / count, "val_bit_accuracy": correct / count}
        return self.last_eval


def input_scale(inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-feature mean and sd (floored) of training inputs (P, C), to standardise them."""
    return inputs.mean(0), inputs.std(0).clamp_min(1e-4)
