"""Llama (``transformers.LlamaForCausalLM``; SmolLM2 is one): pre-norm blocks (``input_layernorm``
before the attention, ``post_attention_layernorm`` — despite its name — before the MLP), no
QK-norm, grouped-query attention (query head h reads key/value head h // group). With no norm after
the attention, a head's contribution is its gated output projection and the layer's total their sum.
"""

from __future__ import annotations

from lookahead.lm.families.base import Family, FamilyError, refuse

STATIC_ROPE = ("default", "linear", "llama3")
"""RoPE kinds whose frequencies do not depend on the sequence (the executors read the model's own
rotary module for its cos/sin)."""


class Llama(Family):
    name = "llama"

    def __init__(self, cfg):
        super().__init__(cfg)
        refuse(cfg, "mlp_bias", (False, None), "the MLP's bias is not supported")
        refuse(cfg, "pretraining_tp", (1, None), "tensor-parallel slicing of the projections is not supported")
        if getattr(cfg, "sliding_window", None) is not None:
            raise FamilyError(f"sliding_window: windowed attention is not supported; got {cfg.sliding_window!r}")
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        if rope.get("rope_type", "default") not in STATIC_ROPE:
            raise FamilyError(f"rope_parameters.rope_type: one of {', '.join(STATIC_ROPE)}; "
                              f"got {rope.get('rope_type')!r}")

    def attention_input(self, layer, x):
        return layer.input_layernorm(x)

    def mlp(self, layer, stream):
        return layer.mlp(layer.post_attention_layernorm(stream))
