"""Drawing hard topologies from the phase-1 predictor, shared by the pairs stage (which explores
around the predictor's mode) and the diffusion stage (whose baseline sampler is the predictor's own)."""

from __future__ import annotations

import torch

from lookahead.graph.predictor import cascade


def sample_topologies(predictor, contexts: torch.Tensor, features: torch.Tensor | None, flip_prob: float = 0.0,
                      generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Hard samples (A, g) per position: the predictor's own sampler (its logistic noise on,
    edge on ⇔ Z + L > 0), then each allowed edge flipped with probability ``flip_prob``, then the
    cascade (so A is the executed graph). ``flip_prob = 0`` is exactly ``predictor(…, hard=True)``
    in training mode.

    Why the flips: a trained predictor's logits are typically far from 0 (|Z| of thousands on the
    default run), so its own noise almost never changes a bit and every sample of a position is the
    same graph; the diffusion head needs several good topologies per context (DESIGN §2 pairs).
    """
    was_training = predictor.training
    predictor.train()  # noise on
    a_raw = predictor.edges(predictor.logits(contexts, features), generator=generator)
    predictor.train(was_training)
    bits = a_raw > 0.5
    if flip_prob > 0:
        flips = torch.rand(bits.shape, device=bits.device, generator=generator) < flip_prob
        bits = bits ^ flips
    bits = bits.to(a_raw.dtype) * predictor.mask
    return cascade(bits, predictor.n_layers, predictor.n_heads, predictor.cfg.gate_k, hard=True)
