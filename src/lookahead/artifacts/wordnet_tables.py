"""The wordnet stage's tables (tab-separated, one row per matched token or anchor): written by
:mod:`lookahead.pipeline.wordnet`, read by probe, init and modulator."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

TABLE_FIELDS = ("lemma", "synset", "pos", "token_id", "gloss")


def _write_tsv(path: Path, rows: list[dict], fields: tuple[str, ...]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields, delimiter="\t", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def read_tsv(path: str | Path) -> list[dict]:
    """A table written by the wordnet stage (``matched.tsv``, ``anchors.tsv``, ``eval_pairs.tsv``)."""
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def read_eval_pairs(wordnet_dir: str | Path) -> tuple[list[dict], np.ndarray, np.ndarray]:
    """The anchors (``anchors.tsv`` rows) and the evaluation pairs: (anchors, pairs (P, 2) int64
    anchor indices, path similarity (P,) float64) — what relational alignment scores."""
    anchors = read_tsv(Path(wordnet_dir) / "anchors.tsv")
    rows = read_tsv(Path(wordnet_dir) / "eval_pairs.tsv")
    pairs = np.array([[int(r["i"]), int(r["j"])] for r in rows], dtype=np.int64)
    path_sim = np.array([float(r["path_similarity"]) for r in rows])
    return anchors, pairs, path_sim
