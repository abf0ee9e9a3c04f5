"""WordNet similarity over the model's tokens (docs/pipeline.md).

- :func:`match_tokens`: WordNet lemmas that the tokenizer encodes as one token (one entry per token).
- :func:`wup_matrix`: nltk's ``Synset.wup_similarity`` for every ordered pair of a synset list, bit
  for bit, computed over precomputed hypernym ancestry instead of one nltk call per pair.
- :func:`path_similarity_pairs`: nltk's ``Synset.path_similarity`` for a list of pairs.

Reproducing nltk exactly means reproducing its quirks (nltk 3.9/3.10, ``simulate_root=True``):

- a pair needs the simulated root ``*ROOT*`` unless both synsets are nouns; the root is then a
  common hypernym of everything, with min and max depth 0 and the name ``*ROOT*``;
- the lowest common subsumers are the common hypernyms (each synset counts as its own) with the
  largest *min* depth (``use_min_depth=True``), sorted by name; the subsumer is the first synset of
  the pair if it is among them, else the first of them — so ``*ROOT*`` wins depth-0 ties against
  any real root whose name sorts after ``*``, and wup(a, b) need not equal wup(b, a);
- depth = subsumer's *max* depth + 1; len = shortest hypernym-path distance to the subsumer,
  where the distance to ``*ROOT*`` is one more than the synset's farthest BFS ancestor distance;
- wup = 2·depth / (len₁ + len₂ + 2·depth).

Policy (README): nltk returns None only when two synsets share no hypernym and no simulated root
applies (never in WordNet 3.0, where all nouns share ``entity.n.01``); such entries are 0. The
diagonal holds nltk's own wup(s, s): 1.0 except for synsets that have an ancestor with a larger
min depth than their own (nltk's use_min_depth then picks that ancestor).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from lookahead.artifacts.wordnet_tables import TABLE_FIELDS, _write_tsv
from lookahead.core.atomic import atomic_dir
from lookahead.core.errors import LookaheadError, require
from lookahead.semantics.wordnet import match_tokens, path_similarity_pairs, wup_matrix
from lookahead.semantics.wordnet_source import WordNetSource, open_wordnet


class WordNetStageError(LookaheadError, ValueError):
    """The tokenizer matches too few lemmas for the requested anchors."""


@dataclasses.dataclass
class WordNetConfig(WordNetSource):
    """The wordnet stage: where WordNet is (`path`), and which anchors and pairs to draw."""

    n_anchors: int = 1024
    """Matched tokens drawn as anchors of the Wu-Palmer matrix."""
    n_eval_pairs: int = 20000
    """Anchor pairs (i < j) drawn for the relational-alignment evaluation (path similarity)."""
    seed: int = 0
    """Seed of the anchor and pair draws."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.n_anchors >= 2, "n_anchors", f"must be >= 2; got {self.n_anchors}")
        require(self.n_eval_pairs >= 1, "n_eval_pairs", f"must be >= 1; got {self.n_eval_pairs}")
        require(self.seed >= 0, "seed", f"must be >= 0; got {self.seed}")


def draw_anchors(n_matched: int, n_anchors: int, seed: int) -> np.ndarray:
    """Sorted indices of ``n_anchors`` of ``n_matched`` entries, drawn without replacement."""
    if n_anchors > n_matched:
        raise WordNetStageError(
            f"wordnet.n_anchors is {n_anchors} but the tokenizer matches only {n_matched} WordNet lemmas "
            f"as single tokens: lower wordnet.n_anchors to at most {n_matched} or grow the vocabulary"
        )
    return np.sort(np.random.default_rng([seed, 0]).choice(n_matched, size=n_anchors, replace=False))


def draw_pairs(n: int, n_pairs: int, seed: int) -> np.ndarray:
    """Distinct unordered pairs (i < j) of range(n), seeded, in draw order. Returns (P, 2) int64."""
    n_pairs = min(n_pairs, n * (n - 1) // 2)
    rng = np.random.default_rng([seed, 1])
    chosen: dict[tuple[int, int], None] = {}
    while len(chosen) < n_pairs:
        ij = rng.integers(0, n, size=(2 * (n_pairs - len(chosen)) + 16, 2))
        for i, j in ij[ij[:, 0] != ij[:, 1]]:
            chosen.setdefault((min(i, j), max(i, j)), None)
            if len(chosen) == n_pairs:
                break
    return np.array(list(chosen), dtype=np.int64).reshape(-1, 2)


# metrics/wordnet.json (lookahead.core.report); timings stay in the report (benchmarks/wordnet_matrix.py)
HEADLINE = ("matched_tokens", "anchors", "mean_offdiag_wup", "eval_pairs")

def build_wordnet(cfg: WordNetConfig, tokenizer, out_dir: str | Path) -> dict:
    """Write ``matched.tsv``, ``anchors.tsv``, ``wup.npy`` (anchor x anchor float32) and
    ``eval_pairs.tsv`` (anchor pairs with nltk path and Wu-Palmer similarity) into ``out_dir``.
    Returns metrics."""
    tic = time.perf_counter()
    wn = open_wordnet(cfg.path)
    matched = match_tokens(wn, tokenizer)
    if not matched:
        raise WordNetStageError("the tokenizer encodes no WordNet lemma as a single token: nothing to build a matrix from")
    anchors = [matched[i] for i in draw_anchors(len(matched), cfg.n_anchors, cfg.seed)]
    synsets = [wn.synset(a["synset"]) for a in anchors]
    wup_tic = time.perf_counter()
    wup = wup_matrix(synsets, progress=True)
    wup_seconds = time.perf_counter() - wup_tic
    pairs = draw_pairs(len(anchors), cfg.n_eval_pairs, cfg.seed)
    path_sim = path_similarity_pairs([(synsets[i], synsets[j]) for i, j in pairs])
    pair_rows = [
        {"i": int(i), "j": int(j), "path_similarity": float(p), "wup": float(wup[i, j])}
        for (i, j), p in zip(pairs, path_sim)
    ]
    with atomic_dir(out_dir) as tmp:
        _write_tsv(tmp / "matched.tsv", matched, TABLE_FIELDS)
        _write_tsv(tmp / "anchors.tsv", anchors, TABLE_FIELDS)
        np.save(tmp / "wup.npy", wup)
        _write_tsv(tmp / "eval_pairs.tsv", pair_rows, ("i", "j", "path_similarity", "wup"))
    n = len(anchors)
    pos_counts = {pos: sum(a["pos"] == pos for a in anchors) for pos in "nvasr"}
    return {
        "matched_tokens": len(matched),
        "anchors": n,
        "anchors_by_pos": pos_counts,
        "matrix_pairs": n * n,
        "nonzero_share": float(np.count_nonzero(wup) / wup.size),
        "mean_offdiag_wup": float((wup.sum() - np.trace(wup)) / max(1, n * n - n)),
        "symmetric_share": float(np.mean(wup == wup.T)),
        "eval_pairs": len(pair_rows),
        "wup_seconds": wup_seconds,
        "pairs_per_s": n * n / max(wup_seconds, 1e-9),
        "build_seconds": time.perf_counter() - tic,
    }
