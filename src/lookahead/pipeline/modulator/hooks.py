"""How a modulator reaches the frozen LM: forward pre-hooks that replace the residual stream entering
chosen blocks (both the geometric and the field modulator apply themselves through it)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch


@contextlib.contextmanager
def modulated_blocks(lm, layers: list[int], modify: Callable[[torch.Tensor, int], torch.Tensor]) -> Iterator[None]:
    """Within the block, the residual h entering block ``layers[k]`` of the OLMo2 ``lm`` is replaced
    by ``modify(h, k)`` (forward pre-hooks, removed on exit): how both modulators are applied."""
    blocks = lm.model.layers

    def hook(k: int):
        def pre(module, args, kwargs):
            if args:
                return (modify(args[0], k), *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": modify(kwargs["hidden_states"], k)}
        return pre

    handles = [blocks[layer].register_forward_pre_hook(hook(k), with_kwargs=True) for k, layer in enumerate(layers)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
