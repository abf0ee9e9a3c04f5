"""Init stage: eigen-embedding, Procrustes and head factors against closed forms."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import special_ortho_group

from lookahead.pipeline.init import (
    InitError,
    alignment_cosine,
    eigen_embedding,
    extend_by_neighbors,
    head_factors,
    procrustes_projection,
    reconstruction_correlation,
)


def test_gram_matrix_of_low_rank_is_reconstructed_exactly():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 5))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    gram = x @ x.T  # cosine matrix of rank 5
    emb, values = eigen_embedding(gram, n_geo=5)
    assert emb.shape == (60, 5) and np.allclose(np.linalg.norm(emb, axis=1), 1.0)
    assert reconstruction_correlation(gram, emb) == pytest.approx(1.0, abs=1e-9)
    assert np.allclose(emb @ emb.T, gram, atol=1e-9)  # unit rows: the cosine matrix itself
    assert (values > 0).all()


def test_too_many_dimensions_is_a_clear_error():
    with pytest.raises(InitError, match="n_geo is 9 but there are only 4 anchors"):
        eigen_embedding(np.eye(4), 9)


def test_procrustes_recovers_a_known_rotation():
    rng = np.random.default_rng(1)
    geo = rng.normal(size=(100, 6))
    geo /= np.linalg.norm(geo, axis=1, keepdims=True)
    geo = np.concatenate([geo, -geo])  # zero mean, so that PCA's centring changes nothing
    rotation = special_ortho_group.rvs(6, random_state=2)
    embed = np.linalg.qr(rng.normal(size=(40, 6)))[0]  # (d=40, 6) orthonormal columns: a 6-dim subspace
    resid = 3.0 + (geo @ rotation) @ embed.T  # residual encodings living in that subspace, offset
    fit = procrustes_projection(geo, resid, n_geo=6)
    assert alignment_cosine(geo, resid, fit)["mean"] == pytest.approx(1.0, abs=1e-9)
    # mapping geometric points through the projection lands on their residual encodings
    assert np.allclose(geo @ fit["projection"] + fit["mean"], resid, atol=1e-9)


def test_neighbor_extension_of_an_anchor_copy_is_that_anchor():
    rng = np.random.default_rng(3)
    anchor_emb = rng.normal(size=(10, 4))
    anchor_emb /= np.linalg.norm(anchor_emb, axis=1, keepdims=True)
    static = rng.normal(size=(10, 16))
    out = extend_by_neighbors(anchor_emb, static, static[[2, 7]], k=3, temp=1e-4)  # near-hard softmax
    assert np.allclose(out, anchor_emb[[2, 7]], atol=1e-6)
    soft = extend_by_neighbors(anchor_emb, static, static[[2]], k=10, temp=1e6)  # uniform weights
    mean = anchor_emb.mean(0)
    assert np.allclose(soft[0], mean / np.linalg.norm(mean), atol=1e-5)


def test_head_factors_reconstruct_a_low_rank_affinity_with_the_source_node_first():
    rng = np.random.default_rng(4)
    q = np.linalg.qr(rng.normal(size=(12, 3)))[0]
    affinity = q @ np.diag([2.0, -1.0, 0.5]) @ q.T  # rank 3, one negative eigenvalue
    u, v = head_factors(affinity, rank=3)
    assert u.shape == v.shape == (13, 3)
    assert np.allclose(u[0], 0) and np.allclose(v[0], 0)  # node 0 = token-embedding source
    assert np.allclose(u[1:] @ v[1:].T, affinity, atol=1e-5)
    u1, v1 = head_factors(affinity, rank=1)  # the largest |eigenvalue| only
    assert np.allclose(u1[1:] @ v1[1:].T, 2.0 * np.outer(q[:, 0], q[:, 0]), atol=1e-5)
    with pytest.raises(InitError, match="rank is 20 but the model has only 12 heads"):
        head_factors(affinity, 20)
