"""The text corpus: WordNet glosses, local files or a hub dataset, split by hash (docs/pipeline.md).

Every document is one line. The train/val split is a pure function of the line's text and
``corpus.split_salt``, so it is the same on every machine, in every order, and a line never moves
between splits when other lines are added or removed.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from tqdm import tqdm

from lookahead.core.atomic import atomic_dir
from lookahead.core.errors import LookaheadError, require

SPLITS = ("train", "val")


class CorpusError(LookaheadError, ValueError):
    """A corpus source is empty, missing or not valid UTF-8."""


@dataclasses.dataclass
class CorpusConfig:
    """Where the text comes from and how it is split."""

    source: str = "wordnet"
    """`wordnet` (lemma names + gloss + examples of every synset), `files`, or `hf:<dataset id>`."""
    files: list[str] = dataclasses.field(default_factory=list)
    """Local UTF-8 text files, one document per line (with `source: files`)."""
    hf_split: str = "train"
    """Dataset split to read (with `source: hf:...`)."""
    hf_text_field: str = "text"
    """Column holding the text (with `source: hf:...`)."""
    max_lines: int = 0
    """Keep only the first N documents of the source (0 = all)."""
    val_fraction: float = 0.05
    """Share of documents hashed into the validation split."""
    split_salt: str = "lookahead"
    """Salt of the split hash: change it to draw another split."""

    def __post_init__(self) -> None:
        require(
            self.source in ("wordnet", "files") or (self.source.startswith("hf:") and len(self.source) > 3),
            "source",
            f"must be one of 'wordnet', 'files', 'hf:<dataset id>'; got {self.source!r}",
        )
        require(self.source != "files" or len(self.files) > 0, "files", "must list at least one file when source is 'files'")
        require(self.max_lines >= 0, "max_lines", f"must be >= 0 (0 = all); got {self.max_lines}")
        require(0.0 < self.val_fraction < 1.0, "val_fraction", f"must be in (0, 1); got {self.val_fraction}")
        for name in ("hf_split", "hf_text_field", "split_salt"):
            require(getattr(self, name).strip() != "", name, "must not be empty")


def wordnet_lines(wn) -> Iterator[str]:
    """One line per synset: ``lemma, lemma: gloss. example. example``."""
    from lookahead.semantics.wordnet_source import synset_texts

    for _, lemma_names, definition, examples in synset_texts(wn):
        lemmas = ", ".join(name.replace("_", " ") for name in lemma_names)
        parts = [f"{lemmas}: {definition.strip()}"]
        parts += [example.strip() for example in examples]
        yield " ".join(p if p.endswith((".", "!", "?")) else p + "." for p in parts)


def file_lines(paths: Iterable[str | Path]) -> Iterator[str]:
    """Non-empty lines of local UTF-8 text files; a bad file raises :class:`CorpusError`."""
    for path in map(Path, paths):
        if not path.is_file():
            raise CorpusError(f"corpus file {path} not found")
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            line = raw[: err.start].count(b"\n") + 1
            raise CorpusError(f"corpus file {path} is not valid UTF-8: byte {err.start} (line {line}): {err.reason}") from None
        lines = [line.strip() for line in text.splitlines()]
        lines = [line for line in lines if line]
        if not lines:
            raise CorpusError(f"corpus file {path} is empty (no non-blank line)")
        yield from lines


def hf_lines(dataset_id: str, split: str, field: str) -> Iterator[str]:
    """Lines of a hub dataset's text column (needs the `datasets` package and a reachable hub)."""
    try:
        import datasets
    except ImportError as err:
        raise CorpusError("corpus.source hf:... needs the `datasets` package: pip install 'lookahead[hf]'") from err
    for row in datasets.load_dataset(dataset_id, split=split, streaming=True):
        for line in str(row[field]).splitlines():
            if line.strip():
                yield line.strip()


def split_of(line: str, val_fraction: float, salt: str) -> str:
    """``"val"`` or ``"train"``, decided by a salted hash of the line."""
    digest = hashlib.blake2b(line.encode("utf-8"), digest_size=8, key=salt.encode("utf-8")[:64]).digest()
    return "val" if int.from_bytes(digest, "big") / 2**64 < val_fraction else "train"


def source_lines(cfg: CorpusConfig, wordnet_path: str | None = None) -> Iterator[str]:
    if cfg.source == "wordnet":
        from lookahead.semantics.wordnet_source import open_wordnet

        return wordnet_lines(open_wordnet(wordnet_path))
    if cfg.source == "files":
        return file_lines(cfg.files)
    return hf_lines(cfg.source[3:], cfg.hf_split, cfg.hf_text_field)


# metrics/corpus.json (lookahead.core.report): headline name -> path in the report
HEADLINE = {"train_lines": "train.lines", "train_words": "train.words", "val_lines": "val.lines", "val_words": "val.words"}

def build_corpus(cfg: CorpusConfig, out_dir: str | Path, wordnet_path: str | None = None) -> dict:
    """Write ``train.txt`` and ``val.txt`` (one document per line) into ``out_dir``.

    Returns metrics: lines, words and characters per split.
    """
    stats = {split: {"lines": 0, "words": 0, "chars": 0} for split in SPLITS}
    lines = source_lines(cfg, wordnet_path)
    with atomic_dir(out_dir) as tmp:
        handles = {split: (tmp / f"{split}.txt").open("w", encoding="utf-8") for split in SPLITS}
        try:
            for i, line in enumerate(tqdm(lines, desc="corpus", unit=" lines", mininterval=2.0)):
                if cfg.max_lines and i >= cfg.max_lines:
                    break
                line = " ".join(line.split())  # one line per document, whitespace normalised
                split = split_of(line, cfg.val_fraction, cfg.split_salt)
                handles[split].write(line + "\n")
                stats[split]["lines"] += 1
                stats[split]["words"] += len(line.split())
                stats[split]["chars"] += len(line)
        finally:
            for handle in handles.values():
                handle.close()
        for split in SPLITS:
            if stats[split]["lines"] == 0:
                raise CorpusError(f"the {split} split is empty: the corpus has too few lines ({sum(s['lines'] for s in stats.values())})")
    return stats
