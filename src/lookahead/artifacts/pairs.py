"""Read side of the pairs stage's output (one safetensors file of executed topologies per
context position, :mod:`lookahead.pipeline.pairs` writes it), split by window for the diffusion stage."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from lookahead.core.errors import LookaheadError
from lookahead.core.inputs import read_safetensors
from lookahead.graph.nodes import unpack_bits

PAIRS_FILE = "pairs.safetensors"  # the pairs stage's output (lookahead.pipeline.pairs writes it)


class PairsDataError(LookaheadError, ValueError):
    """A pairs file that is missing, unreadable or does not fit the context cache."""


@dataclasses.dataclass
class PairSet:
    """The pairs stage's output, split by window into train and held-out pairs."""

    rows: np.ndarray
    """(P,) int64: window index · T + position, into the context cache's split ``split``."""
    split: np.ndarray
    """(P,) uint8: the cache split of each pair's window, 0 train, 1 val (the beats_dense pairs: all train)."""
    edges: torch.Tensor
    """(P, E) uint8: executed topology bits."""
    nll: np.ndarray
    """(P,) the pair's LM NLL."""
    edge_fraction: np.ndarray
    """(P,) active edges / E."""
    head_fraction: np.ndarray
    """(P,) active heads / (L · H)."""
    info: dict
    """The pairs file's metadata (graph shape, encoder, the pairs config)."""
    train: np.ndarray
    """Indices of the training pairs."""
    heldout: np.ndarray
    """Indices of the held-out pairs."""


def load_pairs(pairs_dir: str | Path, context_length: int, heldout_fraction: float, seed: int) -> PairSet:
    """Read the pairs file and split it: eps_good pairs by their cache split (the val windows held
    out), the others by window (a seeded choice of held-out windows)."""
    path = Path(pairs_dir) / PAIRS_FILE
    info, arrays = read_safetensors(path, "np", "lookahead", PairsDataError,
                                    "run `dvc repro pairs` (or restore it: `dvc checkout pairs`)")
    if info["context_length"] != context_length:
        raise PairsDataError(f"{path} was made for windows of {info['context_length']} positions but the context "
                                 f"cache holds {context_length}: rerun `dvc repro pairs`")
    rows = arrays["rows"].astype(np.int64)
    edges = torch.from_numpy(unpack_bits(arrays["bits"], info["n_edges"]))
    if "split" in arrays:  # eps_good: the val windows' ground truth is the held-out set
        split = arrays["split"].astype(np.uint8)
        return PairSet(rows=rows, split=split, edges=edges, nll=arrays["nll"], edge_fraction=arrays["edge_fraction"],
                       head_fraction=arrays["head_fraction"], info=info,
                       train=np.flatnonzero(split == 0), heldout=np.flatnonzero(split == 1))
    windows = np.unique(rows // context_length)
    if len(windows) < 2:
        raise PairsDataError(f"{path} holds pairs of {len(windows)} window(s); the diffusion stage needs at least 2 "
                                 "(one to train on, one held out): raise pairs.sequences")
    n_out = min(len(windows) - 1, max(1, round(heldout_fraction * len(windows))))
    held = np.random.default_rng([seed, 70]).choice(windows, n_out, replace=False)
    is_held = np.isin(rows // context_length, held)
    return PairSet(rows=rows, split=np.zeros(len(rows), dtype=np.uint8), edges=edges, nll=arrays["nll"], edge_fraction=arrays["edge_fraction"],
                   head_fraction=arrays["head_fraction"], info=info, train=np.flatnonzero(~is_held),
                   heldout=np.flatnonzero(is_held))
