"""Geometric measures against closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lookahead.semantics import geometry


def regular_simplex(k: int, edge: float) -> np.ndarray:
    """k+1 vertices of a regular k-simplex with the given edge: scaled standard basis of R^(k+1)."""
    return np.eye(k + 1) * edge / math.sqrt(2)


def test_cayley_menger_volume_of_regular_simplices():
    assert geometry.cayley_menger_volume(regular_simplex(4, 2.0)) == pytest.approx(2.0**4 * math.sqrt(5) / 96)
    assert geometry.cayley_menger_volume(regular_simplex(2, 3.0)) == pytest.approx(math.sqrt(3) / 4 * 9)
    # degenerate: 5 points on a line have no 4-volume
    line = np.outer(np.arange(5.0), np.ones(6))
    assert geometry.cayley_menger_volume(line) == pytest.approx(0.0, abs=1e-6)


def test_participation_ratio_isotropic_vs_rank_one(seed):
    rng = np.random.default_rng(0)
    iso = rng.normal(size=(20000, 16))
    rank1 = np.outer(rng.normal(size=5000), rng.normal(size=16))
    assert geometry.participation_ratio(geometry.eigenspectrum(iso)) == pytest.approx(16, rel=0.02)
    assert geometry.participation_ratio(geometry.eigenspectrum(rank1)) == pytest.approx(1.0, rel=1e-6)
    assert geometry.participation_ratio(np.ones(7)) == pytest.approx(7.0)


def test_dims_for_variance_closed_form():
    spectrum = np.array([0.5, 0.3, 0.15, 0.04, 0.01])
    assert geometry.dims_for_variance(spectrum) == {"dims_80": 2, "dims_90": 3, "dims_95": 3, "dims_99": 4}
    assert geometry.dims_for_variance(np.array([0.25] * 4), (0.5, 0.51)) == {"dims_50": 2, "dims_51": 3}


def test_matrix_geometry_closed_forms():
    eye = geometry.matrix_geometry(np.eye(8))
    assert eye["stable_rank"] == pytest.approx(8) and eye["condition_number"] == pytest.approx(1)
    assert eye["frac_below_0.1"] == pytest.approx(56 / 64)
    rank1 = geometry.matrix_geometry(np.outer(np.arange(1.0, 5.0), np.arange(1.0, 4.0)))
    assert rank1["stable_rank"] == pytest.approx(1) and rank1["rank_90"] == 1


def test_bilinear_spectrum_of_symmetric_and_antisymmetric_forms():
    rng = np.random.default_rng(1)
    w = rng.normal(size=(6, 6))
    sym = geometry.bilinear_spectrum(w, w)  # W^T W: symmetric positive semi-definite
    assert sym["qk_symmetry_deviation"] == pytest.approx(0, abs=1e-12) and sym["qk_neg_eig_share"] == pytest.approx(0, abs=1e-12)
    a = rng.normal(size=(6, 6))
    anti = geometry.bilinear_spectrum(np.eye(6), a - a.T)
    assert anti["qk_symmetry_deviation"] == pytest.approx(1.0)


def test_pentachoron_cv_of_a_gaussian_matches_its_reference():
    rng = np.random.default_rng(2)
    cloud = rng.normal(0, 3.0, size=(4000, 32))
    out = geometry.pentachoron_cv(cloud, 400, np.random.default_rng(3))
    assert out["cv_ratio"] == pytest.approx(1.0, abs=0.2)


def test_sampled_cosines_of_identical_directions_are_one():
    x = np.outer(np.arange(1.0, 11.0), np.ones(4))
    assert np.allclose(geometry.sampled_cosines(x, 50, np.random.default_rng(0)), 1.0)
