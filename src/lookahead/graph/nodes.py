"""The head graph of a decoder (docs/design.md): nodes, allowed edges and their storage formats.

Node 0 is the token-embedding source; node ``1 + l·H + h`` is head h of layer l (N = 1 + L·H).
An edge i → j is allowed when layer(i) < layer(j), the source being at layer −1: the mask is block
upper-triangular, so every allowed adjacency is acyclic by construction.

Under ``runtime.unit: group`` (grouped-query attention) a node is a whole key/value group: node
``1 + l·G + g`` is group g of layer l, N = 1 + L·G. Everything that counts or selects nodes works
on that graph; the executors widen it to query heads at their entry (:func:`widen`: a head takes its
group's gate, an edge between heads its groups' weight), and per-head statistics enter it summed over
each group's heads (:func:`pool`).

Three interchangeable forms of one topology:

- dense adjacency (…, N, N), zero outside the allowed mask;
- the allowed-edge vector (…, E): the mask's True entries in row-major order;
- bit-packed bytes (…, ceil(E / 8)) of a hard edge vector (numpy ``packbits``, big bit order).
"""

from __future__ import annotations

import numpy as np
import torch


def n_nodes(n_layers: int, n_heads: int) -> int:
    return 1 + n_layers * n_heads


def node_index(layer: int, head: int, n_heads: int) -> int:
    """Index of head ``head`` of layer ``layer``."""
    return 1 + layer * n_heads + head


def node_layers(n_layers: int, n_heads: int) -> torch.Tensor:
    """Layer of every node, the source at −1. (N,) int64"""
    return torch.cat([torch.tensor([-1]), torch.arange(n_layers).repeat_interleave(n_heads)])


def allowed_mask(n_layers: int, n_heads: int) -> torch.Tensor:
    """Allowed edges i → j (layer(i) < layer(j)). (N, N) bool"""
    layer = node_layers(n_layers, n_heads)
    return layer[:, None] < layer[None, :]


def head_graph(gates: torch.Tensor, n_layers: int, n_heads: int) -> torch.Tensor:
    """Every allowed edge out of an active head (each head reads the standard stream): gates (…, N)
    → adjacency (…, N, N). The graph static pruning runs and ``predictor.gate: head`` predicts."""
    return allowed_mask(n_layers, n_heads).to(gates.device, gates.dtype) * gates[..., :, None]


def baseline_graph(gates: torch.Tensor, n_layers: int, n_heads: int, skip: str) -> torch.Tensor:
    """The graph a baseline (static pruning, random heads) runs for gates (…, N): every allowed edge
    among the heads that are on; under ``runtime.skip: query`` also the edges into the heads that
    are off, which there are their key and value inputs (the standard stream: :func:`head_graph`)."""
    if skip == "query":
        return head_graph(gates, n_layers, n_heads)
    return allowed_mask(n_layers, n_heads).to(gates.device, gates.dtype) * gates[..., :, None] * gates[..., None, :]


def random_topology(n_layers: int, n_heads: int, fraction: float, shape: tuple[int, ...],
                    generator: torch.Generator | None, skip: str = "full", device=None,
                    exact: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Random per-position heads, the null of every per-token choice (phase 1, pairs, evaluate):
    gates (*shape, N), each head on with probability ``fraction`` at each position — or, ``exact``,
    exactly round(fraction · L·H) heads at each position, a uniform choice (the null of a top-K
    router) — the source always, and the baseline graph among them (:func:`baseline_graph`). Draws
    ``torch.rand`` of shape (*shape, N) from ``generator`` on ``device``."""
    scores = torch.rand(*shape, 1 + n_layers * n_heads, generator=generator, device=device)
    if exact:
        gates = torch.zeros_like(scores)
        heads = gates[..., 1:]
        heads.scatter_(-1, scores[..., 1:].topk(round(fraction * n_layers * n_heads), -1).indices, 1.0)
    else:
        gates = (scores < fraction).float()
    gates[..., 0] = 1.0
    return baseline_graph(gates, n_layers, n_heads, skip), gates


def static_gates(importance: torch.Tensor, k: int) -> torch.Tensor:
    """Static pruning's gates (1 + L·H,): the source and the ``k`` most important heads of ``importance``
    (L, H) (the probe's, ties in node order)."""
    order = torch.argsort(importance.flatten(), descending=True, stable=True)  # most important first
    gates = torch.zeros(1 + importance.numel())
    gates[0] = 1.0
    gates[1 + order[:k]] = 1.0
    return gates


def static_topology(importance: torch.Tensor, fraction: float, skip: str = "full") -> tuple[torch.Tensor, torch.Tensor]:
    """Static pruning at ``fraction`` of the heads: the round(fraction · L·H) most important heads and
    the baseline graph among them (:func:`baseline_graph`). (N, N), (N,)"""
    n_layers, n_heads = importance.shape
    gates = static_gates(importance, round(fraction * n_layers * n_heads))
    return baseline_graph(gates, n_layers, n_heads, skip), gates


def unit_nodes(n_layers: int, n_heads: int, group: int) -> torch.Tensor:
    """For each node of the query-head graph (1 + L·H), the node of the key/value-group graph
    (1 + L·H/group) that holds it: the source 0, head h of layer l in group h // group. (N,) int64"""
    return torch.cat([torch.zeros(1, dtype=torch.long), 1 + torch.arange(n_layers * n_heads) // group])


def widen(x: torch.Tensor | None, n_layers: int, n_heads: int, group: int, dims: int = 1) -> torch.Tensor | None:
    """Gates (…, 1 + L·G) (``dims=1``) or an adjacency (…, 1 + L·G, 1 + L·G) (``dims=2``) over
    key/value groups, as the same topology over query heads (…, 1 + L·H): every head of a group takes
    its gate, every edge between heads the weight between their groups (differentiable). Anything
    else — already over heads, a model without groups, None — is returned as it is."""
    if x is None or group == 1 or x.shape[-1] != n_nodes(n_layers, n_heads // group):
        return x
    index = unit_nodes(n_layers, n_heads, group).to(x.device)
    for axis in range(x.dim() - dims, x.dim()):
        x = x.index_select(axis, index)
    return x


def pool(x, group: int, dims: int = 1):
    """A per-head statistic over heads in the last ``dims`` axes (each of L·H, or H) summed over each
    key/value group's ``group`` heads: (…, L, H) → (…, L, H/group); a head affinity (L·H, L·H) →
    (L·G, L·G) with ``dims=2``. Numpy arrays and tensors alike; ``group`` 1 returns ``x``."""
    if group == 1:
        return x
    for axis in range(x.ndim - dims, x.ndim):
        shape = tuple(x.shape)
        x = x.reshape(*shape[:axis], shape[axis] // group, group, *shape[axis + 1:]).sum(axis + 1)
    return x


def n_edges(n_layers: int, n_heads: int) -> int:
    """Number of allowed edges: H from the source to each head, plus H² for each pair of layers."""
    return n_layers * n_heads + n_heads**2 * n_layers * (n_layers - 1) // 2


def to_edges(adjacency: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Dense (…, N, N) → allowed-edge vector (…, E)."""
    return adjacency[..., mask]


def to_dense(edges: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Allowed-edge vector (…, E) → dense (…, N, N), zero outside the mask."""
    n = mask.shape[0]
    dense = edges.new_zeros(*edges.shape[:-1], n, n)
    dense[..., mask] = edges
    return dense


def pack_bits(edges: np.ndarray | torch.Tensor) -> np.ndarray:
    """Hard edge vector(s) (…, E) of 0/1 → bytes (…, ceil(E / 8)) uint8."""
    bits = edges.detach().cpu().numpy() if isinstance(edges, torch.Tensor) else np.asarray(edges)
    if not np.isin(bits, (0, 1)).all():
        raise ValueError("pack_bits takes a hard topology: every edge must be 0 or 1")
    return np.packbits(bits.astype(np.uint8), axis=-1)


def unpack_bits(packed: np.ndarray, n_edges_: int) -> np.ndarray:
    """Bytes (…, ceil(E / 8)) → edge vector(s) (…, E) uint8."""
    return np.unpackbits(np.asarray(packed, dtype=np.uint8), axis=-1, count=n_edges_)


def keep_count(n_heads_total: int, n_layers: int, keep: float, per_layer: bool) -> int:
    """Heads kept per token (all layers: K of L·H) or per layer (K/L of H) for a kept fraction."""
    if per_layer:
        per = n_heads_total // n_layers
        return max(1, min(per, round(keep * per)))
    return max(1, min(n_heads_total, round(keep * n_heads_total)))


def top_k_gates(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Per-position gates (…, N) keeping the k heads of largest score (…, L·H); the source on."""
    keep = torch.zeros_like(scores).scatter_(-1, torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k], 1.0)
    return torch.cat([torch.ones_like(keep[..., :1]), keep], -1)


def topk_set(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The keep set of the k largest scores (…, L·H), ties to the lower head index
    (:func:`top_k_gates` without the source)."""
    return top_k_gates(scores, k)[..., 1:] > 0.5


def running_heads(gates: torch.Tensor) -> torch.Tensor:
    """Which heads run (…, L·H), 0/1 in the gates' dtype, under gates (…, N) (the source first): gate > 0 —
    a gate-weighted head (``phase2.gate_weights: softmax``) runs at any weight, so it counts whole."""
    return (gates[..., 1:] > 0).to(gates.dtype)
