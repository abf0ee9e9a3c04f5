"""Read side of the contexts stage's cache (its layout: :mod:`lookahead.pipeline.contexts`):
token windows and memory-mapped per-position context embeddings, for phase 1, pairs, diffusion,
phase 2 and evaluate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from lookahead.core.errors import LookaheadError
from lookahead.core.inputs import recorded

SPLITS = ("train", "val")


META_FILE = "meta.json"


class ContextCacheError(LookaheadError, ValueError):
    """A context cache that is missing, incomplete or does not fit."""


class ContextCache:
    """Read side of the cache: windows and memory-mapped fp16 contexts of each split."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        meta_path = self.dir / META_FILE
        if not meta_path.is_file():
            raise ContextCacheError(f"context cache {self.dir} not found or incomplete (no {META_FILE}): "
                                    "run `dvc repro contexts`")
        self.meta = json.loads(meta_path.read_text(encoding="utf-8"))
        self.dim = int(self.meta["dim"])
        self.context_length = int(self.meta["context_length"])
        self._windows = {s: self._load(f"{s}_windows.npy") for s in SPLITS}
        self._contexts = {s: self._load(f"{s}_contexts.npy") for s in SPLITS}
        for s in SPLITS:
            n = self.meta["sequences"][s]
            if self._windows[s].shape != (n, self.context_length + 1) or \
                    self._contexts[s].shape != (n, self.context_length, self.dim):
                raise ContextCacheError(f"context cache {self.dir}: {s} arrays do not match {META_FILE} "
                                        "(run `dvc checkout contexts` or `dvc repro -f contexts`)")

    def _load(self, name: str) -> np.ndarray:
        path = self.dir / name
        try:
            return np.load(path, mmap_mode="r")
        except (OSError, ValueError) as err:
            raise ContextCacheError(f"context cache file {path} is missing or unreadable ({err}): "
                                    "run `dvc checkout contexts` or `dvc repro -f contexts`") from None

    def windows(self, split: str) -> np.ndarray:
        """(n, T+1) int32 token windows."""
        return self._windows[split]

    def contexts(self, split: str) -> np.ndarray:
        """(n, T, C) float16, memory-mapped."""
        return self._contexts[split]

    def batch(self, split: str, rows: np.ndarray | list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(windows (B, T+1) int64, contexts (B, T, C) float32) of ``rows``."""
        rows = np.asarray(rows)
        return (torch.from_numpy(self._windows[split][rows].astype(np.int64)),
                torch.from_numpy(self._contexts[split][rows].astype(np.float32)))

    def fingerprint(self) -> str:
        """Identifies this cache's content cheaply (meta and file sizes), for checkpoint keys."""
        sizes = {p.name: p.stat().st_size for p in sorted(self.dir.glob("*.npy"))}
        return json.dumps({"meta": self.meta, "sizes": sizes}, sort_keys=True)

    def encoder_settings(self) -> tuple[int, bool]:
        """(window, trust_remote_code) the cache's encoder ran with: the causality check reruns it."""
        where = self.dir / META_FILE
        return (int(recorded(self.meta, "config", "window", stage="contexts", source=where)),
                bool(recorded(self.meta, "config", "trust_remote_code", stage="contexts", source=where)))


def read_context_length(params_path: str | Path) -> int:
    """``base.arch.context_length`` of a params file: the window length of the cache and of the
    oracle stage's windows (validated here, so the stages that read it do not import the base
    stage's module)."""
    from lookahead.core.config import read_params
    from lookahead.core.errors import ConfigError

    arch = (read_params(params_path).get("base") or {}).get("arch") or {}
    value = arch.get("context_length") if isinstance(arch, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError("base.arch.context_length", f"must be an integer >= 1; got {value!r}")
    return value
