"""The per-head pieces of the head-graph runtime (:mod:`lookahead.graph.runtime`): a layer's
weights sliced per head (keys and values of query head h from its key/value head h // group),
per-head projections, a QK-norm with a gated mean square folded into RoPE (for families that
normalise queries and keys), attention with gated keys, and the family's turn of the gated sum of
head outputs into each head's contribution. Shapes: h heads, B rows, T positions, D = head_dim,
d = hidden. The family (:mod:`lookahead.lm.families`) says what differs between models.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def head_weights(family, layer, heads: torch.Tensor | None):
    """Per-head slices of one layer's attention weights for heads ``heads`` (None: all): W_qkv
    (h, d, 3D) — each query head's own query rows and its group's key and value rows —, W_O
    (h, D, d), q/k norm weights (h, 2, D) (None for a family without QK-norm)."""
    attn = layer.self_attn
    d_head = attn.head_dim
    hidden = attn.q_proj.weight.shape[1]
    h_all = attn.q_proj.weight.shape[0] // d_head
    group = family.shape.group

    def per_head(w):  # (H, D, d): a key/value head's rows repeated for each query head of its group
        return w.view(h_all, d_head, hidden) if group == 1 else w.view(-1, d_head, hidden).repeat_interleave(group, 0)

    w_qkv = torch.cat([attn.q_proj.weight.view(h_all, d_head, hidden), per_head(attn.k_proj.weight),
                       per_head(attn.v_proj.weight)], dim=1)  # (H, 3D, d)
    w_o = attn.o_proj.weight.view(hidden, h_all, d_head).permute(1, 2, 0)  # (H, D, d)
    qk_w = None
    if family.qk_norm:
        q_w, k_w, _ = family.qk_norm_weights(layer)
        qk_w = torch.stack([q_w, k_w], dim=1)
    if heads is not None:
        w_qkv, w_o = w_qkv[heads], w_o[heads]
        qk_w = None if qk_w is None else qk_w[heads]
    return w_qkv.transpose(1, 2), w_o, qk_w


def project(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Per-head matmul: (h, …, in) @ (h, in, out) → (h, …, out)."""
    return torch.bmm(x.reshape(x.shape[0], -1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[-1])


def rope_tables(weight: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """q/k norm weights folded into RoPE: for n a row and w its norm weight,
    (w n) cos + rotate_half(w n) sin = n · (w cos) + roll(n) · (roll(w) · sign · sin), rolling by
    D/2, sign = −1 on the first half and +1 on the second (``sin_signed`` = sign · sin).

    weight (h, 2, D), cos/sin_signed (T, D) float32 → tables (h, T, 2, 2, D) float32: [..., 0, :, :]
    multiplies n, [..., 1, :, :] multiplies roll(n), each for q and k.
    """
    w = weight.float()[:, None]  # (h, 1, 2, D)
    return torch.stack([w * cos[None, :, None, :], w.roll(w.shape[-1] // 2, -1) * sin_signed[None, :, None, :]], dim=2)


def qk_norm_rope(x: torch.Tensor, ms: torch.Tensor, eps: float, c: torch.Tensor, s: torch.Tensor,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """OLMo2's q/k RMSNorm with a given mean square, then RoPE in its rolled form; q and k together.

    x (h, B, S, 2, D) float32; ms (…, 2) broadcastable to (h, B, S, 2); x · c + roll(x) · s is the
    weighted, rotated row (c, s broadcastable to x: :func:`rope_tables` for unweighted x, or
    cos and signed sin when x already carries the norm weight). The norm's scalar factor commutes
    with RoPE, so it is applied last. Returns q, k as (h, B, S, D) in ``dtype``.
    """
    out = torch.addcmul(x * c, x.roll(x.shape[-1] // 2, -1), s)
    out = (out * torch.rsqrt(ms + eps)[..., None]).to(dtype)
    return out[..., 0, :], out[..., 1, :]


def rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """RoPE in its rolled form, x · cos + roll(x, D/2) · sign · sin, for a family without QK-norm:
    x (…, D) float32, cos/sin_signed broadcastable to it; in ``dtype``."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin_signed).to(dtype)


def head_outputs(family, layer, heads, x, g, cos, sin_signed, contributions: bool = True,
                 query: bool = False) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Contributions (h, B, T, d) of heads ``heads`` (None: all) of ``layer`` from their input
    streams x (h, B, T, d) (None unless ``contributions``), and their sum (B, T, d): what the
    attention adds to the stream (``family.contributions``: OLMo2's post-attention norm of the gated
    attention output, Llama's plain sum).

    g: None (all on), (h,) shared gates or (h, B, T) per-position gates. ``query``: the gates act
    on the query side only (``runtime.skip: query``): every key and value exists, the k-norm's mean
    square is over all heads, and only the q-norm's is weighted by the gates.
    """
    attn = layer.self_attn
    w_qkv, w_o, qk_w = head_weights(family, layer, heads)
    d_head = attn.head_dim
    dtype = x.dtype
    qkv = project(family.attention_input(layer, x), w_qkv)  # (h, B, T, 3D)
    qk, v = qkv[..., : 2 * d_head].unflatten(-1, (2, d_head)), qkv[..., 2 * d_head:]
    w = None if g is None else (g[:, None, None] if g.dim() == 1 else g)  # broadcastable to (h, B, T)
    if family.qk_norm:
        eps = family.qk_norm_weights(layer)[2]
        sumsq = qk.float().pow(2).sum(-1)  # (h, B, T, 2)
        if query and w is not None:  # q: the gated mean; k: every head's
            ms = torch.cat([gated_mean(sumsq[..., :1], w), sumsq[..., 1:].mean(0)], dim=-1) / d_head
        else:
            ms = gated_mean(sumsq, w) / d_head  # (B, T, 2)
        table = rope_tables(qk_w, cos, sin_signed)[:, None]  # (h, 1, T, 2, 2, D)
        q, k = qk_norm_rope(qk.float(), ms, eps, table[..., 0, :, :], table[..., 1, :, :], qk.dtype)  # (h, B, T, D)
    else:
        q, k = rope(qk.float(), cos[:, None], sin_signed[:, None], qk.dtype).unbind(-2)  # (h, B, T, D)

    # per-position gates: keys carry log g (not in query mode: every key exists); shared gates are
    # constant over keys and leave the softmax be
    z = attend(attn, q, k, v, g if g is not None and g.dim() == 3 and not query else None)
    o = project(z, w_o)  # (h, B, T, d)
    if w is not None:
        o = o * w[..., None].to(o.dtype)
    return family.contributions(layer, o.sum(0).float(), o if contributions else None, dtype)


GATE_FLOOR = 1e-12
"""Smallest gate total the soft path divides by, and smallest gate whose log it takes. The exact
gradients there scale as 1 / g (against an upstream gradient that is itself O(g)): a layer whose
heads at a position sum to ~1e-37 (soft training gets there: [0, 0, 0, 1e-37]) squares that total
below float32's range in the division's backward, and the whole backward pass turns NaN. Flooring
moves the function by at most about the floor, relatively: it touches only gates below it."""


def gated_mean(per_head: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
    """Σ_h w_h x_h / Σ_h w_h over dim 0 of x (h, B, T, k), the total floored at GATE_FLOOR; the
    plain mean when w is None. (B, T, k)"""
    if w is None:
        return per_head.mean(0)
    w = w.float().expand(per_head.shape[:-1])[..., None]
    return (per_head * w).sum(0) / w.sum(0).clamp_min(GATE_FLOOR)


def attend(attn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            key_gates: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of (h, B, S, D) tensors with ``attn``'s scale and dropout; key_gates
    (h, B, S), when given, add log g to each key's logits (excluding keys with g = 0)."""
    dropout = attn.attention_dropout if attn.training else 0.0
    if key_gates is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout, scale=attn.scaling)
    n = q.shape[-2]
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    mask = torch.where(causal, key_bias(key_gates, q.dtype)[..., None, :], future_bias(q.dtype, q.device))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=attn.scaling)


def future_bias(dtype: torch.dtype, device) -> torch.Tensor:
    """Attention bias of a key after the query: the dtype's most negative value."""
    return torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=device)


def key_bias(g: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Attention bias of each key: log g where g > 0 (g floored at GATE_FLOOR); for an excluded key
    (g = 0) half the dtype's most negative value — weight exactly 0 beside any present key, yet above future keys, so a
    query whose every past key is excluded (its own output is gated to 0) still never reads the
    future, not even through a gradient."""
    excluded = torch.tensor(torch.finfo(dtype).min / 2, dtype=dtype, device=g.device)
    return torch.where(g > 0, g.float().clamp_min(GATE_FLOOR).log().to(dtype), excluded)
