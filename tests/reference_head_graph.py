"""A plain reference of docs/design.md head-graph forward, written apart from ``lookahead.graph.runtime``
(it shares no code with it): explicit loops over heads, batch rows and positions, the stock
Hugging Face RoPE and modules, nothing batched cleverly. Slow; for tiny models in tests only.
"""

from __future__ import annotations

import math

import torch
from transformers.models.olmo2.modeling_olmo2 import apply_rotary_pos_emb


@torch.no_grad()
def reference_forward(model, ids: torch.Tensor, adjacency: torch.Tensor, gates: torch.Tensor,
                      skip: str = "full") -> torch.Tensor:
    """Logits (B, T, V) of an Olmo2ForCausalLM or a LlamaForCausalLM run over the head graph
    (adjacency, gates).

    adjacency (N, N) shared or (B, T, N, N); gates (N,) or (B, T, N), entry 0 ignored.
    For head j (layer l, head h) at position t:
      x_j = A[0, j] e + Σ_{l' < l} m_l' + Σ_{i head of an earlier layer} A[i, j] o_i
      q_j, k_j, v_j = head j's rows of W_q, W_k, W_v applied to x_j
      QK-norm: q_j / sqrt(ms + eps) · w_q[j], ms = Σ_h g_h |q_h|² / (D Σ_h g_h) over the layer's heads
      attention over keys t' ≤ t with g_j(t') > 0, logits q·k · scale + log g_j(t')
      o_j = g_j · w_post ⊙ (W_O[j] z_j) / rms, rms = sqrt(mean((Σ_h g_h W_O[h] z_h)²) + eps)
    and the MLP and final norm read e + Σ o + Σ m.

    skip="query": a head off at t has no query or output there, but its key and value at t exist:
      the k-norm's ms is the plain mean Σ_h |k_h|² / (D H) over the layer's heads, the q-norm's is
      gated as above, attention runs over every key t' ≤ t with no log g term, and o_j keeps its g_j.

    Llama: q_j, k_j, v_j read input_layernorm(x_j), k and v from the rows of head j's key/value head
    (j // group); no QK-norm; o_j = g_j · W_O[j] z_j (no norm after the attention); the MLP reads
    post_attention_layernorm of the stream.
    """
    cfg = model.config
    n_layers, n_heads = cfg.num_hidden_layers, cfg.num_attention_heads
    llama = cfg.model_type == "llama"
    group = n_heads // (cfg.num_key_value_heads or n_heads)
    core = model.model
    bsz, seq = ids.shape
    n = 1 + n_layers * n_heads
    a = adjacency.float().expand(bsz, seq, n, n) if adjacency.dim() == 2 else adjacency.float()
    g = gates.float().expand(bsz, seq, n) if gates.dim() == 1 else gates.float()

    e = core.embed_tokens(ids).float()  # (B, T, d)
    d = e.shape[-1]
    d_head = core.layers[0].self_attn.q_proj.out_features // n_heads  # the attention's width need not be d
    cos, sin = core.rotary_emb(e, torch.arange(seq)[None])  # (1, T, D)
    contrib = {0: e}  # node → (B, T, d): the source, then each head's contribution
    mlp_sum = torch.zeros_like(e)
    stream = e.clone()
    for layer_idx, layer in enumerate(core.layers):
        attn = layer.self_attn
        nodes = [1 + layer_idx * n_heads + h for h in range(n_heads)]
        q = torch.zeros(n_heads, bsz, seq, d_head)
        k = torch.zeros_like(q)
        v = torch.zeros_like(q)
        for h, j in enumerate(nodes):
            rows = slice(h * d_head, (h + 1) * d_head)
            kv_rows = slice((h // group) * d_head, (h // group + 1) * d_head)
            for b in range(bsz):
                for t in range(seq):
                    x = mlp_sum[b, t].clone()
                    for i, o in contrib.items():
                        x = x + a[b, t, i, j] * o[b, t]
                    if llama:
                        x = layer.input_layernorm(x)
                    q[h, b, t] = attn.q_proj.weight[rows] @ x
                    k[h, b, t] = attn.k_proj.weight[kv_rows] @ x
                    v[h, b, t] = attn.v_proj.weight[kv_rows] @ x
        # QK-norm over the heads' own slices, weighted by their gates
        for name, vec, norm in () if llama else (("q", q, attn.q_norm), ("k", k, attn.k_norm)):
            for b in range(bsz):
                for t in range(seq):
                    w = torch.stack([g[b, t, j] for j in nodes])
                    if skip == "query" and name == "k":
                        w = torch.ones_like(w)
                    total = w.sum()
                    ms = (w * vec[:, b, t].pow(2).sum(-1)).sum() / (d_head * total) if total > 0 else torch.tensor(1.0)
                    for h in range(n_heads):
                        weight = norm.weight[h * d_head : (h + 1) * d_head]
                        vec[h, b, t] = vec[h, b, t] / torch.sqrt(ms + norm.variance_epsilon) * weight
        q, k = apply_rotary_pos_emb(q.permute(1, 0, 2, 3), k.permute(1, 0, 2, 3), cos, sin)  # (B, H, T, D)
        q, k = q.permute(1, 0, 2, 3), k.permute(1, 0, 2, 3)
        head_out = torch.zeros(n_heads, bsz, seq, d)  # W_O[j] z_j
        for h, j in enumerate(nodes):
            w_o = attn.o_proj.weight[:, h * d_head : (h + 1) * d_head]
            for b in range(bsz):
                for t in range(seq):
                    if skip == "query":
                        keys = list(range(t + 1))
                        bias = [0.0] * len(keys)
                    else:
                        keys = [s for s in range(t + 1) if g[b, s, j] > 0]
                        bias = [math.log(g[b, s, j]) for s in keys]
                    if not keys:
                        continue
                    logits = torch.stack([q[h, b, t] @ k[h, b, s] * attn.scaling + c for s, c in zip(keys, bias)])
                    p = torch.softmax(logits, 0)
                    z = sum(p[i] * v[h, b, s] for i, s in enumerate(keys))
                    head_out[h, b, t] = w_o @ z
        post = layer.post_attention_layernorm
        for h, j in enumerate(nodes):
            contrib[j] = torch.zeros_like(e)
        for b in range(bsz):
            for t in range(seq):
                s_sum = sum(g[b, t, j] * head_out[h, b, t] for h, j in enumerate(nodes))
                rms = torch.sqrt(s_sum.pow(2).mean() + post.variance_epsilon)
                for h, j in enumerate(nodes):
                    if llama:
                        contrib[j][b, t] = g[b, t, j] * head_out[h, b, t]
                    else:
                        contrib[j][b, t] = g[b, t, j] * post.weight * head_out[h, b, t] / rms
        stream = stream + sum(contrib[j] for j in nodes)
        m = layer.mlp(post(stream)) if llama else layer.post_feedforward_layernorm(layer.mlp(stream))
        stream = stream + m
        mlp_sum = mlp_sum + m
    return model.lm_head(core.norm(stream))
