"""Relational alignment: how well an LM's geometry agrees with WordNet — pair cosines
against path similarity, and the decay of similarity along hypernym chains."""

from __future__ import annotations

import numpy as np
import torch

from lookahead.core.seeds import mean_ci
from lookahead.lm.encoders import encode_texts
from lookahead.lm.tokens import encode_each
from lookahead.semantics import geometry


@torch.no_grad()
def static_texts(model, tokenizer, texts: list[str]) -> np.ndarray:
    """Mean input embedding of each text's tokens (no special tokens). (n, d) float32."""
    emb = model.get_input_embeddings().weight
    ids = encode_each(tokenizer, texts)
    return torch.stack([emb[torch.tensor(i or [0], device=emb.device)].mean(0) for i in ids]).cpu().numpy().astype(np.float32)


@torch.no_grad()
def token_encodings(model, tokenizer, anchors: list[dict], batch_size: int = 64, max_tokens: int = 64) -> np.ndarray:
    """Token-level encodings: each anchor's lemma read in context — the text ``"{gloss}. {lemma}"``,
    the gloss cut so that the whole is at most ``max_tokens`` tokens — and represented by the last
    hidden state at the lemma's own tokens (their mean; one token for a pipeline anchor), not pooled
    over the text. A causal LM's lemma state has read the whole gloss; the gloss-level encoding
    (:func:`lookahead.lm.encoders.encode_texts`) averages over the gloss's tokens instead. (n, d) float32."""
    device = next(model.parameters()).device
    texts, starts = [], []
    for a in anchors:
        lemma = " " + a["lemma"]
        budget = max(1, max_tokens - len(tokenizer(lemma, add_special_tokens=True)["input_ids"]))
        gloss = a["gloss"].strip().rstrip(".") + "."
        ends = [e for _, e in tokenizer(gloss, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]]
        gloss = gloss[: ends[min(budget, len(ends)) - 1]] if ends else gloss
        texts.append(gloss + lemma)
        starts.append(len(gloss))
    out = []
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(texts[i : i + batch_size], return_tensors="pt", padding=True, add_special_tokens=True,
                        return_offsets_mapping=True, return_special_tokens_mask=True)
        hidden = model(input_ids=enc["input_ids"].to(device), attention_mask=enc["attention_mask"].to(device),
                       output_hidden_states=True).hidden_states[-1]
        for b, start in enumerate(starts[i : i + batch_size]):
            own = (enc["offset_mapping"][b, :, 1] > start) & (enc["special_tokens_mask"][b] == 0) \
                & (enc["attention_mask"][b] == 1)
            out.append(hidden[b, own.to(device)].float().mean(0).cpu())
    return torch.stack(out).numpy().astype(np.float32)


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
    return {k: mean_ci(v) for k, v in per_seed.items()}, bands


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
