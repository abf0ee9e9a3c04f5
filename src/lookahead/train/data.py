"""Token streams and the batches cut from them.

Training batches are a pure function of (seed, step): random windows drawn by a generator seeded
with those numbers. Resuming at step s therefore sees exactly the batches an uninterrupted run
would have seen, with no sampler state to checkpoint; data-parallel processes each take their share
of the same global batch (:func:`lookahead.train.loop.rank_rows`). Evaluation uses fixed, non-overlapping windows from the start of the val stream.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def load_stream(tokens_dir: str | Path, split: str) -> np.ndarray:
    """The memory-mapped token array of ``split`` (``train`` or ``val``)."""
    path = Path(tokens_dir) / f"{split}.npy"
    if not path.is_file():
        raise FileNotFoundError(f"token stream {path} not found: run the tokenizer stage first")
    return np.load(path, mmap_mode="r")


def train_batch(stream: np.ndarray, step: int, batch_size: int, seq_len: int, seed: int, salt: int = 0) -> torch.Tensor:
    """``batch_size`` random windows of ``seq_len + 1`` tokens; ``salt`` keeps one user's draws apart
    from another's (the contexts stage draws with its own). Returns (B, T+1) int64."""
    starts = train_starts(len(stream), step, batch_size, seq_len, seed, salt)
    windows = np.stack([stream[s : s + seq_len + 1] for s in starts]).astype(np.int64)
    return torch.from_numpy(windows)


def train_starts(n_tokens: int, step: int, batch_size: int, seq_len: int, seed: int, salt: int = 0) -> np.ndarray:
    """The first token of each window :func:`train_batch` draws from a stream of ``n_tokens``."""
    n_starts = n_tokens - seq_len - 1
    if n_starts < 1:
        raise ValueError(f"token stream of {n_tokens} tokens is shorter than one window of {seq_len + 1}")
    return np.random.default_rng([seed, step, salt]).integers(0, n_starts + 1, size=batch_size)


def eval_windows(stream: np.ndarray, seq_len: int, max_tokens: int) -> torch.Tensor:
    """Non-overlapping windows of ``seq_len + 1`` tokens (stride ``seq_len``) covering the first
    ``max_tokens`` tokens (all if 0). Returns (n_windows, T+1) int64; each target token is scored once."""
    n = len(stream) if max_tokens <= 0 else min(len(stream), max_tokens + 1)
    n_windows = (n - 1) // seq_len
    if n_windows < 1:
        raise ValueError(f"val stream of {len(stream)} tokens is shorter than one window of {seq_len + 1}")
    starts = np.arange(n_windows) * seq_len
    windows = np.stack([stream[s : s + seq_len + 1] for s in starts]).astype(np.int64)
    return torch.from_numpy(windows)


def unigram_nll(train: np.ndarray, targets: np.ndarray, vocab_size: int) -> float:
    """Mean NLL (nats) of ``targets`` under the add-one-smoothed unigram distribution of ``train``."""
    counts = np.bincount(np.asarray(train, dtype=np.int64), minlength=vocab_size).astype(np.float64) + 1.0
    log_p = np.log(counts) - np.log(counts.sum())
    return float(-log_p[np.asarray(targets, dtype=np.int64)].mean())
