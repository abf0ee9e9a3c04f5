"""The init stage (docs/pipeline.md): geometric token embeddings from WordNet, their Procrustes
alignment to the base model's residual stream, and the predictor's starting node factors.

(a) eigendecomposition of the anchor Wu-Palmer matrix → top ``n_geo`` eigenvectors scaled by
    sqrt(eigenvalue), rows normalised; extended to every matched token by a softmax over its
    ``k_neighbors`` nearest anchors in the base model's static-embedding cosine space;
(b) anchors' glosses encoded by the base model (mean-pooled final hidden state), PCA to ``n_geo``,
    ``scipy.linalg.orthogonal_procrustes`` from geometric to that residual subspace; the
    projection n_geo → hidden size is R · components;
(c) eigendecomposition of the probe's head affinity → U0, V0 (N × rank, N = 1 + L·H, source node
    first with zero factors) with U0 V0ᵀ the best rank-r approximation of the affinity.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from lookahead.core.errors import LookaheadError, require
from lookahead.core.inputs import recorded
from lookahead.semantics.geometry import row_cosines, unit_rows


class InitError(LookaheadError, ValueError):
    """Inputs of the init stage do not fit its params."""


@dataclasses.dataclass
class InitConfig:
    """Geometric embeddings and Procrustes alignment."""

    n_geo: int = 32
    """Dimensions of the geometric embedding (eigenvectors kept)."""
    k_neighbors: int = 8
    """Nearest anchors used to extend the embedding to a non-anchor matched token."""
    softmax_temp: float = 0.1
    """Temperature of the softmax over those anchors' cosine similarities."""
    heldout_tokens: int = 256
    """Non-anchor matched tokens scored for held-out alignment cosine (0 = none)."""
    seed: int = 0
    """Seed of the held-out draw."""

    def __post_init__(self) -> None:
        require(self.n_geo >= 1, "n_geo", f"must be >= 1; got {self.n_geo}")
        require(self.k_neighbors >= 1, "k_neighbors", f"must be >= 1; got {self.k_neighbors}")
        require(self.softmax_temp > 0, "softmax_temp", f"must be > 0; got {self.softmax_temp}")
        require(self.heldout_tokens >= 0, "heldout_tokens", f"must be >= 0; got {self.heldout_tokens}")
        require(self.seed >= 0, "seed", f"must be >= 0; got {self.seed}")


@dataclasses.dataclass
class FactorsConfig:
    """What init reads of the ``predictor`` section (the whole section: lookahead.graph.predictor)."""

    rank: int = 8
    """Rank r of the per-token node factors U, V (N × r)."""

    def __post_init__(self) -> None:
        require(self.rank >= 1, "rank", f"must be >= 1; got {self.rank}")


def eigen_embedding(sim: np.ndarray, n_geo: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows = anchors: top ``n_geo`` eigenvectors of the symmetrised ``sim`` scaled by
    sqrt(eigenvalue) (negative eigenvalues clipped to 0), rows normalised. Returns (emb (n, n_geo),
    eigenvalues kept)."""
    if n_geo > len(sim):
        raise InitError(f"init.n_geo is {n_geo} but there are only {len(sim)} anchors (wordnet.n_anchors)")
    sym = (sim + sim.T) / 2  # nltk's Wu-Palmer is not exactly symmetric
    values, vectors = np.linalg.eigh(sym.astype(np.float64))
    order = np.argsort(values)[::-1][:n_geo]
    values = values[order]
    emb = vectors[:, order] * np.sqrt(np.clip(values, 0.0, None))
    return unit_rows(emb), values


def reconstruction_correlation(sim: np.ndarray, emb: np.ndarray) -> float:
    """Pearson correlation, off the diagonal, between ``sim`` and the embeddings' cosine matrix."""
    cos = unit_rows(emb) @ unit_rows(emb).T
    off = ~np.eye(len(sim), dtype=bool)
    return float(np.corrcoef(((sim + sim.T) / 2)[off], cos[off])[0, 1])


def extend_by_neighbors(anchor_emb: np.ndarray, anchor_static: np.ndarray, token_static: np.ndarray,
                        k: int, temp: float) -> np.ndarray:
    """Geometric embedding of each token: softmax(cos/temp)-weighted mean of its k nearest anchors'
    embeddings, in static-embedding cosine space, rows normalised. (m, n_geo)"""
    k = min(k, len(anchor_emb))
    cos = unit_rows(token_static) @ unit_rows(anchor_static).T  # (m, n)
    nearest = np.argpartition(-cos, k - 1, axis=1)[:, :k]  # (m, k)
    top = np.take_along_axis(cos, nearest, axis=1) / temp
    w = np.exp(top - top.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    return unit_rows(np.einsum("mk,mkd->md", w, anchor_emb[nearest]))


def pca(x: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean (d,), components (n, d)) of the rows of ``x``."""
    mean = x.mean(axis=0)
    _, _, vt = np.linalg.svd(x - mean, full_matrices=False)
    return mean, vt[:n]


def procrustes_projection(geo: np.ndarray, resid: np.ndarray, n_geo: int) -> dict:
    """Align geometric anchors to the PCA-``n_geo`` subspace of their residual encodings.

    Returns mean, components (n_geo, d), rotation R (n_geo, n_geo) minimising ‖geo R − pcs‖ over
    orthogonal R, and projection = R · components (n_geo, d) mapping geometric → residual space.
    """
    from scipy.linalg import orthogonal_procrustes

    if n_geo > min(resid.shape):
        raise InitError(f"init.n_geo is {n_geo} but the residual encodings span at most {min(resid.shape)} dimensions")
    mean, comps = pca(resid, n_geo)
    pcs = (resid - mean) @ comps.T  # (n, n_geo)
    rotation, _ = orthogonal_procrustes(geo, unit_rows(pcs))
    return {"mean": mean, "components": comps, "rotation": rotation, "projection": rotation @ comps}


def alignment_cosine(geo: np.ndarray, resid: np.ndarray, fit: dict) -> dict[str, float]:
    """Cosine between rotated geometric embeddings and the residual encodings' PCA coordinates."""
    pcs = (resid - fit["mean"]) @ fit["components"].T
    cos = row_cosines(geo @ fit["rotation"], pcs)
    return {"mean": float(cos.mean()), "std": float(cos.std())}


def head_factors(affinity: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """U0, V0 (1 + L·H, rank) with U0 V0ᵀ = the best rank-``rank`` approximation of the head
    affinity (by |eigenvalue|) on the head nodes, and zero rows for the source node 0."""
    n = len(affinity)
    if rank > n:
        raise InitError(f"predictor.rank is {rank} but the model has only {n} heads")
    values, vectors = np.linalg.eigh(((affinity + affinity.T) / 2).astype(np.float64))
    order = np.argsort(-np.abs(values))[:rank]
    scale = np.sqrt(np.abs(values[order]))
    u = np.zeros((n + 1, rank))
    v = np.zeros((n + 1, rank))
    u[1:] = vectors[:, order] * scale
    v[1:] = vectors[:, order] * scale * np.sign(values[order])
    return u.astype(np.float32), v.astype(np.float32)


# metrics/init.json (lookahead.core.report)
HEADLINE = {
    "reconstruction_correlation": "reconstruction_correlation",
    "eigenvalue_share_kept": "eigenvalue_share_kept",
    "alignment_cosine_anchors": "alignment_cosine_anchors.mean",
    "alignment_cosine_heldout": "alignment_cosine_heldout.mean",
    "affinity_rank_r_rel_error": "affinity_rank_r_rel_error",
}

def build_init(cfg: InitConfig, predictor: FactorsConfig, base_dir, wordnet_dir, heads_file, out_file,
               encode_batch_size: int = 64, max_text_tokens: int = 64, unit: str = "head") -> dict:
    """Compute (a), (b), (c) and write one safetensors file; return metrics. ``unit``: the routing
    unit whose nodes the factors describe (``runtime.unit``: under ``group`` the head affinity
    summed over each pair of key/value groups' heads)."""
    import torch
    from safetensors.numpy import load_file, save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lookahead.artifacts.wordnet_tables import read_tsv
    from lookahead.core.atomic import atomic_file
    from lookahead.core.config import to_dict
    from lookahead.graph.nodes import pool
    from lookahead.lm.encoders import encode_texts
    from lookahead.lm.families.registry import family_of

    wordnet_dir = Path(wordnet_dir)
    anchors = read_tsv(wordnet_dir / "anchors.tsv")
    matched = read_tsv(wordnet_dir / "matched.tsv")
    sim = np.load(wordnet_dir / "wup.npy")
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    static = model.get_input_embeddings().weight.detach().numpy()  # (V, hidden)

    # (a) geometric embeddings of anchors, extended to every matched token
    anchor_emb, eigvals = eigen_embedding(sim, cfg.n_geo)
    anchor_ids = np.array([int(a["token_id"]) for a in anchors])
    matched_ids = np.array([int(m["token_id"]) for m in matched])
    is_anchor = np.isin(matched_ids, anchor_ids)
    table = np.zeros((static.shape[0], cfg.n_geo), dtype=np.float32)
    mask = np.zeros(static.shape[0], dtype=np.float32)
    others = matched_ids[~is_anchor]
    if len(others):
        table[others] = extend_by_neighbors(anchor_emb, static[anchor_ids], static[others], cfg.k_neighbors, cfg.softmax_temp)
    table[anchor_ids] = anchor_emb
    mask[matched_ids] = 1.0

    # (b) Procrustes from geometric space to the residual subspace of the glosses' encodings
    resid = encode_texts(model, tokenizer, [a["gloss"] for a in anchors], encode_batch_size, max_text_tokens).astype(np.float64)
    fit = procrustes_projection(anchor_emb, resid, cfg.n_geo)
    metrics = {
        "anchors": len(anchors), "matched_tokens": len(matched), "n_geo": cfg.n_geo,
        "reconstruction_correlation": reconstruction_correlation(sim, anchor_emb),
        "eigenvalue_share_kept": float(np.clip(eigvals, 0, None).sum() / np.clip(np.linalg.eigvalsh((sim + sim.T) / 2), 0, None).sum()),
        "alignment_cosine_anchors": alignment_cosine(anchor_emb, resid, fit),
    }
    held = np.flatnonzero(~is_anchor)
    if cfg.heldout_tokens and len(held):
        rng = np.random.default_rng([cfg.seed, 30])
        pick = np.sort(rng.choice(held, size=min(cfg.heldout_tokens, len(held)), replace=False))
        held_resid = encode_texts(model, tokenizer, [matched[i]["gloss"] for i in pick], encode_batch_size,
                                  max_text_tokens).astype(np.float64)
        metrics["alignment_cosine_heldout"] = alignment_cosine(table[matched_ids[pick]].astype(np.float64), held_resid, fit)
        metrics["heldout_tokens"] = int(len(pick))

    # (c) predictor node factors from the probe's head affinity, over the routing unit's nodes
    heads = load_file(str(heads_file))
    group = family_of(model).shape.group if unit == "group" else 1
    affinity = pool(heads["affinity"], group, dims=2)
    u0, v0 = head_factors(affinity, predictor.rank)
    aff = affinity.astype(np.float64)
    approx = (u0 @ v0.T)[1:, 1:]
    metrics["affinity_rank_r_rel_error"] = float(np.linalg.norm(approx - aff) / max(np.linalg.norm(aff), 1e-12))
    metrics["predictor_rank"] = predictor.rank
    metrics["nodes"] = int(len(u0))

    config = {"init": to_dict(cfg), "predictor": to_dict(predictor), "base_hidden_size": int(static.shape[1]),
              "n_layers": int(recorded(heads, "importance", stage="probe", source=heads_file).shape[0]),
              **({"unit": unit} if unit != "head" else {})}
    tensors = {
        "geo_table": table, "geo_mask": mask, "anchor_token_ids": anchor_ids.astype(np.int64),
        "anchor_geo": anchor_emb.astype(np.float32), "projection": fit["projection"].astype(np.float32),
        "rotation": fit["rotation"].astype(np.float32), "pca_mean": fit["mean"].astype(np.float32),
        "pca_components": fit["components"].astype(np.float32), "U0": u0, "V0": v0,
    }
    with atomic_file(out_file) as tmp:
        save_file(tensors, str(tmp), metadata={"config": json.dumps(config, sort_keys=True)})  # one key: stable bytes
    return metrics
