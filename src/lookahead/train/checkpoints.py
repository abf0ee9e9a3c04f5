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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from lookahead.core.atomic import atomic_file
from lookahead.core.errors import LookaheadError

CHUNK = 1 << 24
CHECKPOINT_FILE = "checkpoint.pt"
"""A training run's checkpoint in its :func:`checkpoint_dir`."""


class CheckpointError(LookaheadError, RuntimeError):
    """A checkpoint exists but cannot be resumed from (unreadable, or written by another config)."""


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


def kept(store: str | Path | None, name: str, compute: Callable[[], dict[str, torch.Tensor]],
         device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """``compute()``'s tensors, read back from ``store/<name>.safetensors`` where an earlier, cut-off
    run of the same :func:`checkpoint_dir` kept them (the same bytes), else computed and kept there:
    the per-window or per-batch pieces of a long scoring loop. ``store`` None: computed, not kept."""
    from safetensors.torch import load_file, save_file

    path = None if store is None else Path(store) / f"{name}.safetensors"
    if path is not None and path.is_file():
        return {k: v.to(device) for k, v in load_file(str(path)).items()}
    out = compute()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path) as tmp:
            save_file({k: v.detach().cpu().contiguous() for k, v in out.items()}, str(tmp))
    return out


def rng_state() -> dict:
    """The torch generators a step may draw from: CPU, and every CUDA device's when present."""
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict | torch.Tensor) -> None:
    """Restore the generators :func:`rng_state` saved (refused where the CUDA devices differ)."""
    if isinstance(state, torch.Tensor):  # checkpoints written before CUDA states were saved
        state = {"cpu": state}
    torch.set_rng_state(state["cpu"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        if len(state["cuda"]) != torch.cuda.device_count():
            raise CheckpointError(f"checkpoint holds {len(state['cuda'])} CUDA generator states but "
                                  f"{torch.cuda.device_count()} devices are visible: resume would not be exact")
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: Path, state: dict) -> None:
    """Write a training checkpoint (``torch.save``), atomically."""
    with atomic_file(path) as tmp:
        torch.save(state, tmp)
