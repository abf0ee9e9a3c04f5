"""The causality check (docs/design.md): a decoder's topology and the LM's logits at positions <= t
must not change when tokens after t do — run with the real context encoder on perturbed val text."""

from __future__ import annotations

import numpy as np
import torch

from lookahead.artifacts.contexts import ContextCache
from lookahead.graph.runtime import forward_with_topology
from lookahead.graph.scoring import GeoLookup
from lookahead.pipeline.evaluate.config import EvaluateConfig
from lookahead.pipeline.evaluate.rows import Topologies


@torch.no_grad()
def causality_check(decoders: dict[str, tuple[object, Topologies]], encoder, cache: ContextCache, geo: GeoLookup,
                    cfg: EvaluateConfig, vocab_size: int, device, skip: str = "full") -> dict:
    """The lookahead contract (docs/design.md) on real val text with the real encoder: for each of ``causality_windows`` val windows and
    ``causality_cuts`` cut points t, the tokens after t are replaced by random ones, the contexts are
    encoded again, and every decoder's topology (A, g) and its LM's logits at positions <= t are
    compared with those of the original window. Each decoder is called once per window with its
    generator seeded the same, so a sampler draws the same numbers at the same positions.

    Returns the largest change at <= t per decoder (and overall), and the share of positions > t whose
    logits did change (evidence that the perturbation reached the model)."""
    windows = torch.from_numpy(cache.windows("val")[: cfg.causality_windows, :-1].astype(np.int64))
    t_len = windows.shape[1]
    cuts = sorted({int(c) for c in np.linspace(t_len // 4, 3 * t_len // 4, cfg.causality_cuts)})
    gen = torch.Generator().manual_seed(cfg.seed)
    variants, cut_of = [], []
    for w in windows:
        variants.append(w)
        cut_of.append(None)
        for cut in cuts:
            changed = w.clone()
            tail = torch.randint(0, vocab_size, (t_len - cut - 1,), generator=gen)
            changed[cut + 1 :] = torch.where(tail == w[cut + 1 :], (tail + 1) % vocab_size, tail)  # every later token differs
            variants.append(changed)
            cut_of.append(cut)
    ids = torch.stack(variants)
    contexts = encoder.encode(ids).to(device)  # (V, T, C)
    ids = ids.to(device)
    features = geo(ids)
    per_decoder, after_changed = {}, []
    for name, (lm, topologies) in decoders.items():
        outs = []
        for i in range(len(ids)):  # one call per window: the same generator state for each
            (adjacency, gates), = topologies(ids[i : i + 1], contexts[i : i + 1], features[i : i + 1])
            logits = forward_with_topology(lm, ids[i : i + 1], adjacency, gates, hard=True, skip=skip)
            outs.append((adjacency[0], gates[0], logits[0]))
        worst = 0.0
        for i, cut in enumerate(cut_of):
            if cut is None:
                original = outs[i]
                continue
            upto = slice(0, cut + 1)
            a, g, logit = outs[i]
            worst = max(worst, (a[upto] - original[0][upto]).abs().max().item(),
                        (g[upto] - original[1][upto]).abs().max().item(),
                        (logit[upto] - original[2][upto]).abs().max().item())
            after_changed.append(((logit[cut + 1 :] - original[2][cut + 1 :]).abs().amax(-1) > 0).float().mean().item())
        per_decoder[name] = worst
    return {"max_change": max(per_decoder.values()), "per_decoder": per_decoder, "cuts": cuts,
            "windows": int(len(windows)), "after_cut_changed_fraction": float(np.mean(after_changed)),
            "tolerance": cfg.causality_tolerance, "passed": max(per_decoder.values()) <= cfg.causality_tolerance}
