"""The head-graph runtime (DESIGN §4): an OLMo2 forward pass in which every attention head reads
its own input stream, built from the outputs of the heads that feed it.

For head j of layer l (node 1 + l·H + h) the input is

    x_j = A[0, j] · e + Σ_{l' < l} m_{l'} + Σ_{i a head of an earlier layer} A[i, j] · o_i

with e the token embedding, m the MLP contributions and o the head contributions. q_j, k_j, v_j are
head j's own slices of the projections applied to x_j. OLMo2 normalises q and k over the full width
(QK-norm): here the mean square is taken over the concatenation of the heads' own slices, each
head weighted by its gate — the stock function when every gate is 1, the mean over the heads that
run when gates are hard (so a soft pass with hard gates equals a hard pass that skips work).

Head contribution: o_j = g_j · w_post ⊙ (W_O[j] z_j) / rms_l, where rms_l is the RMS of the layer's
gated attention sum Σ_j g_j W_O[j] z_j, computed as OLMo2's post-attention RMSNorm does it:
sqrt(mean(s²) + eps) with the model's own eps. The eps is the near-zero choice: a layer whose heads
are all off at a position contributes exactly 0 there, the division is always defined, and o is
continuous in g. Σ_j o_j is then exactly the stock post-attention norm of the attention output.

The MLP of layer l and the final norm see the standard stream e + Σ o + Σ m of gated contributions.
A head that is off at a position (g = 0) has no query, key or value there: the other positions'
attention for that head excludes it. Soft gates enter the attention logits of key position t' as
log g_j(t'), whose limit at g = 0 is that exclusion.

``hard=True`` executes the same function without the work of (head, position) pairs whose gate is
0: with a shared topology the off heads' projections and attention are simply not computed; with
per-position topologies each head's active positions are packed (per batch row) and only they get
q/k/v/o projections and attention. The mixing that builds x (a weighted sum of earlier outputs,
the cheap part) is still computed for every pair in the per-position case.

With adjacency = the allowed mask and gates = 1 the logits equal the stock Hugging Face forward
(tests/test_runtime.py, max abs difference ≤ 1e-5 in fp32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lookahead.config import LookaheadError
from lookahead.graph import allowed_mask, n_nodes


class TopologyError(LookaheadError, ValueError):
    """An adjacency, gates or model that the runtime cannot execute."""


def check_model(model) -> tuple[int, int]:
    """(n_layers, n_heads) of a transformers OLMo2 causal LM the runtime can rewire."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "model_type", None) != "olmo2" or not hasattr(model, "lm_head"):
        raise TopologyError(f"forward_with_topology runs transformers Olmo2ForCausalLM models; got {type(model).__name__}")
    if cfg.num_key_value_heads != cfg.num_attention_heads:
        raise TopologyError("grouped-query attention (num_key_value_heads < num_attention_heads) shares keys "
                            "between heads and has no per-head input stream; use a model with one KV head per head")
    if cfg.attention_bias:
        raise TopologyError("attention_bias=True is not supported: the output projection's bias belongs to no head")
    return cfg.num_hidden_layers, cfg.num_attention_heads


def default_gates(adjacency: torch.Tensor) -> torch.Tensor:
    """Gates implied by an adjacency: 1 for a head with any incoming weight, else 0. (…, N)"""
    gates = (adjacency.sum(-2) > 0).to(adjacency.dtype)
    gates[..., 0] = 1.0
    return gates


def _validate(adjacency: torch.Tensor, gates: torch.Tensor | None, input_ids: torch.Tensor,
              n_layers: int, n_heads: int) -> None:
    n = n_nodes(n_layers, n_heads)
    if input_ids.dim() != 2:
        raise TopologyError(f"input_ids must be (B, T); got shape {tuple(input_ids.shape)}")
    b, t = input_ids.shape
    if adjacency.shape not in ((n, n), (b, t, n, n)):
        raise TopologyError(f"adjacency must be ({n}, {n}) shared or ({b}, {t}, {n}, {n}) per position for this "
                            f"model ({n_layers} layers x {n_heads} heads) and input; got {tuple(adjacency.shape)}")
    mask = allowed_mask(n_layers, n_heads).to(adjacency.device)
    if bool((adjacency.detach() * ~mask).any()):
        raise TopologyError("adjacency has weight on edges that are not allowed (layer(i) >= layer(j)); "
                            "mask it with lookahead.graph.allowed_mask")
    if gates is not None and gates.shape != adjacency.shape[:-1]:
        raise TopologyError(f"gates must have shape {tuple(adjacency.shape[:-1])} to match the adjacency; "
                            f"got {tuple(gates.shape)}")


def forward_with_topology(model, input_ids: torch.Tensor, adjacency: torch.Tensor,
                          gates: torch.Tensor | None = None, hard: bool = False) -> torch.Tensor:
    """Logits (B, T, V) of an OLMo2 causal LM run over a head graph.

    Args:
        model: a transformers ``Olmo2ForCausalLM`` (frozen or trainable; gradients flow to its
            weights and to ``adjacency`` / ``gates``).
        input_ids: (B, T) token ids.
        adjacency: edge weights A[i, j], zero outside ``graph.allowed_mask``: (N, N) shared by all
            positions or (B, T, N, N) per position.
        gates: head gates g, (N,) or (B, T, N) like the adjacency's leading dims; entry 0 (the
            source) is ignored. None: 1 for every head with incoming weight, 0 otherwise.
        hard: skip the work of (head, position) pairs whose gate is 0 (same function).
    """
    n_layers, n_heads = check_model(model)
    _validate(adjacency, gates, input_ids, n_layers, n_heads)
    if gates is None:
        gates = default_gates(adjacency.detach())
    shared = adjacency.dim() == 2
    # shortcuts for gates of exactly 1 (or 0), taken only when no gradient has to reach them
    gates_fixed = not (torch.is_grad_enabled() and gates.requires_grad)
    all_on = gates_fixed and bool((gates[..., 1:] == 1).all())
    core = model.model

    # Heads' tensors are head-first (h, B, T, ·) with a shared adjacency, token-first (B·T, h, ·)
    # per position: either way, mixing is one (batched) matmul per block of sources.
    e = core.embed_tokens(input_ids)  # (B, T, d)
    bsz, t, d = e.shape
    position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
    cos, sin = (c[0].float() for c in core.rotary_emb(e, position_ids))  # (T, D)
    half = sin.shape[-1] // 2
    sin_signed = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)  # for the rolled form of RoPE
    a = adjacency.to(device=e.device, dtype=e.dtype)  # (N, N) | (B, T, N, N)
    gates = gates.to(e.device)
    packed = hard and not shared and not all_on
    # o_i = 0 where g_i = 0, and packed heads do not write those rows: mask the sources instead
    src_on = (gates > 0).to(a.dtype) if packed else None  # (B, T, N)
    binary = packed and gates_fixed and bool(((gates == 0) | (gates == 1)).all())
    g_all = gates if shared else gates.permute(2, 0, 1)  # (N,) | (N, B, T)
    stream = e  # the standard stream e + Σ o + Σ m
    msum = torch.zeros_like(e)  # Σ m over the layers so far
    # (node ids, contributions): the source, then the heads that ran, layer by layer (layouts:
    # _mix_shared, _mix_tokens)
    src0 = torch.zeros(1, dtype=torch.long, device=e.device)
    blocks = [(src0, e[None] if shared else e.reshape(-1, 1, d))]

    for layer_idx, layer in enumerate(core.layers[:n_layers]):
        cols = 1 + layer_idx * n_heads + torch.arange(n_heads, device=e.device)
        if hard and shared and not all_on:
            cols = cols[gates[cols] > 0]  # the heads that run at all
        out = None
        heads = cols - 1 - layer_idx * n_heads
        last = layer_idx == n_layers - 1  # no head reads the last layer's contributions
        g = None if all_on else g_all[cols]  # (h,) | (h, B, T)
        if shared and len(cols):
            if g is not None and gates_fixed and bool((g == 1).all()):
                g = None
            out = _heads(layer, heads, _mix_shared(a, cols, msum, blocks), g, cos, sin_signed, not last)
        elif not shared:
            x_tok = _mix_tokens(a, cols, msum, blocks, src_on)  # (B·T, h, d)
            if packed:
                out = _packed_heads(layer, heads, x_tok, msum, g, cos, sin_signed, not last, binary)
            else:
                x = x_tok.view(bsz, t, -1, d).permute(2, 0, 1, 3)
                o, total = _heads(layer, heads, x, g, cos, sin_signed, not last)
                out = None if o is None else o.permute(1, 2, 0, 3).reshape(bsz * t, -1, d), total
        if out is not None:
            if out[0] is not None:
                blocks.append((cols, out[0]))
            stream = stream + out[1]
        mlp = layer.post_feedforward_layernorm(layer.mlp(stream))
        stream = stream + mlp
        msum = msum + mlp
    return model.lm_head(core.norm(stream))


def _mix_shared(a, cols, msum, blocks) -> torch.Tensor:
    """Input streams Σ m + Σ_i A[i, j] o_i of heads ``cols`` for a shared adjacency a (N, N).

    blocks: (node ids (s,), outputs (s, B, T, d)), the first being the source (node 0, the
    embedding). Returns (h, B, T, d).
    """
    x = msum.reshape(1, -1)  # broadcast over the heads by the first addmm
    for src, o in blocks:
        x = torch.addmm(x, a[src][:, cols].T, o.reshape(len(src), -1))  # one matmul per block
    return x.view(len(cols), *msum.shape)


def _mix_tokens(a, cols, msum, blocks, src_on=None) -> torch.Tensor:
    """Input streams Σ m + Σ_i A[i, j] o_i of heads ``cols`` for a per-position adjacency a (B, T, N, N).

    blocks: (node ids (s,), token-first outputs (B·T, s, d)), the first being the source (node 0,
    the embedding). src_on (B, T, N): 0 for sources whose rows of A are to be ignored. Returns
    (B·T, h, d).
    """
    bsz, t = a.shape[:2]
    ac = a.transpose(-1, -2)[:, :, cols]  # (B, T, h, N)
    if src_on is not None:
        ac = ac * src_on[:, :, None, :]
    ac = ac.reshape(bsz * t, len(cols), -1)  # (B·T, h, N)
    (src, e), rest = blocks[0], blocks[1:]
    x = torch.addcmul(msum.reshape(bsz * t, 1, -1), ac[..., src], e)  # Σ m + A[0, j] e
    for src, o in rest:  # (B·T, h, s) @ (B·T, s, d), in place: backward needs no old x
        x = x.baddbmm_(ac[..., src], o)
    return x


def _weights(layer, heads: torch.Tensor):
    """Per-head slices of one layer's attention weights for heads ``heads``: W_qkv (h, d, 3D),
    W_O (h, D, d), q/k norm weights (h, 2, D)."""
    attn = layer.self_attn
    d_head = attn.head_dim
    hidden = attn.q_proj.weight.shape[1]
    h_all = attn.q_proj.weight.shape[0] // d_head
    full = len(heads) == h_all

    def pick(w):  # (H·D, d) → (h, D, d)
        w = w.view(h_all, d_head, hidden)
        return w if full else w[heads]

    w_qkv = torch.cat([pick(attn.q_proj.weight), pick(attn.k_proj.weight), pick(attn.v_proj.weight)], dim=1)
    w_o = attn.o_proj.weight.view(hidden, h_all, d_head).permute(1, 2, 0)  # (H, D, d)
    qk_w = torch.stack([attn.q_norm.weight.view(h_all, d_head), attn.k_norm.weight.view(h_all, d_head)], dim=1)
    if not full:
        w_o, qk_w = w_o[heads], qk_w[heads]
    return w_qkv.transpose(1, 2), w_o, qk_w


def _project(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Per-head matmul: (h, …, in) @ (h, in, out) → (h, …, out)."""
    return torch.bmm(x.reshape(x.shape[0], -1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[-1])


def _rope_tables(weight: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q/k norm weights folded into RoPE: for n a row and w its norm weight,
    (w n) cos + rotate_half(w n) sin = n · (w cos) + roll(n) · (roll(w) · sign · sin), rolling by
    D/2, sign = −1 on the first half and +1 on the second (``sin_signed`` = sign · sin).

    weight (h, 2, D), cos/sin_signed (T, D) float32 → tables (h, T, 2, D) float32.
    """
    w = weight.float()[:, None]  # (h, 1, 2, D)
    return w * cos[None, :, None, :], w.roll(w.shape[-1] // 2, -1) * sin_signed[None, :, None, :]


def _qk_norm_rope(qk: torch.Tensor, ms: torch.Tensor, eps: float, wc: torch.Tensor,
                  ws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """OLMo2's q/k RMSNorm with a given mean square, then RoPE; q and k together.

    qk (h, B, S, 2, D); ms (…, 2) broadcastable to (h, B, S, 2); wc/ws from :func:`_rope_tables`,
    broadcastable to (h, B, S, 2, D). The norm's scalar factor commutes with RoPE, so it is
    applied last. Returns q, k as (h, B, S, D).
    """
    x = qk.float()
    out = torch.addcmul(x * wc, x.roll(x.shape[-1] // 2, -1), ws) * torch.rsqrt(ms + eps)[..., None]
    out = out.to(qk.dtype)
    return out[..., 0, :], out[..., 1, :]


def _heads(layer, heads, x, g, cos, sin_signed, contributions: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Contributions (h, B, T, d) of heads ``heads`` of ``layer`` from their inputs x (h, B, T, d)
    (None unless ``contributions``), and their sum (B, T, d): the stock post-attention norm of the
    gated attention output.

    g: None (all on), (h,) shared gates or (h, B, T) per-position gates.
    """
    attn = layer.self_attn
    eps = attn.q_norm.variance_epsilon
    w_qkv, w_o, qk_w = _weights(layer, heads)
    d_head = attn.head_dim
    qkv = _project(x, w_qkv)  # (h, B, T, 3D)
    qk, v = qkv[..., : 2 * d_head].unflatten(-1, (2, d_head)), qkv[..., 2 * d_head:]
    w = None if g is None else (g[:, None, None] if g.dim() == 1 else g)  # broadcastable to (h, B, T)
    ms = _gated_mean(qk.float().pow(2).sum(-1), w) / d_head  # (B, T, 2)
    wc, ws = _rope_tables(qk_w, cos, sin_signed)  # (h, T, 2, D)
    q, k = _qk_norm_rope(qk, ms, eps, wc[:, None], ws[:, None])  # (h, B, T, D)

    # per-position gates: keys carry log g; shared gates are constant over keys and leave the softmax be
    z = _attend(attn, q, k, v, g if g is not None and g.dim() == 3 else None)
    o = _project(z, w_o)  # (h, B, T, d)
    if w is not None:
        o = o * w[..., None].to(o.dtype)
    s = o.sum(0).float()  # gated attention sum (B, T, d)
    inv_rms = torch.rsqrt(s.pow(2).mean(-1) + layer.post_attention_layernorm.variance_epsilon)  # (B, T)
    w_post = layer.post_attention_layernorm.weight
    total = (w_post * (s * inv_rms[..., None])).to(x.dtype)  # the stock norm's order of operations
    return (o.float() * (w_post * inv_rms[..., None])).to(x.dtype) if contributions else None, total


def _gated_mean(per_head: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
    """Σ_h w_h x_h / Σ_h w_h over dim 0 of x (h, B, T, 2); the plain mean when w is None. (B, T, 2)"""
    if w is None:
        return per_head.mean(0)
    w = w.float().expand(per_head.shape[:-1])[..., None]
    return (per_head * w).sum(0) / w.sum(0).clamp_min(torch.finfo(torch.float32).tiny)


def _attend(attn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            key_gates: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of (h, B, S, D) tensors with ``attn``'s scale and dropout; key_gates
    (h, B, S), when given, add log g to each key's logits (excluding keys with g = 0)."""
    dropout = attn.attention_dropout if attn.training else 0.0
    if key_gates is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout, scale=attn.scaling)
    n = q.shape[-2]
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    mask = torch.where(causal, _key_bias(key_gates, q.dtype)[..., None, :], _future(q.dtype, q.device))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=attn.scaling)


def _future(dtype: torch.dtype, device) -> torch.Tensor:
    """Attention bias of a key after the query: the dtype's most negative value."""
    return torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=device)


def _key_bias(g: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Attention bias of each key: log g where g > 0; for an excluded key (g = 0) half the dtype's
    most negative value — weight exactly 0 beside any present key, yet above future keys, so a
    query whose every past key is excluded (its own output is gated to 0) still never reads the
    future, not even through a gradient."""
    tiny = torch.finfo(torch.float32).tiny
    excluded = torch.tensor(torch.finfo(dtype).min / 2, dtype=dtype, device=g.device)
    return torch.where(g > 0, g.float().clamp_min(tiny).log().to(dtype), excluded)


def _packed_heads(layer, heads, x_tok, msum, g, cos, sin_signed, contributions: bool = True,
                  binary: bool = False) -> tuple[torch.Tensor | None, torch.Tensor] | None:
    """``_heads`` for per-position hard gates, computing only the (head, position) pairs with g > 0.

    Each (head, batch row)'s active positions are packed to the front (in order) of S slots, S the
    largest active count; projections and attention run on the packed slots only. Inputs: x_tok
    (B·T, h, d) input streams, msum (B, T, d) (for its shape), g (h, B, T).
    ``binary``: every gate is exactly 0 or 1 and needs no gradient, so nothing is scaled and keys
    need no log g bias.
    Returns (token-first contributions (B·T, h, d) — reusing x_tok's storage; pairs with g = 0
    hold stale finite values that the caller's masked adjacency never reads — or None unless
    ``contributions``; their sum (B, T, d)), or None when no pair is active.
    """
    attn = layer.self_attn
    eps = attn.q_norm.variance_epsilon
    d_head = attn.head_dim
    n_h, (bsz, t, d) = len(heads), msum.shape
    active = g > 0  # (h, B, T)
    counts = active.sum(-1)  # (h, B)
    slots = int(counts.max())
    if slots == 0:
        return None
    pos = torch.argsort((~active).to(torch.int8), dim=-1, stable=True)[..., :slots]  # (h, B, S) active first, in order
    valid = torch.arange(slots, device=g.device) < counts[..., None]  # (h, B, S)
    device = msum.device
    head_of_slot = torch.arange(n_h, device=device).repeat_interleave(bsz * slots)
    tok_of_slot = (torch.arange(bsz, device=device).view(1, bsz, 1) * t + pos).flatten()  # into (B·T)
    row_of_slot = tok_of_slot * n_h + head_of_slot  # into (B·T·h)
    # scatter target of per-token sums: padding slots go to one extra, discarded row
    tok_dst = torch.where(valid.flatten(), tok_of_slot, bsz * t)

    w_qkv, w_o, qk_w = _weights(layer, heads)
    xp = x_tok.reshape(-1, d).index_select(0, row_of_slot).view(n_h, bsz, slots, d)  # input streams of the slots
    qkv = _project(xp, w_qkv)  # (h, B, S, 3D)
    qk, v = qkv[..., : 2 * d_head].unflatten(-1, (2, d_head)), qkv[..., 2 * d_head:]

    def per_token(vals: torch.Tensor) -> torch.Tensor:  # (h, B, S, …) → summed per token (B·T, …)
        vals = vals.reshape(n_h * bsz * slots, *vals.shape[3:])
        return vals.new_zeros(bsz * t + 1, *vals.shape[1:]).index_add_(0, tok_dst, vals)[:-1]

    def per_slot(tok: torch.Tensor) -> torch.Tensor:  # (B·T, …) → (h, B, S, …)
        return tok.index_select(0, tok_of_slot).view(n_h, bsz, slots, *tok.shape[1:])

    gp = None if binary else torch.gather(g, 2, pos) * valid  # (h, B, S), 0 on padding
    g_tok = g.float().sum(0).reshape(-1, 1).clamp_min(torch.finfo(torch.float32).tiny)  # Σ_h g per token (B·T, 1)
    sumsq = qk.float().pow(2).sum(-1)  # (h, B, S, 2)
    ms = per_slot(per_token(sumsq if binary else sumsq * gp[..., None].float()) / g_tok) / d_head
    # the rope tables of each slot's head and position
    head_pos = (torch.arange(n_h, device=device).view(n_h, 1, 1) * t + pos).flatten()
    wc, ws = (c.reshape(n_h * t, 2, -1).index_select(0, head_pos).view(n_h, bsz, slots, 2, -1)
              for c in _rope_tables(qk_w, cos, sin_signed))  # (h, B, S, 2, D)
    q, k = _qk_norm_rope(qk, ms, eps, wc, ws)  # (h, B, S, D)

    # Real slots are in position order and padding comes last, so "key slot <= query slot" is
    # exactly "a real key at or before the query's position": slot-causal attention. Gates other
    # than 1 add log g to their keys' logits (padding keys: g = 0, excluded).
    z = _attend(attn, q, k, v, None if binary else gp)
    o = _project(z, w_o)  # (h, B, S, d)
    if not binary:
        o = o * gp[..., None].to(o.dtype)  # gated

    s = per_token(o.float())  # gated attention sum (B·T, d)
    inv_rms = torch.rsqrt(s.pow(2).mean(-1) + layer.post_attention_layernorm.variance_epsilon)  # (B·T,)
    w_post = layer.post_attention_layernorm.weight
    total = (w_post * (s * inv_rms[:, None])).to(xp.dtype).view(bsz, t, d)
    if not contributions:
        return None, total
    scale = (w_post * inv_rms[:, None]).index_select(0, tok_of_slot)  # (h·B·S, d)
    op = (o.float().view(-1, d) * scale).to(xp.dtype)
    # Written over the input streams, which are no longer needed (and which autograd did not save):
    # rows of (position, head) pairs that did not run keep finite stale values, which no later head
    # reads, because the caller zeroed the adjacency rows of sources that are off.
    return x_tok.view(-1, d).index_copy_(0, row_of_slot, op).view(bsz * t, n_h, d), total
