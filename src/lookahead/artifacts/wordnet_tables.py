"""The wordnet stage's tables (tab-separated, one row per matched token or anchor): written by
:mod:`lookahead.pipeline.wordnet`, read by probe, init and modulator."""

from __future__ import annotations

import csv
from pathlib import Path

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
