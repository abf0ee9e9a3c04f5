"""Which torch device a stage runs on ("auto": CUDA when there is one)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from lookahead.core.errors import ConfigError


def resolve_device(device: str, key: str = "contexts.device") -> str:
    """`cpu` or `cuda` for a config's device (`auto` = CUDA when available); ``key`` names the
    param in the error when `cuda` is asked for and there is none."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(key, "is 'cuda' but no CUDA device is available")
    return "cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu"


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``model`` in eval mode for the block, then back in the mode it was in (an evaluation in the
    middle of training leaves dropout and the like as it found them)."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)
