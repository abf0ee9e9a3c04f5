"""WordNet similarity over the model's tokens (DESIGN §2 wordnet, §6).

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

import csv
import dataclasses
import time
from collections import deque
from pathlib import Path

import numpy as np

from lookahead.atomic import atomic_dir
from lookahead.config import LookaheadError, require
from lookahead.wordnet_data import WordNetSource, open_wordnet, synset_texts  # noqa: F401  (open_wordnet: public API)

ROOT = "*ROOT*"
MIN_GLOSS_CHARS = 11  # glosses of 10 characters or fewer are skipped
TABLE_FIELDS = ("lemma", "synset", "pos", "token_id", "gloss")


class WordNetStageError(LookaheadError, ValueError):
    """The tokenizer matches too few lemmas for the requested anchors."""


@dataclasses.dataclass
class WordNetConfig(WordNetSource):
    """The wordnet stage: where WordNet is (`path`), and which anchors and pairs to draw."""

    n_anchors: int = 3000
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
_FAR = np.int16(np.iinfo(np.int16).max)


def _bfs_ancestors(synset) -> dict:
    """{ancestor Synset: shortest upward distance}, the synset itself at 0 (nltk's BFS)."""
    dist: dict = {}
    queue = deque([(synset, 0)])
    while queue:
        s, d = queue.popleft()
        if s in dist:
            continue
        dist[s] = d
        queue.extend((h, d + 1) for h in s._hypernyms())
        queue.extend((h, d + 1) for h in s._instance_hypernyms())
    return dist


class _Ancestry:
    """Hypernym ancestry of a synset list, as dense arrays over the union of their ancestors.

    Columns are the ancestors U (plus one last column for ``*ROOT*``); for synset i and column u:
    member[u, i] says whether u is an ancestor of i (i itself included), and dist[i, u] is the
    nltk shortest-path distance between i and u, defined for ancestors (and ``*ROOT*``).
    """

    def __init__(self, synsets: list):
        self.synsets = synsets
        cache: dict = {}

        def bfs(s):
            if s._name not in cache:
                cache[s._name] = _bfs_ancestors(s)
            return cache[s._name]

        columns: dict[str, int] = {}
        nodes: list = []
        rows = []
        for s in synsets:
            row = {}
            for a, d in bfs(s).items():
                if a._name not in columns:
                    columns[a._name] = len(nodes)
                    nodes.append(a)
                row[columns[a._name]] = d
            rows.append(row)
        n, u = len(synsets), len(nodes)
        self.root = u  # the *ROOT* column
        self.member = np.zeros((u + 1, n), dtype=bool)  # (U+1, n)
        self.dist = np.full((n, u + 1), _FAR, dtype=np.int16)  # (n, U+1)
        self.self_col = np.array([columns[s._name] for s in synsets], dtype=np.int64)  # (n,)
        self.needs_root = np.array([s._pos != "n" for s in synsets])  # (n,) nltk's _needs_root
        farthest = np.array([max(r.values()) for r in rows], dtype=np.int16)  # (n,)
        for i, row in enumerate(rows):
            cols = np.fromiter(row, dtype=np.int64, count=len(row))
            self.member[cols, i] = True
        self.dist[:, u] = farthest + 1  # spd(s, *ROOT*) = farthest BFS ancestor + 1
        # spd(s, z) for an ancestor z of s: the common ancestors of s and z are z's ancestors, so
        # it is min over k in anc(z) of d_s(k) + d_z(k). (The simulated root's term is
        # farthest(s) + 1 + farthest(z) + 1 > d_s(z), never the minimum: it is left out.)
        node_bfs = [{columns[a._name]: d for a, d in bfs(z).items()} for z in nodes]
        for i, row in enumerate(rows):
            for z in row:
                self.dist[i, z] = min(row[k] + dz for k, dz in node_bfs[z].items())
        self.min_depth = np.array([z.min_depth() for z in nodes] + [0], dtype=np.int64)  # (U+1,)
        self.max_depth = np.array([z.max_depth() for z in nodes] + [0], dtype=np.int64)  # (U+1,)
        names = [z._name for z in nodes]
        self.root_first = np.array([ROOT < name for name in names] + [False])  # (U+1,)
        # preference order of subsumer candidates: larger min depth first, then smaller name
        order = sorted(range(u), key=lambda c: (-self.min_depth[c], names[c]))
        rank = np.empty(u, dtype=np.int64)
        rank[order] = np.arange(u)
        self.ancestors = [sorted(row, key=rank.__getitem__) for row in rows]  # preferred first

    def wup_rows(self, rows: np.ndarray) -> np.ndarray:
        """wup(synsets[r], synsets[j]) for r in ``rows`` and every j. Returns (R, n) float64."""
        n = len(self.synsets)
        k = max(len(self.ancestors[r]) for r in rows)
        # candidate subsumers of each row, preferred first, padded with the never-member ROOT column
        cand = np.full((len(rows), k), self.root, dtype=np.int64)  # (R, k)
        for i, r in enumerate(rows):
            cand[i, : len(self.ancestors[r])] = self.ancestors[r]
        common = self.member[cand]  # (R, k, n): candidate c of row r is an ancestor of j
        has = common.any(axis=1)  # (R, n)
        lcs = np.take_along_axis(cand, common.argmax(axis=1), axis=1)  # (R, n) first common
        m = self.min_depth[lcs]
        need_root = self.needs_root[rows][:, None] | self.needs_root[None, :]  # (R, n)
        use_root = need_root & (~has | ((m == 0) & self.root_first[lcs]))
        m = np.where(use_root, 0, m)
        x_col = self.self_col[rows][:, None]  # (R, 1)
        x_in_lcs = self.member[x_col[:, 0]] & (self.min_depth[x_col] == m)  # (R, n)
        sub = np.where(x_in_lcs, x_col, np.where(use_root, self.root, lcs))  # (R, n)
        depth = self.max_depth[sub] + 1
        len1 = np.take_along_axis(self.dist[rows], sub, axis=1).astype(np.int64)
        len2 = self.dist[np.arange(n)[None, :], sub].astype(np.int64)
        wup = (2.0 * depth) / (len1 + depth + len2 + depth)
        return np.where(has | need_root, wup, 0.0)


def wup_matrix(synsets, chunk_rows: int = 64, progress: bool = False) -> np.ndarray:
    """nltk's ``wup_similarity(synsets[i], synsets[j])`` for all i, j (None -> 0). (n, n) float32."""
    synsets = list(synsets)
    n = len(synsets)
    out = np.zeros((n, n), dtype=np.float32)
    if n == 0:
        return out
    anc = _Ancestry(synsets)
    starts = range(0, n, chunk_rows)
    if progress:
        from tqdm import tqdm

        starts = tqdm(starts, desc="wup matrix", unit="chunk", mininterval=2.0)
    for start in starts:
        rows = np.arange(start, min(n, start + chunk_rows))
        out[rows] = anc.wup_rows(rows)
    return out


def path_similarity_pairs(pairs) -> np.ndarray:
    """nltk's ``path_similarity(a, b)`` for each (a, b) in ``pairs`` (None -> 0). (P,) float32."""
    cache: dict = {}

    def bfs(s):
        if s._name not in cache:
            cache[s._name] = {a._name: d for a, d in _bfs_ancestors(s).items()}
        return cache[s._name]

    out = np.zeros(len(pairs), dtype=np.float32)
    for i, (a, b) in enumerate(pairs):
        if a._name == b._name:
            out[i] = 1.0
            continue
        da, db = bfs(a), bfs(b)
        if len(db) < len(da):
            da, db = db, da
        best = min((d + db[k] for k, d in da.items() if k in db), default=None)
        if a._pos != "n" or b._pos != "n":  # simulated root, one past each farthest ancestor
            via_root = max(da.values()) + 1 + max(db.values()) + 1
            best = via_root if best is None else min(best, via_root)
        if best is not None:
            out[i] = 1.0 / (best + 1)
    return out


def leading_space(tokenizer) -> str:
    """``" "`` when words inside a text carry a leading space in this vocabulary (GPT-2's ``Ġ``,
    SentencePiece's ``▁``), so that a lemma is looked up as it appears mid-sentence; else ``""``."""
    return " " if len(tokenizer.encode(" the", add_special_tokens=False)) == 1 else ""


def match_tokens(wn, tokenizer) -> list[dict]:
    """WordNet lemmas that ``tokenizer`` encodes as a single token, one entry per token id.

    Every synset is walked; its lemmas (``_`` read as a space) are candidates unless its gloss
    has 10 characters or fewer. A candidate matches when ``leading_space + lemma`` encodes to one
    token. A lemma names several synsets: the entry takes its most frequent sense, i.e. the first
    in WordNet's own sense order (``wn.lemmas``: nouns, verbs, adjectives, adverbs, each by tagged
    frequency) with a long enough gloss. Entries are sorted by token id; each is a dict with the
    keys of :data:`TABLE_FIELDS`.
    """
    prefix = leading_space(tokenizer)
    names = sorted({
        name
        for _, lemma_names, definition, _ in synset_texts(wn)
        if len(" ".join(definition.split())) >= MIN_GLOSS_CHARS
        for name in lemma_names
    })
    texts = [name.replace("_", " ") for name in names]
    encoded = tokenizer([prefix + t for t in texts], add_special_tokens=False)["input_ids"]
    matched, taken = [], set()
    for name, text, ids in zip(names, texts, encoded):
        if len(ids) != 1 or ids[0] in taken:
            continue
        for lemma in wn.lemmas(name):
            gloss = " ".join(lemma.synset().definition().split())
            if lemma.name() == name and len(gloss) >= MIN_GLOSS_CHARS:
                synset = lemma.synset()
                matched.append({"lemma": text, "synset": synset.name(), "pos": synset.pos(), "token_id": ids[0], "gloss": gloss})
                taken.add(ids[0])
                break
    return sorted(matched, key=lambda m: m["token_id"])


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


def _write_tsv(path: Path, rows: list[dict], fields: tuple[str, ...]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields, delimiter="\t", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def read_tsv(path: str | Path) -> list[dict]:
    """A table written by the wordnet stage (``matched.tsv``, ``anchors.tsv``, ``eval_pairs.tsv``)."""
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t"))


# metrics/wordnet.json (lookahead.report); timings stay in the report (benchmarks/wordnet_matrix.py)
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
