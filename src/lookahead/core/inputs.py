"""A stage's inputs are checked before any work (docs/troubleshooting.md): missing, truncated or garbled files
stop the stage with one message that names the file and the fix, instead of a library traceback
minutes in.

The checks read headers only, so they cost milliseconds even for a multi-GB model: a safetensors
file's JSON header must parse and its tensors must end exactly at the end of the file; a ``.npy``
file must hold exactly the bytes its header promises; a ``.json`` file must parse. A flipped bit
inside tensor data passes them: DVC catches that one (``dvc status`` lists the file as modified, and
``dvc repro`` rebuilds or restores it before a stage downstream reads it).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from lookahead.core.errors import LookaheadError

LOCK_FILE = "dvc.lock"


class CorruptInput(LookaheadError):
    """An input file is missing, truncated or unreadable."""


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with a safetensors file, or None."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"is truncated ({size} bytes, shorter than a safetensors header)"
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            return f"is truncated or garbled (its header claims {n} bytes; the file has {size})"
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            return f"has a garbled header ({err.__class__.__name__}: {err})"
    if not isinstance(header, dict):
        return "has a garbled header (not a mapping)"
    try:
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (KeyError, TypeError, ValueError, IndexError):
        return "has a garbled header (tensor entries without data_offsets)"
    if 8 + n + end != size:
        what = "truncated" if 8 + n + end > size else "longer than its header says"
        return f"is {what} (its tensors end at byte {8 + n + end}; the file has {size})"
    return None


def npy_problem(path: Path) -> str | None:
    """What is wrong with a ``.npy`` file, or None."""
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, _, dtype = read_header(f)
            offset = f.tell()
    except (ValueError, OSError, SyntaxError) as err:
        return f"has a garbled header ({err})"
    if dtype.hasobject:
        return None
    expected = offset + math.prod(shape) * dtype.itemsize
    if expected != size:
        what = "truncated" if expected > size else "longer than its header says"
        return f"is {what} (its header promises {expected} bytes; the file has {size})"
    return None


def json_problem(path: Path) -> str | None:
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"is not valid JSON ({err})"
    return None


CHECKS = {".safetensors": safetensors_problem, ".npy": npy_problem, ".json": json_problem}


def file_problem(path: Path) -> str | None:
    """What is wrong with one file (by its suffix; other kinds: only that it can be opened), or None."""
    check = CHECKS.get(path.suffix)
    try:
        if check is None:
            with path.open("rb"):
                return None
        return check(path)
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"


def producing_stage(path: Path, lock_file: Path = Path(LOCK_FILE)) -> tuple[str, str] | None:
    """(stage, recorded output path) of the ``dvc.lock`` entry whose output holds ``path``, if any."""
    if not lock_file.is_file():
        return None
    try:
        lock = yaml.safe_load(lock_file.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError:
        return None
    target = Path(path).as_posix()
    for stage, entry in (lock.get("stages") or {}).items():
        for out in entry.get("outs") or []:
            recorded = str(out.get("path", ""))
            if recorded and (target == recorded or target.startswith(recorded.rstrip("/") + "/")):
                return stage, recorded
    return None


def fix_for(path: Path) -> str:
    """How to get a good copy of ``path`` back."""
    found = producing_stage(path)
    if found is None:
        return "rebuild or restore it, or point the stage at another copy"
    stage, out = found
    return f"restore it with `dvc checkout --force {out}`, or rebuild it with `dvc repro -f {stage}`"


def visible_files(directory: Path) -> list[Path]:
    """The files under ``directory``, sorted, without hidden ones (an editor's, a killed writer's
    ``.<name>.XXXXXXXX.tmp``, DVC's ``.gitignore``): what a stage reads from a directory output."""
    return sorted(p for p in directory.rglob("*")
                  if p.is_file() and not any(part.startswith(".") for part in p.relative_to(directory).parts))


def check_input(path: str | Path, what: str = "input", fix: str | None = None) -> None:
    """Raise :class:`CorruptInput` naming the first bad file under ``path`` (a file or a directory)
    and ``fix`` (default: the DVC command that restores or rebuilds it)."""
    path = Path(path)
    if not path.exists():
        raise CorruptInput(f"{what} {path} does not exist: {fix or fix_for(path)}")
    for file in visible_files(path) if path.is_dir() else [path]:
        problem = file_problem(file)
        if problem is not None:
            raise CorruptInput(f"{what} {file} {problem}: {fix or fix_for(file)}")


def check_inputs(paths: dict[str, str | Path]) -> None:
    """:func:`check_input` for each (name, path)."""
    for name, path in paths.items():
        check_input(path, f"--{name}")


class MissingRecord(LookaheadError, KeyError):
    """Another stage's output lacks a key this stage reads (written by an older version of it)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def recorded(meta: Any, *keys: str, stage: str, source: str | Path) -> Any:
    """``meta[k1][k2]...`` of another stage's metadata (``source``: the file it came from); a missing
    key is an error naming the stage to rerun, never a silent default."""
    node = meta
    for depth, key in enumerate(keys):
        if not hasattr(node, "keys") or key not in node:
            raise MissingRecord(f"{source} has no {'.'.join(keys[: depth + 1])!r} (written by an older `{stage}` "
                                f"stage?): rerun `dvc repro {stage}`")
        node = node[key]
    return node


def read_safetensors(path: str | Path, framework: str, meta_key: str, error: type[LookaheadError], fix: str) -> tuple[dict, dict]:
    """(json metadata under ``meta_key``, tensors) of another stage's safetensors file in one read;
    a missing, truncated or foreign file raises ``error`` with ``fix`` (the command that remakes it)."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise error(f"{path} not found: {fix}")
    try:
        with safe_open(str(path), framework=framework) as f:
            meta = json.loads((f.metadata() or {})[meta_key])
            return meta, {name: f.get_tensor(name) for name in f.keys()}
    except Exception as err:  # truncated or foreign file
        raise error(f"{path} is not readable ({err}): {fix}") from None
