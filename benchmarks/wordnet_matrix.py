"""Wu-Palmer matrix throughput: the project's builder vs nltk's per-pair loop (docs/development.md).

Draws `--anchors` synsets of every part of speech (seeded), builds the full ordered-pair matrix
with `lookahead.semantics.wordnet.wup_matrix`, then times nltk's `Synset.wup_similarity` on a random sample
of the same pairs (after a warm-up, so its caches are hot) and checks every sampled value.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np

from lookahead.semantics.wordnet import wup_matrix
from lookahead.semantics.wordnet_source import open_wordnet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--anchors", type=int, default=3000)
    parser.add_argument("--nltk-pairs", type=int, default=20000, help="pairs timed in nltk's loop")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    wn = open_wordnet()
    rng = random.Random(args.seed)
    synsets = rng.sample(list(wn.all_synsets()), args.anchors)

    tic = time.perf_counter()
    matrix = wup_matrix(synsets)
    seconds = time.perf_counter() - tic
    n = len(synsets)

    sample = [(rng.randrange(n), rng.randrange(n)) for _ in range(args.nltk_pairs)]
    for i, j in sample[:2000]:  # warm nltk's per-synset caches
        synsets[i].wup_similarity(synsets[j])
    tic = time.perf_counter()
    values = [synsets[i].wup_similarity(synsets[j]) for i, j in sample]
    nltk_seconds = time.perf_counter() - tic
    identical = all(np.float32(0.0 if v is None else v) == matrix[i, j] for (i, j), v in zip(sample, values))

    pairs_per_s = n * n / seconds
    nltk_pairs_per_s = len(sample) / nltk_seconds
    print(json.dumps({
        "anchors": n,
        "pairs": n * n,
        "unordered_pairs": n * (n - 1) // 2,
        "seconds": round(seconds, 3),
        "pairs_per_s": round(pairs_per_s),
        "nltk_pairs": len(sample),
        "nltk_pairs_per_s": round(nltk_pairs_per_s),
        "ratio": round(pairs_per_s / nltk_pairs_per_s, 1),
        "identical": identical,
        "pos": {p: sum(s.pos() == p for s in synsets) for p in "nvasr"},
    }))


if __name__ == "__main__":
    main()
