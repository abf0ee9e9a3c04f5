"""An independent reference for routed units on a pre-norm model with grouped-query attention: transformers'
own forward (``LlamaForCausalLM``) with an attention function of this file's, sharing no code with
``lookahead.graph``. Eager attention over the key/value heads repeated per query head; in ``full`` skip
a key position where its group has no running head gets −inf (a zeroed key would still get weight),
a soft gate adds log g there; the off heads' slices of o_proj's input are zeroed (soft gates scale
them). Beside it, what the checks feed it and the executors: :func:`unit_gates` (random routed
units) and :func:`stepwise` (an executor run as prefill, then one position per call). Used by
tests/test_families.py, tests/test_decode.py and benchmarks/smollm2_check.py."""

from __future__ import annotations

import math

import torch
from transformers import AttentionInterface

_ROUTED: dict = {}


def _routed_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Eager attention over (B, H, T, D) queries and (B, H_kv, T, D) keys/values under the gates in
    _ROUTED (B, T, L·H): a key position where its group has no running head gets −inf (a zeroed key
    would still get weight), soft gates add log g there (``full``); the off heads' slices of o_proj's
    input are zeroed (soft gates scale them)."""
    g, skip = _ROUTED["gates"], _ROUTED["skip"]
    bsz, n_heads, t, _ = query.shape
    group = n_heads // key.shape[1]
    gl = g[..., 1:].view(bsz, t, -1, n_heads)[:, :, module.layer_idx].transpose(1, 2)  # (B, H, T)
    k, v = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    scores = query @ k.transpose(-1, -2) * scaling  # (B, H, T, T)
    future = ~torch.ones(t, t, dtype=torch.bool).tril()
    scores = scores.masked_fill(future, -math.inf)
    if skip == "full":
        kv_gate = gl.view(bsz, -1, group, t).amax(2).repeat_interleave(group, 1)  # (B, H, T): the group's
        bias = torch.where(kv_gate > 0, kv_gate.clamp_min(1e-30).log(), torch.tensor(-math.inf))
        scores = scores + bias[..., None, :]
    probs = torch.softmax(scores, -1).nan_to_num(0.0)  # a query with no key left: its output is gated off
    out = (probs @ v) * gl[..., None]
    return out.transpose(1, 2).contiguous(), probs


AttentionInterface.register("lookahead_routed_reference", _routed_attention)


@torch.no_grad()
def routed_reference(model, ids: torch.Tensor, gates: torch.Tensor, skip: str) -> torch.Tensor:
    """Logits of ``model`` (a Llama) with its heads routed by ``gates`` ((N,) or (B, T, N)), through
    transformers' own forward and the attention function above."""
    before = model.config._attn_implementation
    _ROUTED.update(gates=gates.float().expand(*ids.shape, gates.shape[-1]), skip=skip)
    model.set_attn_implementation("lookahead_routed_reference")
    try:
        return model(ids).logits
    finally:
        model.set_attn_implementation(before)


def unit_gates(config, lead: tuple, off: float, skip: str, seed: int) -> torch.Tensor:
    """Random 0/1 gates (*lead, N) for a model of ``config``, the source 1: query heads under ``query``
    skip, key/value groups (all their heads alike) under ``full`` skip, each off with probability ``off``."""
    n_layers, n_heads = config.num_hidden_layers, config.num_attention_heads
    units = n_heads if skip == "query" else (getattr(config, "num_key_value_heads", None) or n_heads)
    g = (torch.rand(*lead, n_layers, units, generator=torch.Generator().manual_seed(seed)) >= off).float()
    g = g.repeat_interleave(n_heads // units, -1).flatten(-2)
    return torch.cat([torch.ones(*lead, 1), g], -1)


def stepwise(prefill, step, ids: torch.Tensor, gates: torch.Tensor, prompt: int) -> torch.Tensor:
    """Logits (B, T, V) of an executor that continues a sequence: ``prefill(ids, gates)`` over the first
    ``prompt`` positions, then ``step(ids, gates)`` one position per call (each → logits); per-position
    gates (B, T, N) are sliced alike, shared gates (N,) passed whole."""
    def part(a, b):
        return gates[:, a:b] if gates.dim() > 1 else gates

    out = [prefill(ids[:, :prompt], part(0, prompt))]
    out += [step(ids[:, t : t + 1], part(t, t + 1)) for t in range(prompt, ids.shape[1])]
    return torch.cat(out, 1)
