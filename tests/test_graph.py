"""Head-graph indexing, the allowed-edge mask and the storage formats (docs/design.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lookahead.graph import nodes as graph


@pytest.mark.parametrize("n_layers, n_heads", [(1, 1), (2, 3), (4, 4), (16, 16)])
def test_mask_is_layer_ordered_and_counts_edges(n_layers, n_heads):
    mask = graph.allowed_mask(n_layers, n_heads)
    n = graph.n_nodes(n_layers, n_heads)
    assert mask.shape == (n, n) and mask.dtype == torch.bool
    assert int(mask.sum()) == graph.n_edges(n_layers, n_heads)
    assert not mask.diagonal().any() and not (mask & mask.T).any()  # no self loops, no 2-cycles
    assert torch.equal(mask, torch.triu(mask, diagonal=1))  # node order is topological: acyclic
    assert mask[0, 1:].all() and not mask[1:, 0].any()  # the source feeds every head, nothing feeds it
    # a head of layer l reads exactly the source and every head of layers < l
    j = graph.node_index(n_layers - 1, n_heads - 1, n_heads)
    assert int(mask[:, j].sum()) == 1 + (n_layers - 1) * n_heads


def test_olmo2_1b_graph_has_257_nodes():
    assert graph.n_nodes(16, 16) == 257
    assert graph.node_index(0, 0, 16) == 1 and graph.node_index(15, 15, 16) == 256
    assert graph.node_layers(16, 16)[graph.node_index(3, 5, 16)] == 3


def test_dense_edge_vector_and_bits_round_trip(seed):
    mask = graph.allowed_mask(3, 2)
    e = graph.n_edges(3, 2)
    soft = torch.rand(4, 5, e)  # (B, T, E)
    dense = graph.to_dense(soft, mask)
    assert dense.shape == (4, 5, 7, 7) and torch.equal(dense[..., ~mask], torch.zeros_like(dense[..., ~mask]))
    assert torch.equal(graph.to_edges(dense, mask), soft)
    hard = (soft > 0.5).to(torch.uint8)
    packed = graph.pack_bits(hard)
    assert packed.shape == (4, 5, (e + 7) // 8) and packed.dtype == np.uint8
    assert np.array_equal(graph.unpack_bits(packed, e), hard.numpy())
    with pytest.raises(ValueError, match="hard topology"):
        graph.pack_bits(soft)
