"""Relational alignment (DESIGN §6): how well an LM's geometry agrees with WordNet — pair cosines
against path similarity, and the decay of similarity along hypernym chains."""

from __future__ import annotations

import numpy as np
import torch

from lookahead.lm.encoders import encode_texts
from lookahead.semantics import geometry


@torch.no_grad()
def static_texts(model, tokenizer, texts: list[str]) -> np.ndarray:
    """Mean input embedding of each text's tokens (no special tokens). (n, d) float32."""
    emb = model.get_input_embeddings().weight
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return torch.stack([emb[torch.tensor(i or [0], device=emb.device)].mean(0) for i in ids]).cpu().numpy().astype(np.float32)


def relational_alignment(vectors: np.ndarray, pairs: np.ndarray, path_sim: np.ndarray, seeds: list[int]) -> tuple[dict, list]:
    """Correlation of pair cosines with WordNet path similarity (bootstrap over seeds), and the
    mean cosine per similarity band."""
    from scipy import stats

    cos = geometry.row_cosines(vectors[pairs[:, 0]], vectors[pairs[:, 1]])
    per_seed: dict[str, list] = {"pearson": [], "spearman": []}
    for seed in seeds:
        idx = np.random.default_rng([seed, 20]).integers(0, len(cos), size=len(cos))
        per_seed["pearson"].append(float(stats.pearsonr(cos[idx], path_sim[idx])[0]))
        per_seed["spearman"].append(float(stats.spearmanr(cos[idx], path_sim[idx])[0]))
    bands = []
    for lo, hi in BANDS:
        sel = (path_sim >= lo) & (path_sim < hi)
        bands.append({"band": f"[{lo:g},{min(hi, 1):g}{']' if hi > 1 else ')'}", "n": int(sel.sum()),
                      "mean_cosine": float(cos[sel].mean()) if sel.any() else None})
    return {k: geometry.mean_ci(v) for k, v in per_seed.items()}, bands


def hypernym_chains(wn, synset_names: list[str], depth: int) -> list[list]:
    """For each synset, its ancestors 1..depth steps up, following the hypernym with the smallest name."""
    chains = []
    for name in synset_names:
        s, chain = wn.synset(name), []
        for _ in range(depth):
            ups = s.hypernyms() + s.instance_hypernyms()
            if not ups:
                break
            s = min(ups, key=lambda u: u.name())  # deterministic: nltk's order can vary between processes
            chain.append(s)
        chains.append(chain)
    return chains


def chain_decay(model, tokenizer, wn, anchors: list[dict], depth: int, cfg, anchor_ctx: np.ndarray,
                anchor_static: np.ndarray) -> dict:
    """Mean cosine between each anchor and its k-th hypernym, k = 1..depth, for gloss encodings
    (contextual) and lemma embeddings (static). ``cfg`` gives ``encode_batch_size`` and
    ``max_text_tokens`` (the probe's and the modulator's alignment sections both do)."""
    chains = hypernym_chains(wn, [a["synset"] for a in anchors], depth)
    out: dict = {"contextual": [], "static": []}
    for k in range(depth):
        rows = [i for i, c in enumerate(chains) if len(c) > k]
        if not rows:
            break
        ups = [chains[i][k] for i in rows]
        ctx = encode_texts(model, tokenizer, [u.definition() for u in ups], cfg.encode_batch_size, cfg.max_text_tokens)
        static = static_texts(model, tokenizer, [" " + u.lemma_names()[0].replace("_", " ") for u in ups])
        out["contextual"].append(float(geometry.row_cosines(anchor_ctx[rows], ctx).mean()))
        out["static"].append(float(geometry.row_cosines(anchor_static[rows], static).mean()))
    return out


BANDS = ((0.0, 0.1), (0.1, 0.2), (0.2, 0.34), (0.34, 1.01))  # path-similarity bands (≥ lo, < hi)
