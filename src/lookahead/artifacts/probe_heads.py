"""Read side of the probe stage's head statistics (``data/probe/heads.safetensors``)."""

from __future__ import annotations

import torch


def head_importance(heads_file) -> torch.Tensor:
    """The base model's head importance E|dL/dmask| (L, H), float32: the ranking static pruning keeps."""
    from safetensors.torch import load_file

    return load_file(str(heads_file))["importance"].float()
