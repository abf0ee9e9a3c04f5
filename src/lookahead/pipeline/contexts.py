"""The contexts stage (docs/pipeline.md): per-position context embeddings of seeded token
windows, computed once by the frozen context encoder and cached for phase 1 and the pairs stage.

Cache layout (a few big files, memory-mapped by later stages)::

    <dir>/train_windows.npy   (n_train, T+1) int32  windows of the train stream (inputs + next token)
    <dir>/train_contexts.npy  (n_train, T, C) float16  embedding of position t of each window
    <dir>/val_windows.npy, <dir>/val_contexts.npy      the same for the val stream
    <dir>/meta.json           encoder, dim, context length, sizes

Train windows are drawn at random (seeded, like training batches); val windows are a seeded
choice among the non-overlapping windows of the val stream, so no val target is scored twice.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from lookahead.artifacts.contexts import META_FILE, SPLITS
from lookahead.core.atomic import atomic_dir
from lookahead.core.config import to_dict
from lookahead.core.devices import resolve_device
from lookahead.core.errors import ConfigError, require
from lookahead.lm.encoders import encode_windows, load_context_encoder
from lookahead.train import data


@dataclasses.dataclass
class ContextsConfig:
    """The frozen context encoder and the windows it encodes (docs/pipeline.md)."""

    encoder: str = "minilm"
    """`minilm` (packaged all-MiniLM-L6-v2), `base` (the pipeline's LM), or an HF id/dir of a causal embedding model."""
    window: int = 16
    """`minilm`: position t is encoded from the text of the last `window` tokens ending at t."""
    train_sequences: int = 128
    """Train windows of `base.arch.context_length` tokens to encode."""
    val_sequences: int = 32
    """Val windows to encode (non-overlapping, seeded choice)."""
    batch_size: int = 8
    """Windows per encoder call."""
    seed: int = 0
    """Seed of the window draws."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """`auto` = CUDA when available."""
    trust_remote_code: bool = False
    """Allow an HF encoder repo's own code."""

    def __post_init__(self) -> None:
        require(bool(self.encoder.strip()), "encoder", "must be `minilm`, `base`, or an HF model id/directory")
        for name in ("window", "train_sequences", "val_sequences", "batch_size"):
            require(getattr(self, name) >= 1, name, f"must be >= 1; got {getattr(self, name)}")
        require(self.seed >= 0, "seed", f"must be >= 0; got {self.seed}")


def draw_windows(tokens_dir: str | Path, cfg: ContextsConfig, context_length: int) -> dict[str, np.ndarray]:
    """{split: (n, T+1) int64 windows}: seeded random train windows, a seeded choice of the val
    stream's non-overlapping windows."""
    train = data.train_batch(data.load_stream(tokens_dir, "train"), step=0, batch_size=cfg.train_sequences,
                             seq_len=context_length, seed=cfg.seed, salt=40).numpy()
    val_all = data.eval_windows(data.load_stream(tokens_dir, "val"), context_length, max_tokens=0).numpy()
    if len(val_all) < cfg.val_sequences:
        raise ConfigError("contexts.val_sequences", f"the val stream holds only {len(val_all)} non-overlapping "
                          f"windows of {context_length + 1} tokens; got {cfg.val_sequences}")
    pick = np.sort(np.random.default_rng([cfg.seed, 41]).choice(len(val_all), cfg.val_sequences, replace=False))
    return {"train": train, "val": val_all[pick]}


# metrics/contexts.json (lookahead.core.report); throughput stays in the report
HEADLINE = ("encoder", "dim", "positions")

def build_contexts(cfg: ContextsConfig, context_length: int, tokenizer, tokens_dir, base_dir, out_dir) -> dict:
    """Encode the windows and write the cache atomically; return the stage's metrics."""
    windows = draw_windows(tokens_dir, cfg, context_length)
    encoder = load_context_encoder(cfg.encoder, base_dir, tokenizer, cfg.window, cfg.trust_remote_code,
                                   device=resolve_device(cfg.device))
    seconds = 0.0
    with atomic_dir(out_dir) as tmp:
        for split in SPLITS:
            w = windows[split]
            np.save(tmp / f"{split}_windows.npy", w.astype(np.int32))
            out = np.lib.format.open_memmap(tmp / f"{split}_contexts.npy", mode="w+", dtype=np.float16,
                                            shape=(len(w), context_length, encoder.dim))
            tic = time.perf_counter()
            encode_windows(encoder, torch.from_numpy(w[:, :-1]), cfg.batch_size, out, desc=f"contexts {split}")
            seconds += time.perf_counter() - tic
            out.flush()
            del out
        meta = {"encoder": encoder.name, "dim": encoder.dim, "context_length": context_length,
                "sequences": {s: int(len(windows[s])) for s in SPLITS}, "config": to_dict(cfg)}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    positions = sum(len(w) for w in windows.values()) * context_length
    return {"encoder": encoder.name, "dim": encoder.dim, "positions": positions,
            "positions_per_s": positions / max(seconds, 1e-9), "encode_seconds": seconds,
            "train_sequences": cfg.train_sequences, "val_sequences": cfg.val_sequences}


