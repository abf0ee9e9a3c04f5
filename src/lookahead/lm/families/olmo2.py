"""OLMo2 (``transformers.Olmo2ForCausalLM``): norms after each sublayer (``post_attention_layernorm``
after the attention, ``post_feedforward_layernorm`` after the MLP), none before; QK-norm over the
full width of the layer's queries and keys; one key/value head per query head."""

from __future__ import annotations

import torch

from lookahead.lm.families.base import Family, FamilyError


class Olmo2(Family):
    name = "olmo2"
    qk_norm = True
    post_norm = True

    def __init__(self, cfg):
        super().__init__(cfg)
        if self.shape.group != 1:  # the k-norm would span the groups' keys, not the query heads'
            raise FamilyError(f"num_key_value_heads: the OLMo2 family runs one key/value head per query head "
                              f"({cfg.num_attention_heads}); got {cfg.num_key_value_heads}")

    def attention_output(self, layer, s: torch.Tensor) -> torch.Tensor:
        return layer.post_attention_layernorm(s)

    def contributions(self, layer, s, o, dtype):
        """The post-attention RMSNorm of the gated sum s, in the stock norm's order of operations:
        (o · w_post / rms, w_post · s / rms); rms = sqrt(mean(s²) + eps) with the norm's own eps
        (a layer whose heads are all off adds exactly 0, and the division is always defined)."""
        norm = layer.post_attention_layernorm
        inv_rms = torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        total = (norm.weight * (s * inv_rms)).to(dtype)
        return None if o is None else (o.float() * (norm.weight * inv_rms)).to(dtype), total

    def mlp(self, layer, stream):
        return layer.post_feedforward_layernorm(layer.mlp(stream))

    def qk_norm_weights(self, layer):
        attn = layer.self_attn
        d_head = attn.head_dim
        return (attn.q_norm.weight.view(-1, d_head), attn.k_norm.weight.view(-1, d_head),
                attn.q_norm.variance_epsilon)
