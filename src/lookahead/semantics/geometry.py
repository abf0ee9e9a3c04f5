"""Geometric measures of point clouds and weight matrices (the seed notebook "geometric terrain").

Pure functions on numpy arrays; the probe stage applies them to embeddings and weights. Sampled
measures take a ``numpy.random.Generator`` so that the stage can repeat them over seeds.
"""

from __future__ import annotations

import math

import numpy as np

VARIANCE_LEVELS = (0.8, 0.9, 0.95, 0.99)
SPARSITY_THRESHOLDS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` scaled to unit norm (zero rows stay zero)."""
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of ``a`` with the same row of ``b``. (n,)"""
    return np.einsum("nd,nd->n", unit_rows(a), unit_rows(b))


def norm_percentiles(x: np.ndarray, percentiles=(5, 25, 50, 75, 95)) -> dict[str, float]:
    """Percentiles of the row norms of ``x`` (n, d)."""
    norms = np.linalg.norm(x, axis=1)
    return {f"p{p}": float(v) for p, v in zip(percentiles, np.percentile(norms, percentiles))}


def sampled_cosines(x: np.ndarray, n_pairs: int, rng: np.random.Generator) -> np.ndarray:
    """Cosine similarity of ``n_pairs`` random pairs of distinct rows of ``x`` (n, d). (P,)"""
    n = len(x)
    i = rng.integers(0, n, size=n_pairs)
    j = (i + rng.integers(1, n, size=n_pairs)) % n  # j != i
    return row_cosines(x[i], x[j])


def eigenspectrum(x: np.ndarray) -> np.ndarray:
    """Eigenvalues of the covariance of the rows of ``x`` (n, d), descending, summing to 1."""
    centered = x - x.mean(axis=0, keepdims=True)
    s = np.linalg.svd(centered, compute_uv=False)  # squared singular values ∝ covariance eigenvalues
    eig = s**2
    return eig / eig.sum()


def participation_ratio(values: np.ndarray) -> float:
    """(Σλ)² / Σλ²: the effective number of dimensions of a spectrum (1 for rank 1, d for isotropic)."""
    values = np.asarray(values, dtype=np.float64)
    return float(values.sum() ** 2 / np.sum(values**2))


def dims_for_variance(spectrum: np.ndarray, levels=VARIANCE_LEVELS) -> dict[str, int]:
    """Smallest number of leading components holding each share of the variance."""
    cumulative = np.cumsum(np.sort(spectrum)[::-1]) / np.sum(spectrum)
    return {f"dims_{round(level * 100)}": int(np.searchsorted(cumulative, level - 1e-12) + 1) for level in levels}


def cayley_menger_volume(points: np.ndarray) -> float:
    """Volume of the simplex spanned by the k+1 rows of ``points`` (k+1, d), from the Cayley-Menger
    determinant: V² = (-1)^(k+1) det(CM) / (2^k (k!)²)."""
    m = len(points)
    k = m - 1
    d2 = np.sum((points[:, None, :] - points[None, :, :]) ** 2, axis=-1)
    cm = np.ones((m + 1, m + 1))
    cm[0, 0] = 0.0
    cm[1:, 1:] = d2
    v2 = (-1) ** (k + 1) * np.linalg.det(cm) / (2**k * math.factorial(k) ** 2)
    return float(math.sqrt(max(v2, 0.0)))


def pentachoron_cv(x: np.ndarray, n_samples: int, rng: np.random.Generator) -> dict[str, float]:
    """Coefficient of variation of the volumes of random 4-simplices (5 rows of ``x``), and the
    same for an isotropic Gaussian cloud of the same size and total variance."""
    n, d = x.shape
    scale = math.sqrt(float(np.var(x - x.mean(axis=0), axis=0).sum()) / d)
    gauss = rng.normal(0.0, scale, size=(n, d))

    def cv(cloud: np.ndarray) -> float:
        vols = np.array([cayley_menger_volume(cloud[rng.choice(n, 5, replace=False)]) for _ in range(n_samples)])
        return float(vols.std() / max(vols.mean(), 1e-300))

    ours, reference = cv(x), cv(gauss)
    return {"pentachoron_cv": ours, "gaussian_cv": reference, "cv_ratio": ours / max(reference, 1e-300)}


def matrix_geometry(w: np.ndarray) -> dict[str, float]:
    """Spectral and magnitude statistics of one weight matrix (out, in)."""
    s = np.linalg.svd(w.astype(np.float64), compute_uv=False)
    energy = s**2
    nonzero = s[s > s[0] * 1e-12] if s[0] > 0 else s[:1]
    out = {
        "stable_rank": float(energy.sum() / max(energy[0], 1e-300)),
        "participation_ratio": participation_ratio(energy) if energy.sum() > 0 else 0.0,
        "rank_90": dims_for_variance(energy, (0.9,))["dims_90"],
        "condition_number": float(nonzero[0] / nonzero[-1]),
        "fro_norm": float(np.sqrt(energy.sum())),
        "mean_abs": float(np.abs(w).mean()),
    }
    absw = np.abs(w)
    for t in SPARSITY_THRESHOLDS:
        out[f"frac_below_{t:g}"] = float((absw < t).mean())
    return out


def bilinear_spectrum(wq: np.ndarray, wk: np.ndarray) -> dict[str, float]:
    """The attention score form x·(W_Q^T W_K)·y of a layer: eigenvalues of its symmetric part
    (positive and negative mass) and how far it is from symmetric."""
    b = wq.astype(np.float64).T @ wk.astype(np.float64)  # (d, d)
    sym, anti = (b + b.T) / 2, (b - b.T) / 2
    eig = np.linalg.eigvalsh(sym)
    total = np.abs(eig).sum()
    return {
        "qk_pos_eig_share": float(eig[eig > 0].sum() / max(total, 1e-300)),
        "qk_neg_eig_share": float(-eig[eig < 0].sum() / max(total, 1e-300)),
        "qk_n_pos": int((eig > 1e-9 * max(total, 1e-300)).sum()),
        "qk_n_neg": int((eig < -1e-9 * max(total, 1e-300)).sum()),
        "qk_symmetry_deviation": float(np.linalg.norm(anti) / max(np.linalg.norm(b), 1e-300)),
    }
