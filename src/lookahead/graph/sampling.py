"""Drawing hard topologies from the phase-1 predictor, shared by the pairs stage (which explores
around the predictor's mode) and the diffusion stage (whose baseline sampler is the predictor's own),
and the one edge-bit form every stored or sampled topology takes.

Stored form: the allowed-edge bits of A ⊙ g_j (an edge into a head that is off is dropped). For the
cascade this is the executed graph itself (a head is off exactly when nothing reaches it); for head
gates (``predictor.gate: head``) it is every allowed edge among the active heads, from which the
gates are read back (a head is on iff an edge reaches it: the source's edge does for every head on).
:func:`executed_topology` turns any such bits — stored, or sampled by the diffusion head — into the
graph the runtime runs: the hard cascade, then for head gates every allowed edge out of an active head.
"""

from __future__ import annotations

import torch

from lookahead.graph.gating import head_gates, logistic_noise
from lookahead.graph.nodes import head_graph, to_dense, to_edges
from lookahead.graph.predictor import cascade


def stored_edges(adjacency: torch.Tensor, gates: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The allowed-edge bits (…, E) of a hard topology (A (…, N, N), g (…, N)): A ⊙ g_j."""
    return to_edges(adjacency * gates[..., None, :], mask)


def executed_topology(bits: torch.Tensor, mask: torch.Tensor, n_layers: int, n_heads: int,
                      gate_kind: str = "cascade") -> tuple[torch.Tensor, torch.Tensor]:
    """The executed graph (A (…, N, N), g (…, N)) of allowed-edge bits (…, E) for a predictor of
    ``gate_kind``: the hard cascade, and for head gates every allowed edge out of its active heads."""
    adjacency, gates = cascade(to_dense(bits.float(), mask), n_layers, n_heads, hard=True)
    if gate_kind == "head":
        adjacency = head_graph(gates, n_layers, n_heads)
    return adjacency, gates


def sample_topologies(predictor, contexts: torch.Tensor, features: torch.Tensor | None, flip_prob: float = 0.0,
                      generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Hard samples (A, g) per position from the predictor's own sampler.

    Cascade: its logistic noise on (edge on ⇔ Z + L > 0), then each allowed edge flipped with
    probability ``flip_prob``, then the cascade (so A is the executed graph); ``flip_prob = 0`` is
    exactly ``predictor(…, hard=True)`` in training mode. Head gates: the keep scores with logistic
    noise of scale 1 (whatever noise the predictor trained with) through its budget, then each
    head's gate flipped with probability ``flip_prob``, every allowed edge out of an active head.

    Why the flips: a trained predictor's logits are typically far from 0 (|Z| of thousands on the
    default run), so its own noise almost never changes a bit and every sample of a position is the
    same graph; the diffusion head needs several good topologies per context (docs/pipeline.md).
    """
    was_training = predictor.training
    predictor.train()  # noise on
    try:
        if predictor.cfg.gate == "head":
            return _sample_heads(predictor, contexts, features, flip_prob, generator)
        a_raw = predictor.edges(predictor.logits(contexts, features), generator=generator)
    finally:
        predictor.train(was_training)
    bits = a_raw > 0.5
    if flip_prob > 0:
        flips = torch.rand(bits.shape, device=bits.device, generator=generator) < flip_prob
        bits = bits ^ flips
    bits = bits.to(a_raw.dtype) * predictor.mask
    return cascade(bits, predictor.n_layers, predictor.n_heads, predictor.cfg.gate_k, hard=True)


def _sample_heads(predictor, contexts, features, flip_prob, generator):
    """Head gates' half of :func:`sample_topologies`."""
    cfg = predictor.cfg
    z = predictor.head_logits(contexts, features)
    noise = logistic_noise(z.shape, z.device, z.dtype, generator)
    on = head_gates(z, predictor.n_layers, cfg.estimator, cfg.budget, cfg.keep, cfg.tau, noise, hard=True,
                    layer_counts=getattr(predictor, "layer_keep", None)) > 0.5
    if flip_prob > 0:
        on = on ^ (torch.rand(on.shape, device=on.device, generator=generator) < flip_prob)
    gates = torch.cat([torch.ones_like(z[..., :1]), on.to(z.dtype)], dim=-1)
    return head_graph(gates, predictor.n_layers, predictor.n_heads), gates
