"""WordNet similarity at scale (docs/install.md): Wu–Palmer over all synset pairs of the matched tokens,
exactly as nltk computes it but vectorised, path similarity of pairs, and tokenizer matching."""

from __future__ import annotations

from collections import deque

import numpy as np

from lookahead.lm.tokens import encode_each
from lookahead.semantics.wordnet_source import synset_texts

ROOT = "*ROOT*"


MIN_GLOSS_CHARS = 11  # glosses of 10 characters or fewer are skipped


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
    encoded = encode_each(tokenizer, [prefix + t for t in texts])
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
