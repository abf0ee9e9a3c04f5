"""The head-graph runtime (docs/design.md): a causal LM's forward pass in which every attention head
reads its own input stream, built from the outputs of the heads that feed it. What differs between
model families (norm placement, QK-norm, the query → key/value head map, the MLP) is asked of the
model's family (:mod:`lookahead.lm.families`); this module names none.

For head j of layer l (node 1 + l·H + h) the input is

    x_j = A[0, j] · e + Σ_{l' < l} m_{l'} + Σ_{i a head of an earlier layer} A[i, j] · o_i

with e the token embedding, m the MLP contributions and o the head contributions. q_j, k_j, v_j are
head j's own slices of the projections applied to x_j (a pre-norm family normalises x_j first);
under grouped-query attention k_j and v_j are the rows of j's key/value head, whose query heads share
one input stream (their columns of A must be equal: :func:`check_groups`). A family with QK-norm over
the full width normalises q and k over the concatenation of the heads' own slices, each head weighted
by its gate — the stock function when every gate is 1, the mean over the heads that run when gates
are hard (so a soft pass with hard gates equals a hard pass that skips work).

Head contribution, post-norm family: o_j = g_j · w_post ⊙ (W_O[j] z_j) / rms_l, where rms_l is the
RMS of the layer's gated attention sum Σ_j g_j W_O[j] z_j, computed as the stock post-attention
RMSNorm does it: sqrt(mean(s²) + eps) with the model's own eps. The eps is the near-zero choice: a
layer whose heads are all off at a position contributes exactly 0 there, the division is always
defined, and o is continuous in g. Σ_j o_j is then exactly the stock post-attention norm of the
attention output. Pre-norm family: o_j = g_j · W_O[j] z_j, and the contributions simply add up.

The MLP of layer l and the final norm see the standard stream e + Σ o + Σ m of gated contributions.
A head that is off at a position (g = 0) has no query, key or value there: the other positions'
attention for that head excludes it. Soft gates enter the attention logits of key position t' as
log g_j(t'), whose limit at g = 0 is that exclusion.

``hard=True`` executes the same function without the work of (head, position) pairs whose gate is
0: with a shared topology the off heads (and the mixing into and out of them) are simply not
computed; with per-position topologies each head's active positions are packed (per batch row) and
only they get q/k/v projections, QK-norm, RoPE and attention. The mixing that builds x (a weighted
sum of earlier outputs) and the output projection of the D-wide attention outputs (0 for pairs that
did not run) are still computed for every pair in the per-position case.

Two semantics of a gate that is off (``runtime.skip``):

- ``full`` (the above): head j off at t has no query, key or value at t;
- ``query`` (MoH, MoA): head j off at t computes no query, attention row or output at t, but its key
  and value at t are computed from x_j(t) and every later query of head j reads them. The k-norm's
  mean square is then over every head's key (they all exist), the q-norm's over the running heads'
  queries, weighted by their gates as above; keys carry no log g. Per-token variation costs much
  less here: a head skipped at t does not blind the later positions that run it. Hard execution in
  this mode computes every head and masks its output (exact, no work skipped yet).

With adjacency = the allowed mask and gates = 1 the logits equal the stock Hugging Face forward
(tests/test_runtime.py, max abs difference ≤ 1e-5 in fp32), in both modes.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from lookahead.core.checkpointing import layer_call
from lookahead.core.config import OMIT_DEFAULT, to_dict
from lookahead.core.errors import LookaheadError, require
from lookahead.graph import attention
from lookahead.graph.nodes import allowed_mask, n_nodes, widen
from lookahead.lm.families.base import UNITS
from lookahead.lm.families.registry import Family, Shape, family_of


class TopologyError(LookaheadError, ValueError):
    """An adjacency, gates or model that the runtime cannot execute."""


SKIP_MODES = ("full", "query")


@dataclasses.dataclass
class RuntimeConfig:
    """How the head-graph runtime executes a head that is off at a position (docs/design.md)."""

    skip: str = "query"
    """full: no query, key or value there; query: no query, attention row or output, keys and values kept."""
    unit: str = dataclasses.field(default="head", metadata=OMIT_DEFAULT)
    """What a node of the head graph is: a query head (``head``) or a whole key/value group (``group``:
    its query heads, keys and values on or off together); the same on a model without grouped keys."""

    def __post_init__(self) -> None:
        require(self.skip in SKIP_MODES, "skip", f"must be one of {', '.join(SKIP_MODES)}; got {self.skip!r}")
        require(self.unit in UNITS, "unit", f"must be one of {', '.join(UNITS)}; got {self.unit!r}")


def recorded_skip(meta: dict) -> str:
    """The skip mode a saved predictor was trained under (its metadata's ``runtime``; ``full``
    for predictors saved before the mode existed): every stage runs its topologies the same way."""
    return meta.get("runtime", {}).get("skip", "full")


def recorded_unit(meta: dict) -> str:
    """The routing unit a saved predictor (or a stage's output) was made under (``head`` where none
    is recorded: the default, omitted from saved configs)."""
    return meta.get("runtime", {}).get("unit", "head")


def meta_runtime(meta: dict) -> dict:
    """The ``runtime`` section a file made from a saved predictor records: its skip mode, and its
    routing unit where not the default (omitted, as every saved config omits it)."""
    return to_dict(RuntimeConfig(recorded_skip(meta), recorded_unit(meta)))


def unit_shape(model, unit: str) -> tuple[int, int]:
    """(layers, nodes per layer) of a model's head graph under a routing unit (:data:`UNITS`)."""
    shape = family_of(model).shape
    return shape.n_layers, shape.units(unit)


def to_heads(shape: Shape, adjacency: torch.Tensor | None, gates: torch.Tensor | None):
    """(adjacency, gates) over query heads: a topology over key/value groups (``runtime.unit:
    group``) widened, every head of a group with its group's gate and edges
    (:func:`lookahead.graph.nodes.widen`); one over heads as it is. Every executor's entry."""
    n_layers, n_heads, group = shape.n_layers, shape.n_heads, shape.group
    return widen(adjacency, n_layers, n_heads, group, dims=2), widen(gates, n_layers, n_heads, group)


def check_model(model) -> Family:
    """The family of a causal LM the runtime can rewire (:func:`lookahead.lm.families.family_of`:
    validated once per model, an unsupported family or feature refused naming its config key)."""
    return family_of(model)


def check_groups(adjacency: torch.Tensor | None, gates: torch.Tensor | None, shape: Shape, skip: str) -> None:
    """Under grouped-query attention a key/value group has one input stream and, in ``full`` mode,
    one gate per position: its query heads' columns of the adjacency must be equal, and so must
    their per-position gates (a single query head cannot drop keys its group shares). Shared gates
    may differ inside a group: the group's keys and values exist where any of its heads runs, and a
    head whose shared gate is 0 — off at every position, as in a static mask — reads no stream, so
    its column is not compared (in ``full`` skip a pruned head's column is empty)."""
    if shape.group == 1:
        return
    n_layers, n_kv, group = shape.n_layers, shape.n_kv_heads, shape.group
    differ = torch.zeros(n_layers, n_kv, dtype=torch.bool)
    if adjacency is not None:
        cols = adjacency.detach()[..., 1:].unflatten(-1, (n_layers, n_kv, group))  # (…, N, L, G, g)
        on = torch.ones(n_layers, n_kv, group, dtype=torch.bool, device=cols.device)
        if gates is not None and gates.dim() == 1:  # shared gates: the heads that run somewhere
            on = gates.detach()[1:].view(n_layers, n_kv, group) != 0
        first = on.to(torch.uint8).argmax(-1, keepdim=True)  # (L, G, 1): each group's first head that runs
        reference = torch.gather(cols, -1, first.expand(*cols.shape[:-1], 1))
        differ = ((cols != reference) & on).flatten(0, -4).any(0).any(-1)  # (L, G)
    if bool(differ.any()):
        layer, grp = differ.nonzero()[0].tolist()
        raise TopologyError(f"layer {layer}, key/value group {grp}: its query heads read different input streams "
                            "(adjacency columns differ); under grouped-query attention a group has one stream")
    if skip == "full" and gates is not None and gates.dim() > 1:
        g = gates.detach()[..., 1:].unflatten(-1, (n_layers, n_kv, group))
        differ = (g != g[..., :1]).flatten(0, -4).any(0).any(-1)
        if bool(differ.any()):
            layer, grp = differ.nonzero()[0].tolist()
            raise TopologyError(f"layer {layer}, key/value group {grp}: full skip of a single query head on a grouped "
                                "model (its group's keys and values are shared); route whole key/value groups "
                                "(routing unit: group) or use runtime.skip: query")


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
    off = ~_allowed(n_layers, n_heads, adjacency.device).flatten()
    flat = adjacency.detach().reshape(-1, n * n)
    if not bool(torch.isfinite(flat.sum())):  # one reduction; NaN or inf anywhere makes it non-finite
        where = (~torch.isfinite(flat)).nonzero()
        if not len(where):
            raise TopologyError("adjacency weights are too large: their sum overflows")
        pos, edge = where[0].tolist()
        raise TopologyError(f"adjacency holds a non-finite value ({flat[pos, edge].item()}) at position {pos} "
                            f"(flattened over the leading dims), edge {divmod(edge, n)}")
    # one matmul sums each position's |weight| off the mask; the exact test runs only if that is not 0 (or NaN)
    if bool((flat.abs() @ off.to(flat.dtype)).any()) and bool(flat[:, off].ne(0).any()):
        raise TopologyError("adjacency has weight on edges that are not allowed (layer(i) >= layer(j)); "
                            "mask it with lookahead.graph.nodes.allowed_mask")
    if gates is not None and gates.shape != adjacency.shape[:-1]:
        raise TopologyError(f"gates must have shape {tuple(adjacency.shape[:-1])} to match the adjacency; "
                            f"got {tuple(gates.shape)}")
    if gates is not None:
        g = gates.detach()[..., 1:]
        if not bool(((g >= 0) & (g <= 1)).all()):  # NaN fails both comparisons
            bad = g[~((g >= 0) & (g <= 1))][0].item()
            raise TopologyError(f"gates must lie in [0, 1]; got {bad}")


@functools.lru_cache(maxsize=16)
def _allowed(n_layers: int, n_heads: int, device: torch.device) -> torch.Tensor:
    """``graph.allowed_mask`` on a device, made once (read only)."""
    return allowed_mask(n_layers, n_heads).to(device)


def forward_with_topology(model, input_ids: torch.Tensor, adjacency: torch.Tensor,
                          gates: torch.Tensor | None = None, hard: bool = False, skip: str = "full") -> torch.Tensor:
    """Logits (B, T, V) of a causal LM (:mod:`lookahead.lm.families`) run over a head graph.

    Args:
        model: a transformers causal LM of a supported family (frozen or trainable; gradients flow to its
            weights and to ``adjacency`` / ``gates``).
        input_ids: (B, T) token ids.
        adjacency: edge weights A[i, j], zero outside ``graph.allowed_mask``: (N, N) shared by all
            positions or (B, T, N, N) per position.
        gates: head gates g, (N,) or (B, T, N) like the adjacency's leading dims; entry 0 (the
            source) is ignored. None: 1 for every head with incoming weight, 0 otherwise.
        hard: skip the work of (head, position) pairs whose gate is 0 (same function).
        skip: what a gate of 0 removes, ``full`` or ``query`` (:class:`RuntimeConfig`).

    Nodes are query heads, or key/value groups (N = 1 + L·G, ``runtime.unit: group``: widened to
    heads, :func:`to_heads`).
    """
    if skip not in SKIP_MODES:
        raise TopologyError(f"skip must be one of {', '.join(SKIP_MODES)}; got {skip!r}")
    query = skip == "query"
    family = check_model(model)
    n_layers, n_heads = family.shape.n_layers, family.shape.n_heads
    adjacency, gates = to_heads(family.shape, adjacency, gates)
    _validate(adjacency, gates, input_ids, n_layers, n_heads)
    check_groups(adjacency, gates, family.shape, skip)
    if gates is None:
        gates = default_gates(adjacency.detach())
    shared = adjacency.dim() == 2
    # shortcuts for gates of exactly 1 (or 0), taken only when no gradient has to reach them
    gates_fixed = not (torch.is_grad_enabled() and gates.requires_grad)
    core = model.model

    # Contributions are head-first, (s, B, T, d) shared and (s, B·T, d) per position; the heads'
    # inputs are head-first shared and token-first (B·T, h, d) per position: either way, mixing is
    # one (batched) matmul per block of sources.
    e = core.embed_tokens(input_ids)  # (B, T, d)
    bsz, t, d = e.shape
    position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
    cos, sin = (c[0].float() for c in core.rotary_emb(e, position_ids))  # (T, D)
    half = sin.shape[-1] // 2
    sin_signed = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)  # for the rolled form of RoPE
    a = adjacency.to(device=e.device, dtype=e.dtype)  # (N, N) | (B, T, N, N)
    gates = gates.to(e.device)
    # per layer: its nodes (a slice), its heads that run (None: all), whether their gates are all 1
    if shared:
        run, layers = _shared_layers(gates, n_layers, n_heads, hard and not query, gates_fixed)
        all_on = all(heads is None and ones for _, heads, ones in layers)
        if run is not None:  # renumber the nodes that run 0, 1, …: every layer's are a slice
            a, gates = a[run][:, run], gates[run]
    else:  # per position every layer's nodes are its heads' own slice, each run (the gates say where)
        all_on = gates_fixed and bool((gates[..., 1:] == 1).all())
        layers = [(slice(1 + i * n_heads, 1 + (i + 1) * n_heads), None, all_on) for i in range(n_layers)]
    packing = (_Packing(gates, n_layers, n_heads, family.shape.head_dim)
               if hard and not query and not shared and not all_on else None)
    if packing is not None:
        cos_sin = torch.stack([cos, sin_signed], dim=1)  # (T, 2, D), read by position
    g_all = gates if shared else gates.permute(2, 0, 1)  # (N,) | (N, B, T)
    stream = e  # the standard stream e + Σ o + Σ m
    msum = torch.zeros_like(e)  # Σ m over the layers so far
    # (node ids, head-first contributions (s, B, T, d) | (s, B·T, d)): the source, then the heads
    # that ran, layer by layer
    blocks = [(slice(0, 1), e[None] if shared else e.reshape(1, -1, d))]

    def run_layer(layer_idx: int, layer, stream: torch.Tensor, msum: torch.Tensor, *outputs: torch.Tensor):
        """One layer: (its heads' contributions or None, the stream and Σ m after it); ``outputs``
        are the earlier blocks' contributions (a function of tensors: checkpointing re-runs it)."""
        cols, heads, ones = layers[layer_idx]
        sources = [(ids, o) for (ids, _), o in zip(blocks, outputs)]
        out = None
        last = layer_idx == n_layers - 1  # no head reads the last layer's contributions
        g = None if ones else g_all[cols]  # (h,) | (h, B, T)
        if shared and (heads is None or len(heads)):
            out = attention.head_outputs(family, layer, heads, _mix_shared(a, cols, msum, sources), g, cos,
                                         sin_signed, not last, query)
        elif not shared:
            x_tok = _mix_tokens(a, cols, msum, sources)  # (B·T, h, d)
            if packing is not None:
                out = _packed_heads(family, layer, packing.layer(layer_idx), x_tok, msum, cos_sin, not last)
            else:
                x = x_tok.view(bsz, t, -1, d).permute(2, 0, 1, 3)
                o, total = attention.head_outputs(family, layer, heads, x, g, cos, sin_signed, not last, query)
                out = None if o is None else o.view(-1, bsz * t, d), total
        contribution = None
        if out is not None:
            contribution = out[0]
            stream = stream + out[1]
        mlp = family.mlp(layer, stream)
        return contribution, stream + mlp, msum + mlp

    for layer_idx, layer in enumerate(core.layers[:n_layers]):
        contribution, stream, msum = layer_call(functools.partial(run_layer, layer_idx, layer), stream, msum,
                                                *(o for _, o in blocks))
        if contribution is not None:
            blocks.append((layers[layer_idx][0], contribution))
    return model.lm_head(core.norm(stream))


def _shared_layers(gates: torch.Tensor, n_layers: int, n_heads: int, hard: bool, gates_fixed: bool):
    """For shared gates (N,) the nodes that run, source first (None: all of them), and per layer
    (its running nodes as a slice of those, their head ids or None for all, whether their gates
    are all exactly 1 and need no gradient). In soft mode every head runs; in hard mode those
    with g > 0."""
    nodes, layers = [0], []
    for layer_idx, row in enumerate(gates.detach()[1:].view(n_layers, n_heads).tolist()):
        run = [h for h, v in enumerate(row) if v > 0 or not hard]
        ones = gates_fixed and all(row[h] == 1 for h in run)
        cols = slice(len(nodes), len(nodes) + len(run))
        nodes += [1 + layer_idx * n_heads + h for h in run]
        heads = None if len(run) == n_heads else torch.tensor(run, dtype=torch.long, device=gates.device)
        layers.append((cols, heads, ones))
    run = None if len(nodes) == gates.shape[0] else torch.tensor(nodes, dtype=torch.long, device=gates.device)
    return run, layers


def _mix_shared(a, cols, msum, blocks) -> torch.Tensor:
    """Input streams Σ m + Σ_i A[i, j] o_i of heads ``cols`` for a shared adjacency a (N, N).

    blocks: (rows of a — a slice or (s,) ids —, outputs (s, B, T, d)), the first being the
    source (node 0, the embedding); cols likewise. Returns (h, B, T, d).
    """
    (src, e), rest = blocks[0], blocks[1:]
    x = torch.addmm(msum.reshape(1, -1), a[src][:, cols].T, e.reshape(1, -1))  # broadcasts Σ m over the heads
    for src, o in rest:  # one matmul per block, in place: backward needs no old x
        x = x.addmm_(a[src][:, cols].T, o.reshape(o.shape[0], -1))
    return x.view(-1, *msum.shape)


def _mix_tokens(a, cols: slice, msum, blocks) -> torch.Tensor:
    """Input streams Σ m + Σ_i A[i, j] o_i of heads ``cols`` for a per-position adjacency a (B, T, N, N).

    blocks: (node ids (slice), outputs (s, B·T, d)), the first being the source (node 0, the
    embedding). Returns (B·T, h, d).
    """
    bsz, t, n = a.shape[:3]
    ac = a[..., cols].transpose(-1, -2).reshape(bsz * t, -1, n)  # (B·T, h, N), one compact copy for the matmuls
    (src, e), rest = blocks[0], blocks[1:]
    x = torch.addcmul(msum.reshape(bsz * t, 1, -1), ac[..., src], e.transpose(0, 1))  # Σ m + A[0, j] e
    for src, o in rest:  # (B·T, h, s) @ (B·T, s, d), in place: backward needs no old x
        x = x.baddbmm_(ac[..., src], o.transpose(0, 1))
    return x


class _Packing:
    """Where each (head, position) pair with g > 0 runs under per-position hard gates, for every
    head at once: each (head, batch row)'s active positions packed to the front, in order, of S_l
    slots, S_l the largest active count among layer l's heads.

    gates (B, T, N). Per layer (:meth:`layer`), flat over (h, B, S_l): the slot's row of the layer's
    token-first (B·T, h) pairs, the same with padding slots sent to a spare row B·T·h, its token
    (into B·T) with padding sent to a spare row B·T, and its position (padding: 0); plus the
    slots' gates (h, B, S_l), 0 on padding (None when every gate is 0 or 1), and the per-token
    weight totals of the QK-norm's mean.
    """

    def __init__(self, gates: torch.Tensor, n_layers: int, n_heads: int, d_head: int):
        bsz, t, _ = gates.shape
        self.n_heads = n_heads
        dev = gates.device
        g = gates[..., 1:].permute(2, 0, 1)  # (L·H, B, T)
        active = g > 0
        # every gate 0 or 1 and none needing a gradient: nothing is scaled and keys need no log g bias
        self.binary = not (torch.is_grad_enabled() and g.requires_grad) and torch.equal(g, active.to(g.dtype))
        ahead = active.cumsum(-1)  # active positions up to and including each
        counts = ahead[..., -1]  # (L·H, B)
        self.slots = counts.view(n_layers, n_heads, bsz).amax((1, 2)).tolist()
        # each active position to its slot, the others to a column that is dropped: padding slots
        # hold position 0
        at = torch.arange(t, device=dev)
        order = torch.zeros(*counts.shape, t + 1, dtype=torch.long, device=dev)
        order = order.scatter_(-1, torch.where(active, ahead - 1, t), at.expand_as(active))[..., :t]
        valid = at < counts[..., None]  # (L·H, B, T)
        head = (torch.arange(n_layers * n_heads, device=dev) % n_heads).view(-1, 1, 1)
        tok = order + torch.arange(bsz, device=dev).view(1, bsz, 1) * t
        row = tok * n_heads + head
        self.index = torch.stack([row, torch.where(valid, row, bsz * t * n_heads), torch.where(valid, tok, bsz * t), order])
        self.gates = None if self.binary else torch.gather(g, 2, order) * valid  # (L·H, B, T)
        # d_head · Σ_h g per token and layer (B·T + 1, L), the spare row (padding's) 1: the QK-norm's
        # mean is over the running heads' slices
        g_sum = gates[..., 1:].float().view(bsz * t, n_layers, n_heads).sum(-1)
        self.g_tok = torch.cat([(g_sum * d_head).clamp_min(torch.finfo(torch.float32).tiny), g_sum.new_ones(1, n_layers)])

    def layer(self, idx: int):
        heads = slice(idx * self.n_heads, (idx + 1) * self.n_heads)
        slots = self.slots[idx]
        row, row_dst, tok_dst, pos = self.index[:, heads, :, :slots].reshape(4, -1)
        gates = None if self.gates is None else self.gates[heads, :, :slots]
        return slots, row, row_dst, tok_dst, pos, gates, self.g_tok[:, idx : idx + 1], self.binary


def _packed_heads(family, layer, packing, x_tok, msum, rope, contributions: bool = True
                  ) -> tuple[torch.Tensor | None, torch.Tensor] | None:
    """``attention.head_outputs`` for per-position hard gates, computing only the (head, position) pairs with g > 0.

    Projections, QK-norm, RoPE and attention run on the packed slots of :class:`_Packing` only;
    the output projection reads the token-first attention outputs, 0 for the pairs that did not
    run. Inputs: packing (``_Packing.layer``), x_tok (B·T, h, d) input streams, msum (B, T, d)
    (for its shape), rope (T, 2, D): cos and signed sin by position. Returns (head-first
    contributions (h, B·T, d), exactly 0 where g = 0, or None unless ``contributions``; their sum
    (B, T, d)), or None when no pair is active.
    """
    slots, row_of_slot, row_dst, tok_dst, pos, gp, g_tok, binary = packing
    if slots == 0:
        return None
    attn = layer.self_attn
    d_head = attn.head_dim
    n_h, (bsz, t, d) = x_tok.shape[1], msum.shape

    w_qkv, w_o, qk_w = attention.head_weights(family, layer, None)
    xp = x_tok.reshape(-1, d).index_select(0, row_of_slot).view(n_h, bsz, slots, d)  # input streams of the slots
    qkv = attention.project(family.attention_input(layer, xp), w_qkv)  # (h, B, S, 3D)
    qk, v = qkv[..., : 2 * d_head].unflatten(-1, (2, d_head)), qkv[..., 2 * d_head:]

    cos_sin = rope.index_select(0, pos).view(n_h, bsz, slots, 2, 1, -1)  # each slot's position's
    if family.qk_norm:
        eps = family.qk_norm_weights(layer)[2]
        sumsq = qk.float().pow(2).sum(-1)  # (h, B, S, 2)
        if not binary:
            sumsq = sumsq * gp[..., None].float()
        # the gated mean square per token (padding slots: a spare row), then back to the slots
        ms = sumsq.new_zeros(bsz * t + 1, 2).index_add_(0, tok_dst, sumsq.view(-1, 2)).div_(g_tok).index_select(0, tok_dst)
        x = qk.float() * qk_w.float()[:, None, None]  # the norm weights, applied before RoPE here
        q, k = attention.qk_norm_rope(x, ms.view(n_h, bsz, slots, 2), eps, cos_sin[..., 0, :, :], cos_sin[..., 1, :, :],
                                      qk.dtype)
    else:
        q, k = attention.rope(qk.float(), cos_sin[..., 0, :, :], cos_sin[..., 1, :, :], qk.dtype).unbind(-2)

    # Real slots are in position order and padding comes last, so "key slot <= query slot" is
    # exactly "a real key at or before the query's position": slot-causal attention. Gates other
    # than 1 add log g to their keys' logits (padding keys: g = 0, excluded).
    z = attention.attend(attn, q, k, v, None if binary else gp)
    if not binary:
        z = z * gp[..., None].to(z.dtype)  # gated: o_j = g_j W_O[j] z_j

    # back to token-first (B·T, h, D), 0 for every pair that did not run (padding: a spare row);
    # from here on the work is per token: the o projection reads D-wide rows, not the d-wide x
    z_tok = z.new_zeros(bsz * t * n_h + 1, d_head).index_put_((row_dst,), z.reshape(-1, d_head))[:-1]
    s = (z_tok.view(bsz * t, n_h * d_head) @ attn.o_proj.weight.T).float()  # gated attention sum (B·T, d)
    # (h, B·T, d) contributions, exactly 0 where g = 0
    o = torch.bmm(z_tok.view(bsz * t, n_h, d_head).transpose(0, 1), w_o) if contributions else None
    o, total = family.contributions(layer, s, o, xp.dtype)
    return o, total.view(bsz, t, d)
