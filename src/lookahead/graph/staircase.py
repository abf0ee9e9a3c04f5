"""Attention of a ``query``-mode layer's running heads without Flex (the execution plan's SDPA path,
:mod:`lookahead.graph.plan`): busy heads attend every query causally and are zeroed where off; at long
context, heads that run at few positions attend only their active queries (:func:`staircase_attention`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F



def query_attention(q, k, v, gt, share, scale):
    """The attention of :func:`lookahead.graph.plan._query_attention` without Flex: q, k, v (B, h, T, D), gt (B, h, T, 1) 0/1,
    share (h,) each head's share of positions. Busy heads attend every query causally (zeroed where
    off); at long context sparse heads take :func:`staircase_attention`."""
    t = q.shape[2]
    low = [i for i, s in enumerate(share) if s <= STAIRCASE_BELOW]
    if t < STAIRCASE_FROM or not low or torch.is_grad_enabled() or flash_lse(q) is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale) * gt
    z = torch.empty_like(q)
    busy = [i for i in range(len(share)) if i not in low]
    if busy:
        z[:, busy] = F.scaled_dot_product_attention(q[:, busy], k[:, busy], v[:, busy], is_causal=True,
                                                    scale=scale) * gt[:, busy]
    z[:, low] = staircase_attention(q[:, low], k[:, low], v[:, low], gt[:, low, :, 0] > 0, scale)
    return z


STAIRCASE_FROM = 512
"""``query`` mode, per-position gates: the shortest context at which sparse heads attend only their
active queries (:func:`staircase_attention`); below it every query of a running head attends (the
packing costs more than the attention it saves)."""


STAIRCASE_BELOW = 0.35
"""… and the largest share of positions a head may run at to count as sparse (measured on CPU:
at 25 % the staircase takes 0.6 of causal attention's time at T = 2048, at 50 % about 1.0)."""


STAIRCASE_BLOCK = 256
"""Position block of :func:`staircase_attention`."""


def flash_lse(q: torch.Tensor):
    """torch's CPU flash attention that also returns the log-sum-exp of each query's logits (None
    where there is none: other devices, older torch)."""
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None) if q.device.type == "cpu" else None


def staircase_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, active: torch.Tensor, scale: float,
                        block: int = STAIRCASE_BLOCK) -> torch.Tensor:
    """Causal attention of only the active queries: q, k, v (B, h, T, D), active (B, h, T) bool →
    (B, h, T, D), 0 where inactive. Positions are cut into blocks of ``block``; each (row, head)'s
    active queries of a block are packed; they attend the keys of earlier blocks without a mask (one
    call per block, every row and head at once) and the keys of their own block under a small causal
    mask (one call for all blocks); the two parts are merged by their log-sum-exps."""
    flash = flash_lse(q)
    bsz, h, t, d = q.shape
    n = -(-t // block)
    if n * block != t:  # pad to whole blocks: padded positions are inactive and after every real one
        q, k, v = (F.pad(y, (0, 0, 0, n * block - t)) for y in (q, k, v))
        active = F.pad(active, (0, n * block - t))
    act = active.view(bsz, h, n, block)
    counts = act.sum(-1)  # (B, h, n)
    slots = int(counts.max())
    z = q.new_zeros(bsz, h, n * block, d)
    if slots == 0:
        return z[:, :, :t]
    local = torch.sort((~act).to(torch.uint8), dim=-1, stable=True).indices[..., :slots]  # (B, h, n, S)
    valid = torch.arange(slots, device=q.device) < counts[..., None]
    pos = (local + torch.arange(n, device=q.device)[:, None] * block).view(bsz, h, n * slots)
    qp = torch.gather(q, 2, pos[..., None].expand(-1, -1, -1, d)).view(bsz, h, n, slots, d)
    # own block: key i' <= query i (padding slots see their block's first key: finite, dropped)
    ahead = torch.arange(block, device=q.device) > torch.where(valid, local, 0)[..., None]
    bias = torch.zeros(ahead.shape, dtype=q.dtype, device=q.device).masked_fill_(ahead, float("-inf"))
    blocked = (bsz, h * n, -1, d)
    out, lse = flash(qp.reshape(blocked), k.reshape(blocked), v.reshape(blocked), 0.0, False,
                     attn_mask=bias.view(bsz, h * n, slots, block), scale=scale)
    out, lse = out.view(bsz, h, n, slots, d), lse.view(bsz, h, n, slots)
    for c in range(1, n):  # earlier blocks: every key visible
        s = int(counts[:, :, c].max())
        if s == 0:
            continue
        past, past_lse = flash(qp[:, :, c, :s], k[:, :, : c * block], v[:, :, : c * block], 0.0, False, scale=scale)
        w = torch.sigmoid(past_lse - lse[:, :, c, :s])[..., None]  # the past keys' share of the softmax mass
        out[:, :, c, :s] += w * (past - out[:, :, c, :s])
    # distinct positions per (row, head): the active ones, then (padding, written 0) inactive ones
    z.scatter_(2, pos[..., None].expand(-1, -1, -1, d), (out * valid[..., None]).view(bsz, h, n * slots, d))
    return z[:, :, :t]
