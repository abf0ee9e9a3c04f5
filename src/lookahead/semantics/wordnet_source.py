"""WordNet 3.0 through nltk, found without network access (docs/install.md).

Search order:

1. ``wordnet.path`` from params, a directory of WordNet 3.0 database files (``data.noun``, ...);
2. nltk's own data path (users who ran ``nltk.download('wordnet')``);
3. the files the Debian/Ubuntu packages ``wordnet-base`` and ``wordnet-sense-index`` install.

Cases 1 and 3 are assembled into a project-local nltk data directory (``.nltk_data/`` at the
project root): nltk 3.10 refuses to read files outside its data roots (even through symlinks) and
its reader needs a ``lexnames`` file that the Debian packages lack. Its 45 lines are the standard
WordNet lexicographer file list, written here.

What nltk parses from the files — its lemma index, read at every start-up, and the text of every
synset, which the corpus and wordnet stages walk — is kept in a per-user cache (:func:`cache_dir`)
keyed by nltk's version and a digest of the WordNet files: a stage then opens WordNet in about a
second instead of ten. The cached values are nltk's own output, stored as it made them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

from lookahead.core.errors import LookaheadError, require
from lookahead.core.paths import project_root

LOCAL_DATA_DIR = ".nltk_data"

MISSING_MESSAGE = (
    "WordNet 3.0 not found. Install it one of two ways:\n"
    "  (a) Debian/Ubuntu packages: apt-get install wordnet-base wordnet-sense-index\n"
    "  (b) nltk's data: python -c \"import nltk; nltk.download('wordnet')\"\n"
    "or point params `wordnet.path` at a directory holding the WordNet 3.0 database files."
)

# The standard WordNet lexicographer files, in file-number order: (name, part-of-speech number).
LEXNAMES: tuple[tuple[str, int], ...] = (
    ("adj.all", 3), ("adj.pert", 3), ("adv.all", 4), ("noun.Tops", 1), ("noun.act", 1),
    ("noun.animal", 1), ("noun.artifact", 1), ("noun.attribute", 1), ("noun.body", 1),
    ("noun.cognition", 1), ("noun.communication", 1), ("noun.event", 1), ("noun.feeling", 1),
    ("noun.food", 1), ("noun.group", 1), ("noun.location", 1), ("noun.motive", 1),
    ("noun.object", 1), ("noun.person", 1), ("noun.phenomenon", 1), ("noun.plant", 1),
    ("noun.possession", 1), ("noun.process", 1), ("noun.quantity", 1), ("noun.relation", 1),
    ("noun.shape", 1), ("noun.state", 1), ("noun.substance", 1), ("noun.time", 1),
    ("verb.body", 2), ("verb.change", 2), ("verb.cognition", 2), ("verb.communication", 2),
    ("verb.competition", 2), ("verb.consumption", 2), ("verb.contact", 2), ("verb.creation", 2),
    ("verb.emotion", 2), ("verb.motion", 2), ("verb.perception", 2), ("verb.possession", 2),
    ("verb.social", 2), ("verb.stative", 2), ("verb.weather", 2), ("adj.ppl", 3),
)

# Files nltk's WordNetCorpusReader reads; the first group is required (index.sense comes from
# the Debian package wordnet-sense-index).
REQUIRED_FILES = tuple(
    f"{kind}.{pos}" for kind in ("data", "index") for pos in ("noun", "verb", "adj", "adv")
) + tuple(f"{pos}.exc" for pos in ("noun", "verb", "adj", "adv")) + ("index.sense",)
OPTIONAL_FILES = ("cntlist.rev", "lexnames")


class WordNetMissing(LookaheadError, RuntimeError):
    """WordNet 3.0 could not be found by any route of docs/install.md."""


@dataclasses.dataclass
class WordNetSource:
    """Where WordNet comes from (docs/install.md): the `wordnet.path` key, read by every stage that
    opens WordNet."""

    path: str | None = None
    """Directory of WordNet 3.0 database files; null = nltk's data path, then the Debian packages."""

    def __post_init__(self) -> None:
        require(self.path is None or self.path.strip() != "", "path", "must be null or a directory")


def write_lexnames(path: Path) -> None:
    lines = [f"{i:02d}\t{name}\t{pos}\n" for i, (name, pos) in enumerate(LEXNAMES)]
    path.write_text("".join(lines), encoding="ascii")


def debian_wordnet_dir() -> Path | None:
    """The directory where the Debian package ``wordnet-base`` put ``data.noun``, if installed."""
    if shutil.which("dpkg") is None:
        return None
    try:
        listing = subprocess.run(
            ["dpkg", "-L", "wordnet-base"], capture_output=True, text=True, check=False, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in listing.splitlines():
        if line.endswith("/data.noun") and Path(line).is_file():
            return Path(line).parent
    return None


def _is_wordnet_dir(path: Path) -> bool:
    return all((path / name).is_file() for name in REQUIRED_FILES)


def assemble(source: Path, data_root: Path) -> Path:
    """Copy the WordNet files of ``source`` into ``data_root/corpora/wordnet`` (nltk's layout).

    Idempotent: files already copied (same size) are kept. Returns ``data_root``.
    """
    if not _is_wordnet_dir(source):
        missing = [n for n in REQUIRED_FILES if not (source / n).is_file()]
        raise WordNetMissing(f"{source} is not a WordNet 3.0 directory (missing {', '.join(missing)}).\n" + MISSING_MESSAGE)
    target = data_root / "corpora" / "wordnet"
    target.mkdir(parents=True, exist_ok=True)
    for name in REQUIRED_FILES + OPTIONAL_FILES:
        src, dst = source / name, target / name
        if src.is_file() and not (dst.is_file() and dst.stat().st_size == src.stat().st_size):
            tmp = dst.with_suffix(dst.suffix + ".tmp")
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
    if not (target / "lexnames").is_file():
        write_lexnames(target / "lexnames")
    return data_root


def cache_dir() -> Path:
    """The per-user cache of parsed WordNet tables: ``$LOOKAHEAD_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/lookahead``, else ``~/.cache/lookahead``. Deleting it is always safe."""
    if os.environ.get("LOOKAHEAD_CACHE_DIR"):
        return Path(os.environ["LOOKAHEAD_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lookahead"


def _files_key(root: Path) -> str:
    """nltk's version and the digest of every file of the WordNet directory ``root``."""
    import nltk

    digest = hashlib.sha256(f"nltk {nltk.__version__}".encode())
    for path in sorted(p for p in root.iterdir() if p.is_file()):
        digest.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:24]


def _cached(key: str | None, name: str, build):
    """``build()``, or what it returned before for the same WordNet files (``key``) and nltk version.
    A cache that cannot be read is rebuilt; one that cannot be written is skipped."""
    if key is None:
        return build()
    path = cache_dir() / "wordnet" / key / f"{name}.pickle"
    try:
        return pickle.loads(path.read_bytes())
    except Exception:  # none yet, or damaged: rebuilt below
        pass
    value = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(tmp, path)
    except OSError:
        pass
    return value


def synset_texts(wn) -> list[tuple[str, list[str], str, list[str]]]:
    """(name, lemma names, definition, examples) of every synset, in ``wn.all_synsets()`` order:
    nltk's values, from the cache when this reader's files were walked before."""
    def walk():
        return [(s.name(), s.lemma_names(), s.definition(), s.examples()) for s in wn.all_synsets()]

    return _cached(getattr(wn, "cache_key", None), "synset_texts", walk)


def _reader(data_root: Path | None):
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    class WordNetReader(WordNetCorpusReader):
        """nltk's reader, minus the one thing it does at start-up for the Open Multilingual Wordnet
        only: mapping WordNet 3.0 offsets onto the loaded version (``map30``, read by nothing but
        the OMW loaders, and there is no OMW here). That walk of index.sense took about half of
        the reader's start-up — seconds in every stage that opens WordNet. Its lemma index comes
        from the cache (:func:`_cached`) when these files were read before."""

        cache_key: str | None = None

        def map_wn(self, version="wordnet"):
            return None

        def _load_lemma_pos_offset_map(self):
            def parse():
                super(WordNetReader, self)._load_lemma_pos_offset_map()
                return dict(self._lemma_pos_offset_map)

            self._lemma_pos_offset_map.update(_cached(self.cache_key, "lemma_pos_offset_map", parse))

    if data_root is not None and str(data_root) not in nltk.data.path:
        nltk.data.path.insert(0, str(data_root))
    root = nltk.data.find("corpora/wordnet")
    WordNetReader.cache_key = _files_key(Path(root.path))
    with warnings.catch_warnings():
        # "The multilingual functions are not available": no Open Multilingual Wordnet, by design.
        warnings.simplefilter("ignore", UserWarning)
        return WordNetReader(root, None)


def open_wordnet(path: str | Path | None = None, root: str | Path | None = None):
    """The nltk WordNet reader found by the docs/install.md search.

    Args:
        path: a directory of WordNet 3.0 database files (params ``wordnet.path``), or None.
        root: where the project-local nltk data directory lives (default: :func:`project_root`).
    Raises:
        WordNetMissing: naming both install routes, when no route finds WordNet 3.0.
    """
    local = (Path(root) if root else project_root()) / LOCAL_DATA_DIR
    if path is not None:
        return _reader(assemble(Path(path), local))
    assembled = local / "corpora" / "wordnet"
    if (assembled / "data.noun").is_file():
        missing = [n for n in REQUIRED_FILES if not (assembled / n).is_file()]
        if not missing:
            return _reader(local)
        debian = debian_wordnet_dir()
        if debian is None or not _is_wordnet_dir(debian):
            raise WordNetMissing(
                f"{assembled} is missing {', '.join(missing)}. Reinstall WordNet "
                f"(apt-get install --reinstall wordnet-base wordnet-sense-index), then run `make wordnet`.")
        return _reader(assemble(debian, local))  # copy the missing files again
    try:
        return _reader(None)
    except LookupError:
        pass
    debian = debian_wordnet_dir()
    if debian is None:
        raise WordNetMissing(MISSING_MESSAGE)
    if not _is_wordnet_dir(debian):
        missing = [n for n in REQUIRED_FILES if not (debian / n).is_file()]
        raise WordNetMissing(f"the Debian WordNet in {debian} is missing {', '.join(missing)}: reinstall it with "
                             f"apt-get install --reinstall wordnet-base wordnet-sense-index")
    return _reader(assemble(debian, local))


def main(argv: list[str] | None = None) -> int:
    """``python -m lookahead.semantics.wordnet_source``: check that WordNet opens, print its version."""
    try:
        wn = open_wordnet()
    except WordNetMissing as err:
        print(err, file=sys.stderr)
        return 1
    print(f"WordNet {wn.get_version()} found ({wn.root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
