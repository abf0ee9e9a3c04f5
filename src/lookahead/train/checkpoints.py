"""Where a training stage keeps its resumable state: one directory per (config, inputs).

A checkpoint may only be resumed by the run that would have written it, so its directory is named
by a digest of the stage's resolved config and of its inputs — the bytes of the files it reads, and
a fingerprint of inputs too big to hash on every start (the context cache: its metadata and file
sizes) —: change a param or an input and the stage starts over in a fresh directory instead of
resuming stale state. Every training stage names its directory here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CHUNK = 1 << 24


def checkpoint_dir(root: str | Path | None, stage: str, config: dict[str, Any], files: Sequence[str | Path],
                   fingerprints: Sequence[str] = ()) -> Path | None:
    """``root/<digest>`` for ``stage`` run with ``config`` on ``files`` (and inputs described by
    ``fingerprints``); None when ``root`` is None (no checkpoints)."""
    if not root:
        return None
    digest = hashlib.sha256(json.dumps({stage: config}, sort_keys=True).encode())
    for fingerprint in fingerprints:
        digest.update(fingerprint.encode())
    for path in files:
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
    return Path(root) / digest.hexdigest()[:16]
