"""An independent reference for routed units on a pre-norm model with grouped-query attention: transformers'
own forward (``LlamaForCausalLM``) with an attention function of this file's, sharing no code with
``lookahead.graph``. Eager attention over the key/value heads repeated per query head; in ``full`` skip
a key position where its group has no running head gets −inf (a zeroed key would still get weight),
a soft gate adds log g there; the off heads' slices of o_proj's input are zeroed (soft gates scale
them). Used by tests/test_families.py and benchmarks/smollm2_check.py."""

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
