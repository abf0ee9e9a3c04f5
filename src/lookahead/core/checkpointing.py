"""Activation checkpointing per decoder layer (``train.checkpoint_activations``).

While :func:`activation_checkpointing` is on and autograd records, each decoder layer keeps only its
inputs in the forward pass and is recomputed in the backward pass (``torch.utils.checkpoint``,
non-reentrant, so gradients reach tensors the layer reads from outside too: a router's gates and
edge weights). It covers every forward a training stage runs through:

- the head-graph runtime (:func:`lookahead.graph.runtime.forward_with_topology`) and the execution
  plan (:func:`lookahead.graph.plan.execute`) call :func:`layer_call` once per layer;
- the stock Hugging Face forward: the decoder layers of the models handed to
  :func:`activation_checkpointing` run through ``checkpoint`` for its duration, trained or frozen
  (Hugging Face's own ``gradient_checkpointing_enable`` acts in training mode only, and a frozen LM
  that gradients pass through, the modulator's, is in eval mode). The layer's KV cache is dropped
  there, as Hugging Face does under checkpointing: a cache a recomputation appends to twice is wrong.

The same gradients either way (tests/test_accumulation.py, ≤ 1e-6 in fp32); the memory it saves is
measured in ``benchmarks/activation_memory.py``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator

import torch
from torch.utils.checkpoint import checkpoint

_state = threading.local()


def enabled() -> bool:
    """Whether a layer run now is checkpointed: switched on, and autograd recording."""
    return getattr(_state, "on", False) and torch.is_grad_enabled()


def layer_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, one decoder layer, checkpointed when :func:`enabled`."""
    if not enabled():
        return fn(*args, **kwargs)
    record = getattr(_state, "record", None)
    if record is not None:  # what the checkpoint keeps alive: its inputs (saved_tensor_bytes)
        record.extend(x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor))
        record.extend(t for x in kwargs.values() if isinstance(x, tuple) for t in x if isinstance(t, torch.Tensor))
    return checkpoint(fn, *args, use_reentrant=False, **kwargs)


def _checkpointed_forward(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if not enabled():
        return forward(*args, **kwargs)
    for key in ("past_key_values", "past_key_value"):
        if kwargs.get(key) is not None:
            kwargs[key] = None
    if "use_cache" in kwargs:
        kwargs["use_cache"] = False
    return layer_call(forward, *args, **kwargs)


def decoder_layers(*models: torch.nn.Module | None) -> list[torch.nn.Module]:
    """The decoder layers (``model.model.layers`` of a causal LM) found in ``models``, each once."""
    found: dict[int, torch.nn.Module] = {}
    for model in models:
        if model is None:
            continue
        for module in model.modules():
            if type(module).__name__.endswith("DecoderLayer"):
                found.setdefault(id(module), module)
    return list(found.values())


@contextlib.contextmanager
def activation_checkpointing(on: bool, *models: torch.nn.Module | None) -> Iterator[None]:
    """Checkpoint every decoder layer while inside (``on``): the layers the runtimes run, and the
    stock forward's of ``models`` (their layers' ``forward`` wrapped for the duration). Off: nothing
    changes."""
    if not on:
        yield
        return
    layers = decoder_layers(*models)
    previous = getattr(_state, "on", False)
    for layer in layers:
        layer.forward = functools.partial(_checkpointed_forward, layer.forward)
    _state.on = True
    try:
        yield
    finally:
        _state.on = previous
        for layer in layers:
            del layer.forward  # the class's forward again


def saved_tensor_bytes(run: Callable[[], Any], exclude: tuple[torch.nn.Module, ...] = ()) -> tuple[int, Any]:
    """Bytes of the tensors autograd keeps for the backward pass of ``run()`` (its forward), each
    storage counted once and the parameters of ``exclude`` left out: what autograd saves
    (``torch.autograd.graph.saved_tensors_hooks``) plus, under checkpointing, the layer inputs each
    checkpoint holds. Returns (bytes, what ``run`` returned)."""
    params = {p.untyped_storage().data_ptr() for m in exclude for p in m.parameters()}
    kept: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.append(t)
        return t

    _state.record = kept
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = run()
    finally:
        _state.record = None
    storages: dict[int, int] = {}
    for t in kept:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params and storage.data_ptr() != 0:
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values()), out
