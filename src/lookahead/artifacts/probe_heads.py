"""Read side of the probe stage's head statistics (``data/probe/heads.safetensors``)."""

from __future__ import annotations

import torch


def head_importance(heads_file, group: int = 1) -> torch.Tensor:
    """The base model's head importance E|dL/dmask| (L, H), float32: the ranking static pruning keeps.
    ``group`` > 1 (``runtime.unit: group``): each key/value group's (L, H/group), the sum of its
    query heads' (an upper bound of the group mask's own, which the static_baselines stage measures)."""
    from safetensors.torch import load_file

    from lookahead.graph.nodes import pool

    return pool(load_file(str(heads_file))["importance"].float(), group)
