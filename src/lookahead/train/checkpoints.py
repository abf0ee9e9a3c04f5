"""Where a training stage keeps its resumable state: one directory per (config, inputs).

A checkpoint may only be resumed by the run that would have written it, so its directory is named
by a digest of the stage's resolved config and the bytes of the input files the run reads: change a
param or an input and the stage starts over in a fresh directory instead of resuming stale state.
(phase1, diffusion and phase2 carry their own copies of this helper; they move here when next edited.)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

CHUNK = 1 << 24


def checkpoint_dir(root: str | Path | None, stage: str, config: dict[str, Any], files: list[str | Path]) -> Path | None:
    """``root/<digest>`` for ``stage`` run with ``config`` on ``files``; None when ``root`` is None."""
    if not root:
        return None
    digest = hashlib.sha256(json.dumps({stage: config}, sort_keys=True).encode())
    for path in files:
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
    return Path(root) / digest.hexdigest()[:16]
