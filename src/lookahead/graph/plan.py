"""The execution plan of hard head-gate topologies (docs/design.md): inference that skips the work of
heads that are off, with a KV cache for generation.

When every head reads the standard stream — the graphs ``nodes.head_graph`` and
``nodes.baseline_graph`` of 0/1 gates, which ``predictor.gate: head``, static pruning and the
static control run — the head graph needs no per-head input mixing: a layer is the model's own
attention with some (head, position) pairs switched off, the function of
:func:`lookahead.graph.runtime.forward_with_topology` with ``hard=True``. This module runs it the
way a serving stack would:

- shared gates: the off heads are not computed at all — Q/V projections, attention and output
  columns of the running heads only (keys of every head in ``query`` mode, whose k-norm spans them);
- per-position gates, ``full`` mode: each (head, batch row)'s active positions packed in order and
  run through causal ``scaled_dot_product_attention`` (slot order = position order, so the slot-causal
  mask is exactly the head's causal mask over its own keys), Q/K/V projected for active pairs only;
- per-position gates, ``query`` mode: every key and value exists, so K/V are computed once per
  position for every head; heads off at every position of the batch are skipped; a busy head
  attends every query causally and is zeroed where it is off; at long context a sparse head
  attends only its active queries (:func:`lookahead.graph.staircase.staircase_attention`). Packing a busy head's queries does
  not pay: each keeps every key up to its position, a staircase mask stock attention kernels
  cannot skip work for (``benchmarks/runtime.py`` and the README measure it).

Generation (:class:`KVCache`): a prefill stores, per layer, what later positions read — every
head's key and value in ``query`` mode, and in ``full`` mode only the (head, position) pairs that ran
(a head off at a step stores nothing for that step; each (row, head) keeps its own length). A decode
step then runs one new position per row against the cache.

Gradients: :func:`gated_forward` (generation, the KV cache) is inference only. :func:`execute` runs
the same code with gradient enabled for the LM's weights — training under fixed 0/1 gates (the static
control, phase 2's frozen router), where it costs about what the stock forward costs — except per-position
gates in ``full`` mode (the packed path); it falls back to the general runtime when a gradient must
reach the topology, or when the topology is not a standard-stream head-gate graph.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref

import torch
import torch.nn.functional as F

from lookahead.core.checkpointing import layer_call
from lookahead.graph import attention, flex, staircase
from lookahead.graph.runtime import (SKIP_MODES, TopologyError, _allowed, _validate, check_groups, check_model, to_heads,
                                      forward_with_topology)


def _binary(gates: torch.Tensor) -> bool:
    """Every gate 0 or 1, the source's 1."""
    return torch.equal(gates[..., 1:], (gates[..., 1:] > 0).to(gates.dtype)) and not bool((gates[..., 0] == 0).any())


def standard_stream(adjacency: torch.Tensor, gates: torch.Tensor, n_layers: int, n_heads: int, skip: str) -> bool:
    """Whether a hard topology runs every head on the standard stream: gates all 0 or 1, and for
    every head that reads its input (the active ones; in ``query`` mode every head, whose keys and
    values exist when it is off) weight exactly 1 from the source and from every active earlier head.
    Edges out of an off head carry nothing and are not looked at. The adjacency must be zero outside
    the allowed mask (the runtime's validation)."""
    if not _binary(gates):
        return False
    n = gates.shape[-1]
    allowed = _allowed(n_layers, n_heads, adjacency.device).to(adjacency.dtype)
    # Σ_i g_i (A_ij − 1)² over allowed i: a sum of non-negative terms, 0 exactly when every
    # active source feeds head j with weight 1
    miss = torch.bmm(gates.reshape(-1, 1, n).to(adjacency.dtype), (adjacency - allowed).square().reshape(-1, n, n))
    miss = miss.view(*gates.shape)
    return bool((miss == 0).all() if skip == "query" else (miss * gates == 0).all())


def execute(model, input_ids: torch.Tensor, adjacency: torch.Tensor, gates: torch.Tensor | None,
            skip: str = "full") -> torch.Tensor:
    """Logits of the hard execution of (adjacency, gates): :func:`gated_forward`'s code when the
    topology is a standard-stream head-gate graph that no gradient has to reach (gradients do reach
    the LM's weights, save per-position gates in ``full`` mode), else the general runtime
    (``forward_with_topology(hard=True)``). The same function either way (tests: ≤ 1e-5, gradients too)."""
    family = check_model(model)
    n_layers, n_heads = family.shape.n_layers, family.shape.n_heads
    adjacency, gates = to_heads(family.shape, adjacency, gates)
    grad = torch.is_grad_enabled()
    if grad and (adjacency.requires_grad or (gates is not None and (gates.requires_grad
                                                                    or (gates.dim() > 1 and skip == "full")))):
        return forward_with_topology(model, input_ids, adjacency, gates, hard=True, skip=skip)
    if (gates is not None and skip in SKIP_MODES
            and adjacency.shape[:-1] == gates.shape and _binary(gates)):
        # what head-gate routers emit, ``nodes.head_graph``: valid by construction, checked in one pass
        if torch.equal(adjacency, _allowed(n_layers, n_heads, gates.device).to(adjacency.dtype) * gates[..., :, None]):
            return _gated_forward(model, input_ids, gates, skip, None).logits
        _validate(adjacency, gates, input_ids, n_layers, n_heads)
        check_groups(adjacency, gates, family.shape, skip)
        if standard_stream(adjacency, gates, n_layers, n_heads, skip):
            return _gated_forward(model, input_ids, gates, skip, None).logits
    return forward_with_topology(model, input_ids, adjacency, gates, hard=True, skip=skip)


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    """(B, T, V)"""
    hidden: torch.Tensor
    """(B, T, d): the final normed hidden state (what a ``predictor.input: lm`` router reads at t + 1)"""
    layer_inputs: torch.Tensor | None = None
    """(B, T, L·d): the residual stream entering each layer, layer-major (what a ``predictor.input:
    layer`` router reads), when asked for"""


class KVCache:
    """Keys (after the family's QK-norm, if any, and RoPE) and values of every layer, (B, H_kv,
    capacity, D) each — one per key/value head —, for a :func:`gated_forward` that continues a
    sequence. ``length``: positions seen. In ``full`` mode ``stored`` (L, B, H_kv) counts the keys each
    (row, key/value head) holds (the positions where it ran), and a head's keys sit at the front of
    its buffer in position order; in ``query`` mode every head stores every position."""

    def __init__(self, model, batch: int, capacity: int, skip: str):
        shape = check_model(model).shape
        if skip not in SKIP_MODES:
            raise TopologyError(f"skip must be one of {', '.join(SKIP_MODES)}; got {skip!r}")
        p = next(model.parameters())
        room = -(-capacity // flex.BLOCK) * flex.BLOCK  # whole blocks, as Flex decoding reads them
        size = (shape.n_layers, 2, batch, shape.n_kv_heads, room, shape.head_dim)
        self.kv = torch.zeros(size, dtype=p.dtype, device=p.device)
        self.stored = torch.zeros(shape.n_layers, batch, shape.n_kv_heads, dtype=torch.long, device=p.device)
        self.skip, self.capacity, self.length = skip, capacity, 0

    def nbytes(self) -> int:
        """Bytes of keys and values actually stored (the buffers' used part)."""
        per = 2 * self.kv.shape[-1] * self.kv.element_size()
        return int(self.stored.sum()) * per


_FUSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _fused(layer) -> torch.Tensor:
    """W_qkv ((H + 2 H_kv) D, d) of a layer, concatenated once and reused until a weight changes
    (its storage or version)."""
    attn = layer.self_attn
    parts = (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)
    stamp = tuple((w.data_ptr(), w._version, w.device, w.dtype) for w in parts)
    hit = _FUSED.get(layer)
    if hit is None or hit[0] != stamp:
        hit = (stamp, torch.cat(parts))
        _FUSED[layer] = hit
    return hit[1]


def _split(qkv: torch.Tensor, shape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (…, H, D), k and v (…, H_kv, D) of the fused projection's output (…, (H + 2 H_kv) D)."""
    d_head = shape.head_dim
    if shape.group == 1:
        return qkv.unflatten(-1, (3, shape.n_heads, d_head)).unbind(-3)
    q, k, v = qkv.split([shape.n_heads * d_head, shape.n_kv_heads * d_head, shape.n_kv_heads * d_head], -1)
    return q.unflatten(-1, (-1, d_head)), k.unflatten(-1, (-1, d_head)), v.unflatten(-1, (-1, d_head))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's rotate-half RoPE; cos/sin broadcastable to x (…, D); in x's dtype, as OLMo2's own (its
    cos/sin are fp32: bf16 q and k come back bf16, like v)."""
    half = x.shape[-1] // 2
    return (x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin).to(x.dtype)


def _norm(x: torch.Tensor, ms: torch.Tensor, eps: float, weight: torch.Tensor) -> torch.Tensor:
    """OLMo2's RMSNorm with a given mean square ms (x's shape minus its last dim), weight (…, D)."""
    return weight * (x.float() * torch.rsqrt(ms + eps)[..., None]).to(x.dtype)


def _mean_square(x: torch.Tensor) -> torch.Tensor:
    """Mean square over every head's slice, as OLMo2's full-width QK-norm takes it: x (…, H, D) → (…, H)
    (the same value for each head of a position)."""
    return x.float().pow(2).mean((-1, -2))[..., None].expand(x.shape[:-1])


def _gated_mean_square(x: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
    """Mean square over the slices of the heads that are on (``attention.gated_mean``, as the
    runtime takes it): x (B, H, D), on (B, H) 0/1 → (B, H)."""
    per_head = x.float().pow(2).sum(-1).T[..., None]  # (H, B, 1)
    return (attention.gated_mean(per_head, on.T)[..., 0] / x.shape[-1])[:, None].expand(on.shape)


def gated_forward(model, input_ids: torch.Tensor, gates: torch.Tensor, skip: str = "full",
                  cache: KVCache | None = None, layer_inputs: bool = False,
                  resume: tuple[int, torch.Tensor] | None = None) -> Output:
    """Hard execution of the standard-stream head-gate topology ``gates`` (see the module docstring).

    Args:
        model: a transformers causal LM of a supported family (:mod:`lookahead.lm.families`).
        input_ids: (B, T) the new positions (with a cache: the whole prompt when it is empty, then
            one position per call).
        gates: 0/1 head gates, (N,) shared or (B, T, N) per position, the source's (entry 0) 1.
        skip: ``full`` or ``query`` (:class:`lookahead.graph.runtime.RuntimeConfig`).
        cache: continue (and fill) a :class:`KVCache`.
        layer_inputs: also return the residual stream entering each layer (``Output.layer_inputs``).
        resume: ``(l, stream)``: start at layer ``l`` from ``stream`` (B, T, d), the residual stream
            entering it in a forward of these windows whose gates agree with ``gates`` below ``l``
            (its ``Output.layer_inputs``): the same floats as the whole forward, without the layers
            under ``l`` (no cache).

    Gates over key/value groups (``runtime.unit: group``) are widened to their query heads.
    """
    _, gates = to_heads(check_model(model).shape, None, gates)
    if not _binary(gates):
        raise TopologyError("gated_forward runs 0/1 head gates with the source's gate 1; soft gates run through "
                            "lookahead.graph.runtime.forward_with_topology")
    if resume is not None and (cache is not None or layer_inputs):
        raise TopologyError("resume starts a whole-window forward part-way: no cache, no layer inputs")
    with torch.no_grad():
        return _gated_forward(model, input_ids, gates, skip, cache, layer_inputs, resume)


def _gated_forward(model, input_ids: torch.Tensor, gates: torch.Tensor, skip: str, cache: KVCache | None,
                   layer_inputs: bool = False, resume: tuple[int, torch.Tensor] | None = None) -> Output:
    """:func:`gated_forward` for gates already checked; differentiable in the LM's weights (when
    grad is enabled: no cache, not per-position ``full`` mode, whose packed path caches fused weights)."""
    family = check_model(model)
    shape = family.shape
    n_layers, n_heads = shape.n_layers, shape.n_heads
    if skip not in SKIP_MODES:
        raise TopologyError(f"skip must be one of {', '.join(SKIP_MODES)}; got {skip!r}")
    bsz, t = input_ids.shape
    n = 1 + n_layers * n_heads
    if gates.shape not in ((n,), (bsz, t, n)):
        raise TopologyError(f"gates must be ({n},) shared or ({bsz}, {t}, {n}) per position; got {tuple(gates.shape)}")
    check_groups(None, gates, shape, skip)
    start = 0
    if cache is not None:
        if cache.skip != skip or cache.kv.shape[2] != bsz:
            raise TopologyError(f"this cache was made for skip={cache.skip!r} and batch {cache.kv.shape[2]}; "
                                f"got skip={skip!r}, batch {bsz}")
        start = cache.length
        if start and t != 1:
            raise TopologyError(f"a filled cache continues one position per call; got {t}")
        if start + t > cache.capacity:
            raise TopologyError(f"the cache holds {cache.capacity} positions; {start + t} needed")
    core = model.model
    on = (gates[..., 1:] > 0).view(*gates.shape[:-1], n_layers, n_heads)  # (L, H) | (B, T, L, H)
    if gates.dim() == 3:  # per layer: its (B, T, H) mask, contiguous
        on = on.permute(2, 0, 1, 3).contiguous()
    if gates.dim() == 3 and skip == "query" and not start:  # what the query path reads, for every layer at once
        shares = on.flatten(1, 2).float().mean(1).tolist()  # each head's share of positions
        on_f = on.to(core.embed_tokens.weight.dtype)  # the same as gates
        inv_count = 1 / (on_f.sum(-1, dtype=torch.float32) * shape.head_dim).clamp_min(1)  # (L, B, T): the q-norm's mean
    stream = core.embed_tokens(input_ids)
    positions = torch.arange(start, start + t, device=input_ids.device)[None]
    cos, sin = core.rotary_emb(stream, positions)  # (1, T, D)
    inputs = []
    def run_layer(idx: int, layer, stream: torch.Tensor) -> torch.Tensor:
        heads_on = on[idx]
        x = family.attention_input(layer, stream)
        if cache is not None and start:
            s = _decode_attention(family, layer, x, heads_on, cos, sin, skip, cache, idx)
        elif gates.dim() == 1:
            s = _shared_attention(family, layer, x, heads_on, cos, sin, skip, cache, idx)
        elif skip == "full":
            s = _packed_attention(family, layer, x, heads_on, cos, sin, cache, idx)
        else:
            s = _query_attention(family, layer, x, on_f[idx], inv_count[idx], shares[idx], cos, sin, cache, idx)
        if s is not None:  # None: no head ran, the attention adds nothing
            stream = stream + family.attention_output(layer, s)
        return stream + family.mlp(layer, stream)

    first = 0
    if resume is not None:
        first, stream = resume
        d = core.embed_tokens.weight.shape[1]
        if tuple(stream.shape) != (bsz, t, d) or not 0 <= first < n_layers:
            raise TopologyError(f"resume: a layer of {n_layers} and a stream ({bsz}, {t}, {d}); got layer {first}, "
                                f"{tuple(stream.shape)}")
    for idx, layer in enumerate(core.layers[:n_layers]):
        if idx < first:  # resumed: the caller's stream already holds these layers' work
            continue
        if layer_inputs:
            inputs.append(stream)
        # checkpointed only where autograd records, so never with a cache (no_grad)
        stream = layer_call(functools.partial(run_layer, idx, layer), stream)
    if cache is not None:
        cache.length = start + t
    hidden = core.norm(stream)
    return Output(model.lm_head(hidden), hidden, torch.cat(inputs, -1) if layer_inputs else None)


# Each attention path below takes what the layer's projections read (``family.attention_input`` of
# the stream) and returns the output projection's sum (B, T, d) of the heads that ran, or None when
# none did; the caller adds ``family.attention_output`` of it to the stream.


def _rows(weight: torch.Tensor, heads: torch.Tensor | None, d_head: int) -> torch.Tensor:
    """The rows of a (H·D, d) projection weight that belong to ``heads`` (None: all, no copy)."""
    return weight if heads is None else weight.view(-1, d_head, weight.shape[-1])[heads].flatten(0, 1)


def _cols(weight: torch.Tensor, heads: torch.Tensor | None, d_head: int) -> torch.Tensor:
    """The columns of the (d, H·D) output projection that belong to ``heads`` (None: all)."""
    return weight if heads is None else weight.view(weight.shape[0], -1, d_head)[:, heads].flatten(1)


def _subset(heads: torch.Tensor, n_heads: int) -> torch.Tensor | None:
    return None if len(heads) == n_heads else heads


def _shared_attention(family, layer, x, heads_on, cos, sin, skip, cache, idx):
    """One topology for every position: only the running heads' queries, values and attention (and
    keys, in ``full`` mode; in ``query`` mode every key, for the k-norm and the cache). Under grouped
    attention a key/value head is computed where any head of its group runs."""
    attn, shape = layer.self_attn, family.shape
    d_head, n_heads, group = shape.head_dim, shape.n_heads, shape.group
    run = heads_on.nonzero().squeeze(1)
    h = len(run)
    bsz, t, _ = x.shape
    run_groups = run if group == 1 else torch.unique(run // group)  # sorted
    key_groups = torch.arange(shape.n_kv_heads, device=x.device) if skip == "query" else run_groups
    value_groups = key_groups if cache is not None else run_groups  # a cache keeps what later positions read
    if h == 0 and (cache is None or skip == "full"):
        return None
    size = (bsz, t, -1, d_head)
    q = F.linear(x, _rows(attn.q_proj.weight, _subset(run, n_heads), d_head)).view(size)
    k = F.linear(x, _rows(attn.k_proj.weight, _subset(key_groups, shape.n_kv_heads), d_head)).view(size)
    v = F.linear(x, _rows(attn.v_proj.weight, _subset(value_groups, shape.n_kv_heads), d_head)).view(size)
    if family.qk_norm:
        q_w, k_w, eps = family.qk_norm_weights(layer)
        q = _rope(_norm(q, _mean_square(q), eps, q_w[run]), cos[:, :, None], sin[:, :, None])
        k = _rope(_norm(k, _mean_square(k), eps, k_w[key_groups]), cos[:, :, None], sin[:, :, None])
    else:
        q, k = _rope(q, cos[:, :, None], sin[:, :, None]), _rope(k, cos[:, :, None], sin[:, :, None])
    if cache is not None:  # the prefill: query mode keeps every head's key and value, full mode the running heads'
        cache.kv[idx, 0, :, :, :t].index_copy_(1, key_groups, k.transpose(1, 2))
        cache.kv[idx, 1, :, :, :t].index_copy_(1, key_groups, v.transpose(1, 2))
        cache.stored[idx, :, key_groups] = t
        if h == 0:
            return None
    if group > 1:  # each running head reads its group's key and value
        k = k[:, :, torch.searchsorted(key_groups, run // group)]
        v = v[:, :, torch.searchsorted(value_groups, run // group)]
    elif skip == "query" and h < n_heads:  # the running heads' keys (and, kept for the cache, values) among all heads'
        k = k[:, :, run]
        v = v[:, :, run] if cache is not None else v
    z = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                       scale=attn.scaling)
    w_o = _cols(attn.o_proj.weight, _subset(run, n_heads), d_head)
    return F.linear(z.transpose(1, 2).reshape(bsz, t, -1), w_o)


def _query_attention(family, layer, x, g, inv_count, share, cos, sin, cache, idx):
    """Per-position gates, ``query`` mode: K/V once per position for every key/value head; queries
    and outputs of the heads that run somewhere in the batch (``share`` (H,): the share of positions
    each runs at, a list); a busy head attends every query causally, its outputs zeroed where it is
    off; at long context a sparse head attends only its active queries
    (:func:`lookahead.graph.staircase.staircase_attention`). g (B, T, H): the layer's 0/1 gates;
    inv_count (B, T): 1 / (D · the heads running at each position)."""
    attn, shape = layer.self_attn, family.shape
    d_head, group = shape.head_dim, shape.group
    bsz, t, _ = x.shape
    n_heads = len(share)
    size = (bsz, t, -1, d_head)
    k = F.linear(x, attn.k_proj.weight).view(size)
    v = F.linear(x, attn.v_proj.weight).view(size)
    if family.qk_norm:
        q_w, k_w, eps = family.qk_norm_weights(layer)
        k = _rope(_norm(k, _mean_square(k), eps, k_w), cos[:, :, None], sin[:, :, None])
    else:
        k = _rope(k, cos[:, :, None], sin[:, :, None])
    if cache is not None:
        cache.kv[idx, 0, :, :, :t] = k.transpose(1, 2)
        cache.kv[idx, 1, :, :, :t] = v.transpose(1, 2)
        cache.stored[idx] = t
    run = [h for h in range(n_heads) if share[h] > 0]
    if not run:
        return None
    sub = None if len(run) == n_heads else torch.tensor(run, device=x.device)
    if group > 1:  # each running head reads its group's key and value
        heads = torch.arange(n_heads, device=x.device) if sub is None else sub
        k, v = k[:, :, heads // group], v[:, :, heads // group]
        g = g if sub is None else g[..., sub]
    elif sub is not None:
        g, k, v = g[..., sub], k[:, :, sub], v[:, :, sub]
    q = F.linear(x, _rows(attn.q_proj.weight, sub, d_head)).view(size)
    if family.qk_norm:
        ms = torch.einsum("bthd,bth->bt", q.float().square(), g.float()) * inv_count
        w_q = q_w if sub is None else q_w[sub]
        q = _rope(_norm(q, ms[..., None].expand(q.shape[:-1]), eps, w_q), cos[:, :, None], sin[:, :, None])
    else:
        q = _rope(q, cos[:, :, None], sin[:, :, None])
    q, k, v, gt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), g.transpose(1, 2)[..., None]  # (B, h, T, …)
    z = flex.packed_query_attention(q, k, v, gt[..., 0] > 0, attn.scaling) if flex.wanted("prefill", x.device, t) else None
    if z is None:
        z = staircase.query_attention(q, k, v, gt, [share[h] for h in run], attn.scaling)
    w_o = _cols(attn.o_proj.weight, sub, d_head)
    return F.linear(z.transpose(1, 2).reshape(bsz, t, -1), w_o)


def _group_weights(layer, shape) -> torch.Tensor:
    """(H_kv, d, (group + 2) D): per key/value group, the query rows of its heads, then its key and
    value rows (the packed path's per-group projection)."""
    attn = layer.self_attn
    d = attn.q_proj.weight.shape[1]
    parts = (attn.q_proj.weight.view(shape.n_kv_heads, -1, d), attn.k_proj.weight.view(shape.n_kv_heads, -1, d),
             attn.v_proj.weight.view(shape.n_kv_heads, -1, d))
    return torch.cat(parts, 1).transpose(1, 2)


def _packed_attention(family, layer, x, heads_on, cos, sin, cache, idx):
    """Per-position gates, ``full`` mode: every (unit, row)'s active positions packed to the front of
    S slots (S the largest count), in position order — a unit is a head, or under grouped attention a
    key/value group, whose heads run together (:func:`lookahead.graph.runtime.check_groups`); Q/K/V,
    QK-norm, RoPE and causal attention on the slots only; outputs scattered back to their positions
    (0 elsewhere)."""
    attn, shape = layer.self_attn, family.shape
    d_head, group = shape.head_dim, shape.group
    bsz, t, d = x.shape
    act = heads_on.permute(2, 0, 1)  # (H, B, T)
    n_heads = act.shape[0]
    if group > 1:
        act = act[::group]  # (H_kv, B, T)
    units = act.shape[0]
    counts = act.sum(-1)  # (U, B)
    slots = int(counts.max())
    if cache is not None:
        cache.stored[idx] = counts.T
    if slots == 0:
        return None
    # active positions first, in order; then padding (which sees only real keys before it: dropped)
    pos = torch.sort((~act).to(torch.uint8), dim=-1, stable=True).indices[..., :slots]  # (U, B, S)
    valid = torch.arange(slots, device=x.device) < counts[..., None]
    tok = pos + torch.arange(bsz, device=x.device)[:, None] * t  # (U, B, S) into B·T
    if group == 1:
        w = _fused(layer).view(3, n_heads, d_head, d).permute(1, 3, 0, 2).reshape(n_heads, d, 3 * d_head)
    else:
        w = _group_weights(layer, shape)
    xp = x.reshape(bsz * t, d)[tok.view(units, -1)]  # (U, B·S, d)
    qkv = torch.bmm(xp, w).view(units, bsz, slots, group + 2, d_head)
    if group == 1:
        q, k, v = qkv.unbind(3)
    else:  # query head u·group + j of slot s; the group's key and value
        q = qkv[..., :group, :].permute(0, 3, 1, 2, 4).reshape(n_heads, bsz, slots, d_head)
        k, v = qkv[..., group, :], qkv[..., group + 1, :]
    dst = torch.where(valid, tok, bsz * t).view(-1)
    c, s = cos[0][pos], sin[0][pos]  # (U, B, S, D)
    if family.qk_norm:
        q_w, k_w, eps = family.qk_norm_weights(layer)
        # QK-norm: mean square over the heads that run at each position (padding: a spare row)
        sumsq = torch.stack([q, k], dim=-2).float().pow(2).sum(-1) * valid[..., None]  # (H, B, S, 2)
        per_tok = sumsq.new_zeros(bsz * t + 1, 2).index_add_(0, dst, sumsq.view(-1, 2))
        running = heads_on.reshape(bsz * t, n_heads).sum(-1).float() * d_head
        per_tok[:-1] /= running.clamp_min(1)[:, None]
        ms = per_tok[dst].view(n_heads, bsz, slots, 2)
        q = _rope(_norm(q, ms[..., 0], eps, q_w[:, None, None]), c, s)
        k = _rope(_norm(k, ms[..., 1], eps, k_w[:, None, None]), c, s)
    else:
        cq, sq = (c, s) if group == 1 else (c.repeat_interleave(group, 0), s.repeat_interleave(group, 0))
        q, k = _rope(q, cq, sq), _rope(k, c, s)
    if cache is not None:  # each (row, unit)'s own keys, in order, at the front of its buffer
        cache.kv[idx, 0, :, :, :slots] = k.transpose(0, 1)
        cache.kv[idx, 1, :, :, :slots] = v.transpose(0, 1)
    if group == 1:
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=attn.scaling)  # (H, B, S, D)
    else:  # heads second: SDPA maps query head h to key/value head h // group
        z = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True,
                                           scale=attn.scaling, enable_gqa=True).transpose(0, 1)
        dst = dst.view(units, -1).repeat_interleave(group, 0).view(-1)
    head = torch.arange(n_heads, device=x.device)[:, None, None].expand(n_heads, bsz, slots)
    z_tok = z.new_zeros(bsz * t + 1, n_heads, d_head)
    z_tok[dst, head.reshape(-1)] = z.reshape(-1, d_head)
    return F.linear(z_tok[:-1].view(bsz, t, -1), attn.o_proj.weight)


def _decode_attention(family, layer, x, heads_on, cos, sin, skip, cache, idx):
    """One new position per row against the cache: its key and value stored (``full``: only for the
    heads that run, under grouped attention the groups that run), attention of the running heads over
    their keys; outputs 0 where off."""
    attn, shape = layer.self_attn, family.shape
    d_head, group = shape.head_dim, shape.group
    bsz = x.shape[0]
    g = (heads_on.expand(bsz, 1, -1) if heads_on.dim() == 1 else heads_on)[:, 0]  # (B, H) bool
    gf = g.to(x.dtype)
    q, k, v = _split(F.linear(x[:, 0], _fused(layer)), shape)  # (B, H, D), (B, H_kv, D) twice
    c, s = cos[:, 0], sin[:, 0]
    if family.qk_norm:
        q_w, k_w, eps = family.qk_norm_weights(layer)
        q = _rope(_norm(q, _gated_mean_square(q, gf), eps, q_w), c[:, None], s[:, None])
        k_ms = _mean_square(k) if skip == "query" else _gated_mean_square(k, gf)
        k = _rope(_norm(k, k_ms, eps, k_w), c[:, None], s[:, None])
    else:
        q, k = _rope(q, c[:, None], s[:, None]), _rope(k, c[:, None], s[:, None])
    g_kv = g if group == 1 else g.unflatten(1, (-1, group)).any(-1)  # (B, H_kv): a group stores where a head runs
    keys, values = cache.kv[idx, 0], cache.kv[idx, 1]  # (B, H_kv, C, D)
    stored = cache.stored[idx]  # (B, H_kv)
    if skip == "query":
        keys[:, :, cache.length], values[:, :, cache.length] = k, v
        stored += 1
    else:
        rows, heads = g_kv.nonzero(as_tuple=True)
        at = stored[rows, heads]
        keys[rows, heads, at], values[rows, heads, at] = k[rows, heads], v[rows, heads]
        stored += g_kv.long()
    length = cache.length + 1 if skip == "query" else int(stored.max())
    if length == 0:
        return None
    lengths = stored if group == 1 else stored.repeat_interleave(group, 1)  # (B, H): each query head's keys
    z = flex.decode_attention(q, keys, values, lengths, g, attn.scaling) if flex.wanted("decode", x.device,
                                                                                           length) else None
    if z is None:
        bias = None
        if skip == "full" and not bool((lengths == length).logical_or_(~g).all()):  # a running head holds fewer keys
            seen = torch.arange(length, device=x.device) < lengths[..., None].clamp_min(1)  # (B, H, length)
            bias = torch.zeros(seen.shape, dtype=q.dtype, device=x.device).masked_fill_(~seen, float("-inf"))[:, :, None]
        z = F.scaled_dot_product_attention(q[:, :, None], keys[:, :, :length], values[:, :, :length],
                                           attn_mask=bias, scale=attn.scaling, enable_gqa=group > 1)[:, :, 0]
        z = torch.where(g[..., None], z, 0.0)  # (B, H, D); Flex's is 0 where off already
    return F.linear(z.reshape(bsz, 1, -1), attn.o_proj.weight)
