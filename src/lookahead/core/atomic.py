"""Outputs appear whole or not at all (docs/troubleshooting.md).

Everything a stage writes goes to a temporary sibling first and is renamed into place on success,
so an interrupted or failing stage leaves no half-written output behind. A killed process (SIGKILL
runs no cleanup) leaves its temporary sibling; the next write of the same output sweeps it away.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lookahead.core.errors import LookaheadError

LOW_SPACE = 1 << 20  # bytes free below which a failed write is blamed on a full disk


class DiskFull(LookaheadError, OSError):
    """An output could not be written for lack of space; the previous output is untouched."""


def _full_disk(err: BaseException, path: Path) -> DiskFull | None:
    """A :class:`DiskFull` for ``err`` if writing ``path`` failed for lack of space (libraries say so
    in different ways: OSError ENOSPC, "os error 28" from safetensors, a short write from numpy or torch)."""
    text = str(err)
    full = (isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)) or "No space left" in text \
        or "os error 28" in text
    if not full and isinstance(err, Exception) and not isinstance(err, LookaheadError):
        try:
            full = shutil.disk_usage(path.parent).free < LOW_SPACE
        except OSError:
            pass
    if not full:
        return None
    return DiskFull(f"no space left on the device while writing {path}: nothing was half-written and the previous "
                    f"output is as it was (under `dvc repro`, `dvc checkout` brings back what DVC removed before the "
                    f"run). Free some space and run the stage again.")


def temporaries(path: str | Path) -> list[Path]:
    """The temporary siblings of ``path`` that exist now (``.<name>.XXXXXXXX.tmp``, tempfile's 8
    random characters): one being written, or one left by a writer that was killed."""
    path = Path(path)
    return sorted(path.parent.glob(f".{glob.escape(path.name)}.{'?' * 8}.tmp"))


def _tmp_sibling(path: Path, is_dir: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in temporaries(path):
        _remove(stale)  # left by a writer that was killed (SIGKILL runs no cleanup); one writer per output
    if is_dir:
        return Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(name)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``path`` when the block succeeds."""
    path = Path(path)
    with _replacing(path, _tmp_sibling(path, is_dir=True), lambda tmp: shutil.rmtree(tmp, ignore_errors=True)) as tmp:
        yield tmp


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temporary file path that replaces ``path`` when the block succeeds."""
    path = Path(path)
    with _replacing(path, _tmp_sibling(path, is_dir=False), lambda tmp: tmp.unlink(missing_ok=True)) as tmp:
        yield tmp


@contextlib.contextmanager
def _replacing(path: Path, tmp: Path, discard) -> Iterator[Path]:
    """Yield ``tmp``; when the block succeeds, it replaces ``path`` (a directory there is removed first);
    when it fails, ``discard(tmp)`` and the error propagates (a full disk as :class:`DiskFull`
    naming ``path``)."""
    try:
        yield tmp
        if tmp.is_dir():
            _remove(path)
        os.replace(tmp, path)
    except BaseException as err:
        full = _full_disk(err, path)
        discard(tmp)
        if full is not None:
            raise full from err
        raise


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8), atomically."""
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | Path, data: Any) -> None:
    """Write ``data`` as indented JSON, atomically."""
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def write_csv(path: str | Path, rows: list[dict[str, Any]], fieldnames: list[str] | None = None) -> None:
    """Write flat dicts as CSV, atomically. Columns: ``fieldnames``, else the first row's keys."""
    import csv

    fieldnames = fieldnames or (list(rows[0]) if rows else None)
    if not fieldnames:
        raise ValueError(f"{path}: no rows and no fieldnames to write")
    with atomic_file(path) as tmp, tmp.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)
