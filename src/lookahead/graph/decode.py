"""A compiled decode step for routed generation: every layer of one step — gates, QK-norm, RoPE, the
KV cache write, attention of the running heads only, the MLP, the LM head — as one ``torch.compile``
graph over a preallocated cache, and a per-token router's step (its MLP, the hard top-K, the step's
bookkeeping) as a second one.

Why two graphs: which (row, head) pairs run is decided by the router, and the step reads the cache
of those pairs only, so their count is a shape. The router's graph returns, per layer, the running
pairs first (a stable sort, so in (row, head) order), their count and the longest key run among
them; the host reads those 2·L integers (one small transfer) and the layers' graph takes them as
sizes. The sizes are symbolic (``dynamic=True``): one compilation serves every count and every cache
length, so a topology that changes every step recompiles nothing. The skip mode is in the graphs'
inputs (which pairs store a key; which keys a shared step's k-norm spans), not in their code. The
bound, per model: one per-token graph, one shared-topology graph and one graph per router, each
once more for batch 1, and a shared graph once more per pattern of layers with 0 or 1 running heads
(sizes 0 and 1 are specialised; other sizes that happen to be equal are not, :data:`_NO_DUCK_SHAPES`);
:attr:`DecodeStep.compilations` counts them, and a test holds them fixed over a generation whose
topology changes every step. On CUDA the sizes are rounded up (:data:`BUCKETS`) so that the graphs
CUDA-graph capture records stay a bounded set: pairs to a multiple of the batch, keys to 256.

The prefill is the plan's (:func:`lookahead.graph.plan.gated_forward` into a
:class:`lookahead.graph.plan.KVCache`); the step then keeps each layer's keys and values as tensors
of its own and writes them in place. In ``full`` mode each (row, head) holds its keys and values
only at the positions where it ran, in order at the front of its buffer: ragged lengths in a static
buffer. A step writes the new key of *every* (row, head) at its own next slot and advances only the
running ones, so an off head's write is overwritten the next time it runs and never read; attention
masks each running pair's keys past its own length. What that costs against the ideal: the pair with
the most stored keys sets the loop length for all pairs of its layer (at 50 % off and T = 2048 about
5 % more keys than the mean), and a key and value of every head is projected and written (a
``d × 2d`` matmul per layer; the FLOP ideal counts only the running heads'). In ``query`` mode every
head stores every position and a running head reads them all.

Attention over the running pairs is written as a gather and two reductions, not
``scaled_dot_product_attention``: inductor fuses the gather into the loads of the reductions, so a
step reads the keys and values of the running pairs and no others, with no copy (an SDPA call needs
its pairs in one strided tensor, and gathering them copies as much as skipping saves).

A shared topology (one set of heads for every position, no router) is fixed at the prefill: the step
keeps only its running heads' caches, (B, h_l, capacity, D) per layer, and their rows and columns of
the weights (:func:`shared_weights`), and runs SDPA over them — the stock kernel on fewer heads.

Exactness: the step's logits equal the plain per-head reference (tests/reference_head_graph.py)
within 1e-5 in fp32 over whole generations, and greedy generation yields the eager plan's tokens (tests).
"""

from __future__ import annotations

import functools
import time
import weakref

import torch
import torch.fx.experimental._config
import torch.nn.functional as F

from lookahead.core.errors import LookaheadError
from lookahead.graph.nodes import widen
from lookahead.graph.plan import KVCache, Output, _binary, _fused, _rope, _split, gated_forward
from lookahead.graph.runtime import SKIP_MODES, check_model

BUCKETS = {"cuda": (True, 256), "cpu": (False, 1)}
"""Per device type: (pairs rounded up to a multiple of the batch, keys rounded up to a multiple of
this): bounded shapes where graphs are captured per shape (CUDA graphs), exact sizes elsewhere."""

MODES = {"cuda": "reduce-overhead", "cpu": "default"}
"""``torch.compile`` mode per device type: CUDA-graph capture on GPUs (a decode step is
launch-bound), inductor's default on CPU (no graphs to capture)."""


class DecodeError(LookaheadError, ValueError):
    """A compiled decode step asked for something it cannot run."""


class DecodeStep:
    """Routed decode steps of a causal LM with one compiled graph per step kind.

    Args:
        model: a transformers causal LM of a supported family (:mod:`lookahead.lm.families`) in eval mode.
        batch: rows decoded side by side.
        capacity: positions the cache holds (prompt plus new tokens).
        skip: ``full`` or ``query`` (:class:`lookahead.graph.runtime.RuntimeConfig`).
        router: a :class:`lookahead.graph.deployed.Router` whose gates the step computes itself
            (per token, from the routed model's own previous hidden state); None: gates are given
            to :meth:`step` (shared or per token).
    """

    def __init__(self, model, batch: int, capacity: int, skip: str, router=None):
        shape = check_model(model).shape
        self.n_layers, self.n_heads, self.group = shape.n_layers, shape.n_heads, shape.group
        if skip not in SKIP_MODES:
            raise DecodeError(f"skip must be one of {', '.join(SKIP_MODES)}; got {skip!r}")
        if router is not None and getattr(router.predictor.cfg, "weights", "binary") != "binary":
            raise DecodeError("the compiled step runs 0/1 head gates; this router scales them (gate_weights: softmax)")
        self.model, self.batch, self.skip, self.router = model, batch, skip, router
        self.cache = KVCache(model, batch, capacity, skip)
        p = next(model.parameters())
        self.device = p.device
        self.round_pairs, self.round_keys = BUCKETS.get(self.device.type, BUCKETS["cpu"])
        self.shared = None  # a shared topology's gates (N,), set by the prefill
        self.weights = None  # its per-layer weights (shared_weights)
        # each layer's W_qkv as the plan fuses it (again where a weight changed since), for this generation
        self.fused = [_fused(layer) for layer in model.model.layers[: self.n_layers]]
        # every pair stores each step's key and value (and the k-norm spans it) in ``query`` mode,
        # only the running pairs in ``full`` mode: the per-token graph's input that says which
        self.every = torch.full((self.n_layers, batch, shape.n_kv_heads), skip == "query", device=self.device)
        self.graphs = _model_graphs(model)
        self._route = self.graphs.route(router) if router is not None else None

    @property
    def compilations(self) -> int:
        """Graphs compiled so far for this model: its per-token layers' graph, its shared-topology
        graph and every router's (shared by every step object of the model)."""
        return self.graphs.compilations

    @property
    def compile_s(self) -> float:
        """Seconds of the steps that compiled them."""
        return self.graphs.compile_s

    def prefill(self, prompt: torch.Tensor, gates: torch.Tensor) -> Output:
        """The prompt (B, P) through the plan under ``gates`` ((N,) shared or (B, P, N); over query
        heads or key/value groups), filling the cache."""
        gates = widen(gates, self.n_layers, self.n_heads, self.group)
        if prompt.shape[0] != self.batch:
            raise DecodeError(f"this step decodes {self.batch} rows; the prompt has {prompt.shape[0]}")
        if self.cache.kv is None:
            raise DecodeError("this step's cache is filled already: a DecodeStep serves one generation")
        out = gated_forward(self.model, prompt, gates, self.skip, self.cache)
        # each layer's keys and values as tensors of their own: a step writes into them in place (a
        # write into a view of one shared buffer would copy the buffer)
        kv = self.cache.kv
        if gates.dim() == 1:  # a shared topology: its running heads' caches only, (B, h_l, capacity, D)
            self.shared = gates.clone()
            self.weights = shared_weights(self.model, gates, self.skip)
            # the key/value heads of the running heads, (B, h_kv, capacity, D) per layer
            runs = [None if w is None else w[2] for w in self.weights]
            self.keys = [None if run is None else kv[idx, 0][:, run].clone() for idx, run in enumerate(runs)]
            self.values = [None if run is None else kv[idx, 1][:, run].clone() for idx, run in enumerate(runs)]
        else:  # per token: every (row, key/value head)'s, (B·H_kv, capacity, D)
            self.keys = [kv[idx, 0].flatten(0, 1).clone() for idx in range(self.n_layers)]
            self.values = [kv[idx, 1].flatten(0, 1).clone() for idx in range(self.n_layers)]
        self.cache.kv = None
        if self.device.type == "cuda":  # CUDA graphs replay on fixed addresses: the cache is written in place
            for t in [*self.keys, *self.values, self.cache.stored, *(w for ws in self.weights or () if ws for w in ws)]:
                if t is not None:
                    torch._dynamo.mark_static_address(t)
        return out

    @torch.no_grad()
    def step(self, ids: torch.Tensor, gates: torch.Tensor | None = None, previous: torch.Tensor | None = None
             ) -> tuple[Output, torch.Tensor]:
        """One position per row: ``ids`` (B, 1) under ``gates`` ((N,) shared, (B, 1, N) per token) or,
        with a router, the gates it predicts from ``previous`` (B, 1, d), the final hidden state of
        the step before. Returns the step's :class:`Output` (logits (B, 1, V), hidden (B, 1, d)) and
        the gates it ran over query heads (B, 1, N); gates over key/value groups are widened."""
        gates = widen(gates, self.n_layers, self.n_heads, self.group)
        cache = self.cache
        if cache.length == 0:
            raise DecodeError("prefill the prompt first (DecodeStep.prefill)")
        if cache.length >= cache.capacity:
            raise DecodeError(f"the cache holds {cache.capacity} positions; all are used")
        if ids.shape != (self.batch, 1):
            raise DecodeError(f"a step takes ({self.batch}, 1) token ids; got {tuple(ids.shape)}")
        pos = torch.tensor([cache.length], device=self.device)
        ids = _fresh(ids)
        n = 1 + self.n_layers * self.n_heads
        if self.shared is not None and gates is None:
            raise DecodeError("this step was prefilled with a shared topology: pass it at every step")
        if gates is None:
            if self.router is None or previous is None:
                raise DecodeError("without a router, pass the step's gates; with one, the previous hidden state")
            g, on, order, counts, longest = _timed_call(self.graphs, self._route, ids, _fresh(previous.float()),
                                                        cache.stored)
        elif gates.shape == (n,):
            if self.shared is None or not torch.equal(gates, self.shared):
                raise DecodeError("a shared topology runs from the prefill on: this step was prefilled with "
                                  + ("per-token gates" if self.shared is None else "other gates"))
            logits, hidden = _timed_call(self.graphs, self.graphs.shared, ids, pos, self.weights, self.keys,
                                         self.values, cache.length + 1)
            cache.length += 1
            return Output(logits, hidden), gates.expand(self.batch, 1, n)
        elif gates.shape == (self.batch, 1, n):
            if self.shared is not None or not _binary(gates):
                raise DecodeError("per-token gates need a step prefilled with per-token gates, and 0/1 head gates "
                                  "with the source's gate 1")
            g = gates
            on, order, counts, longest = _bookkeeping(gates[:, 0, 1:] > 0, cache.stored, self.n_layers, self.group)
        else:
            raise DecodeError(f"gates must be ({n},) shared or ({self.batch}, 1, {n}) per token; got {tuple(gates.shape)}")
        sizes = torch.cat([counts, longest]).tolist()  # the one host read of the step
        pairs = [self._round(c, self.batch if self.round_pairs else 1) for c in sizes[: self.n_layers]]
        keys = [self._round(k, self.round_keys) for k in sizes[self.n_layers:]]
        logits, hidden, *_ = _timed_call(self.graphs, self.graphs.layers, ids, pos, on, self.every, order, counts,
                                         self.fused, self.keys, self.values, cache.stored, *pairs, *keys)
        cache.length += 1
        return Output(logits, hidden), g

    @staticmethod
    def _round(x: int, multiple: int) -> int:
        """``x`` rounded up to ``multiple``, at least 2 (sizes 0 and 1 would be specialised)."""
        return max(2, -(-x // multiple) * multiple)


def _layers_step(c, ids, pos, on, every, order, counts, fused, all_keys, all_values, stored, *sizes):
    """Every layer of one per-token step (see the module docstring). ``on`` (L, B, H): the running
    pairs; ``every`` (L, B, H_kv): True in ``query`` mode, where every pair stores the step's key and
    value and the k-norm spans them all, False in ``full`` mode, where the running pairs do (one
    graph serves both); ``fused``: each layer's W_qkv; ``sizes``: each layer's pairs, then each
    layer's keys read. Under grouped attention the cache is per (row, key/value head) and a running
    (row, head) pair reads its group's."""
    model, n_layers, family = c.model, c.n_layers, c.family
    bsz, n_heads, d_head, group = ids.shape[0], c.n_heads, c.d_head, c.group
    core = model.model
    x = core.embed_tokens(ids)  # (B, 1, d)
    cos, sin = core.rotary_emb(x, pos[None])  # (1, 1, D)
    cos, sin = cos[:, :, None], sin[:, :, None]  # (1, 1, 1, D) against (B, 1, H, D)
    rows = bsz * n_heads
    kv_rows = rows // group
    flat = torch.arange(kv_rows, device=ids.device)
    realized = []
    for idx, layer in enumerate(core.layers[:n_layers]):
        n_pairs, n_keys = sizes[idx], sizes[n_layers + idx]
        on_kv = on[idx] if group == 1 else on[idx].unflatten(-1, (-1, group)).any(-1)  # (B, H_kv): where a head runs
        stores = on_kv | every[idx]  # (B, H_kv)
        q, k, v = _split(F.linear(family.attention_input(layer, x), fused[idx]), c.shape)  # (B, 1, H | H_kv, D)
        attn = layer.self_attn
        if family.qk_norm:
            gf, sf = on[idx].to(torch.float32), stores.to(torch.float32)
            q_w, k_w, eps = family.qk_norm_weights(layer)
            q_ms = (q.float().square().sum(-1)[:, 0] * gf).sum(-1) / (gf.sum(-1).clamp_min(1e-12) * d_head)  # (B,)
            k_ms = (k.float().square().sum(-1)[:, 0] * sf).sum(-1) / (sf.sum(-1).clamp_min(1e-12) * d_head)
            q = _rope(q_w * (q.float() * torch.rsqrt(q_ms + eps)[:, None, None, None]).to(q.dtype), cos, sin)
            k = _rope(k_w * (k.float() * torch.rsqrt(k_ms + eps)[:, None, None, None]).to(k.dtype), cos, sin)
        else:
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        keys, values = all_keys[idx], all_values[idx]  # (B·H_kv, capacity, D)
        # every pair writes at its next slot; only those that store advance (module docstring)
        at = stored[idx].view(kv_rows)
        keys.index_put_((flat, at), k.reshape(kv_rows, d_head))
        values.index_put_((flat, at), v.reshape(kv_rows, d_head))
        stored[idx] += stores.long()
        length = stored[idx].view(kv_rows)
        sel = order[idx, :n_pairs]  # the running pairs first; past counts[idx], padding
        kv_sel = sel if group == 1 else (sel // n_heads) * (n_heads // group) + (sel % n_heads) // group
        real = torch.arange(n_pairs, device=ids.device) < counts[idx]
        seen = torch.arange(n_keys, device=ids.device) < torch.where(real, length[kv_sel], 1)[:, None]  # (P, n)
        queries = q.reshape(rows, d_head)[sel].float()  # (P, D): returned below, so computed once
        realized.append(queries)
        scores = (queries[:, None, :] * keys[kv_sel, :n_keys].float()).sum(-1)
        weights = torch.softmax(scores.mul(c.scale).masked_fill(~seen, float("-inf")), dim=-1)  # (P, n)
        z = (weights[..., None] * values[kv_sel, :n_keys].float()).sum(1).to(x.dtype)  # (P, D)
        target = torch.where(real, sel, rows)
        out = x.new_zeros(rows + 1, d_head).index_put_((target,), z)[:rows].view(bsz, 1, n_heads * d_head)
        x = x + family.attention_output(layer, F.linear(out, attn.o_proj.weight))
        x = x + family.mlp(layer, x)
    hidden = core.norm(x)
    # the queries are graph outputs so that inductor computes them once: left to fusion, their
    # QK-norm and RoPE are recomputed inside the score loop for every key
    return (model.lm_head(hidden), hidden, *realized)


def shared_weights(model, gates: torch.Tensor, skip: str) -> list[tuple | None]:
    """Per layer, what a shared topology's step reads (None: no head runs there): W_qkv with the rows
    of the running heads' queries, the keys the step stores (the running heads' key/value heads
    first, then in ``query`` mode every other one, which the k-norm spans) and the running heads'
    values; the running heads (h,) and their key/value heads (h_kv,); the q- and k-norm weights of
    those (None for a family without QK-norm); the output projection's columns of the running
    heads; and under grouped attention each running head's index among its layer's h_kv (else None)."""
    family = check_model(model)
    shape = family.shape
    n_layers, n_heads, group, d_head = shape.n_layers, shape.n_heads, shape.group, shape.head_dim
    on = (gates[1:] > 0).view(n_layers, n_heads)
    out = []
    for idx, layer in enumerate(model.model.layers[:n_layers]):
        run = on[idx].nonzero()[:, 0]
        if not len(run):
            out.append(None)
            continue
        attn = layer.self_attn
        groups = run if group == 1 else torch.unique(run // group)
        rest = torch.ones(shape.n_kv_heads, dtype=torch.bool, device=run.device)
        rest[groups] = False
        keys = torch.cat([groups, rest.nonzero()[:, 0]]) if skip == "query" else groups  # running ones first

        def rows(w, heads):
            return w.view(-1, d_head, w.shape[-1])[heads].flatten(0, 1)
        w_qkv = torch.cat([rows(attn.q_proj.weight, run), rows(attn.k_proj.weight, keys),
                           rows(attn.v_proj.weight, groups)])
        norms = None
        if family.qk_norm:
            q_w, k_w, _ = family.qk_norm_weights(layer)
            norms = (q_w[run], k_w[groups])
        w_o = attn.o_proj.weight.view(-1, n_heads, d_head)[:, run].flatten(1)
        index = None if group == 1 else torch.searchsorted(groups, run // group)
        out.append((w_qkv, run, groups, norms, w_o, index))
    return out


def _fresh(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` with the strides of a new tensor and no offset: what a compiled graph guards on
    stays the same from step to step (a size-1 dimension's stride, a view's offset, would not)."""
    return torch.empty(x.shape, dtype=x.dtype, device=x.device).copy_(x)


def _shared_step(c, ids, pos, weights, all_keys, all_values, n_keys):
    """Every layer of one step under a shared topology: the running heads' projections, QK-norm
    where the family has it (the k-norm over every head's keys in ``query`` mode), their cache write
    and ``scaled_dot_product_attention`` over their ``n_keys`` keys; the output projection of their
    columns (:func:`shared_weights`)."""
    core, family = c.model.model, c.family
    bsz, d_head = ids.shape[0], c.d_head
    x = core.embed_tokens(ids)  # (B, 1, d)
    cos, sin = core.rotary_emb(x, pos[None])
    cos, sin = cos[:, :, None], sin[:, :, None]  # (1, 1, 1, D)
    for idx, layer in enumerate(core.layers[: c.n_layers]):
        if weights[idx] is not None:
            w_qkv, run, groups, norms, w_o, index = weights[idx]
            h, h_kv = run.shape[0], groups.shape[0]
            qkv = F.linear(family.attention_input(layer, x), w_qkv).view(bsz, 1, -1, d_head)  # (B, 1, h + h_k + h_kv, D)
            # the running heads' keys are the first h_kv of the h_k stored; every slice here is valid
            # for any h_k ≥ h_kv, so one graph serves both skip modes (h_k = h_kv in ``full``)
            q, k, v, normed = qkv[:, :, :h], qkv[:, :, h : h + h_kv], qkv[:, :, -h_kv:], qkv[:, :, h:-h_kv]
            if norms is not None:
                q_w, k_w = norms
                q_ms = q.float().square().mean((-1, -2), keepdim=True)
                k_ms = normed.float().square().mean((-1, -2), keepdim=True)
                q = _rope(q_w * (q.float() * torch.rsqrt(q_ms + c.eps)).to(q.dtype), cos, sin)
                k = _rope(k_w * (k.float() * torch.rsqrt(k_ms + c.eps)).to(k.dtype), cos, sin)
            else:
                q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            keys, values = all_keys[idx], all_values[idx]  # (B, h_kv, capacity, D)
            keys.index_copy_(2, pos, k.transpose(1, 2))
            values.index_copy_(2, pos, v.transpose(1, 2))
            keys, values = keys[:, :, :n_keys], values[:, :, :n_keys]
            if index is not None:  # each running head reads its group's keys and values
                keys, values = keys[:, index], values[:, index]
            z = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, scale=c.scale)  # (B, h, 1, D)
            x = x + family.attention_output(layer, F.linear(z.transpose(1, 2).reshape(bsz, 1, -1), w_o))
        x = x + family.mlp(layer, x)
    hidden = core.norm(x)
    return c.model.lm_head(hidden), hidden


def _pairs(on: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per layer, the running (row, head) pairs first in (row, head) order, then the rest; and their
    count. on (L, B·H) bool → order (L, B·H) long, counts (L,) long."""
    return torch.sort((~on).to(torch.uint8), dim=-1, stable=True).indices, on.sum(-1)


def _bookkeeping(g: torch.Tensor, stored: torch.Tensor, n_layers: int, group: int = 1):
    """A per-token step's pairs: g (B, L·H) bool → on (L, B, H), order (L, B·H), counts (L,) and each
    layer's longest key run among its running pairs after the step (L,; ``stored`` (L, B, H_kv): the
    keys each (row, key/value head) holds, every position in ``query`` mode; ``group`` query heads
    read each)."""
    bsz = g.shape[0]
    on = _fresh(g.view(bsz, n_layers, -1).transpose(0, 1))  # (L, B, H)
    order, counts = _pairs(on.view(n_layers, -1))
    per_head = stored if group == 1 else stored.repeat_interleave(group, -1)
    return on, order, counts, ((per_head + 1) * on).amax((1, 2))


class _ModelGraphs:
    """The compiled graphs of one model, shared by every :class:`DecodeStep` of it in either skip mode
    (the mode is in their inputs): the per-token layers' step, the shared-topology step (the mode is
    in its weights) and every router's step; and the count and time of their compilations."""

    def __init__(self, model):
        self.model, self.compilations, self.compile_s = model, 0, 0.0
        self.family = check_model(model)
        self.shape = self.family.shape
        self.n_layers, self.n_heads, self.group = self.shape.n_layers, self.shape.n_heads, self.shape.group
        first = model.model.layers[0]
        self.d_head, self.scale = self.shape.head_dim, first.self_attn.scaling
        self.eps = self.family.qk_norm_weights(first)[2] if self.family.qk_norm else None
        self.mode = MODES.get(next(model.parameters()).device.type, "default")
        self.layers = torch.compile(functools.partial(_layers_step, self), backend=_counting(self, self.mode),
                                    dynamic=True)
        self.shared = torch.compile(functools.partial(_shared_step, self), backend=_counting(self, self.mode),
                                    dynamic=True)
        self.routes: dict[int, tuple] = {}

    def route(self, router):
        """``router``'s step compiled (once per router): its gates for the step (B, 1, N) from the token
        and the previous hidden state, and the step's bookkeeping (:func:`_bookkeeping`)."""
        if id(router) not in self.routes:
            predictor, embed, n_layers, group = router.predictor, self.model.model.embed_tokens, self.n_layers, self.group
            n_heads = self.n_heads

            def route(ids, previous, stored):
                emb = embed(ids).float()
                context = emb if predictor.cfg.input == "embedding" else torch.cat([emb, previous], dim=-1)
                geo = router.geo(ids) if predictor.geo_dim else None
                g = widen(predictor.route(context, geo, hard=True)[1], n_layers, n_heads, group)  # over query heads
                return (g, *_bookkeeping(g[:, 0, 1:] > 0, stored, n_layers, group))

            # the router is kept beside its graph: an id is unique only while its object lives
            self.routes[id(router)] = (router, torch.compile(route, backend=_counting(self, self.mode), dynamic=True))
        return self.routes[id(router)][1]


_GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _model_graphs(model) -> _ModelGraphs:
    """The compiled graphs of ``model``, made once per process (a compiled function is specialised to
    the objects it reads: a new one per step object would recompile)."""
    if model not in _GRAPHS:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        _GRAPHS[model] = _ModelGraphs(model)
    return _GRAPHS[model]


class _Stock:
    """The stock model's forward through ``torch.compile`` (Hugging Face's recommended decoding with
    ``StaticCache``), counting its compilations and their time."""

    def __init__(self, model):
        self.compilations, self.compile_s = 0, 0.0
        mode = MODES.get(next(model.parameters()).device.type, "default")
        self._forward = torch.compile(model.forward, backend=_counting(self, mode), fullgraph=True)

    def forward(self, *args, **kwargs):
        """The compiled forward (calls that compile add their wall time to ``compile_s``)."""
        return _timed_call(self, self._forward, *args, **kwargs)


def _counting(owner, mode: str):
    """Inductor under ``mode`` (``reduce-overhead``: CUDA-graph capture), counting each compilation (a
    frame's compile id, first or recompiled) in ``owner.compilations``."""
    from torch._inductor.compile_fx import compile_fx

    patches = {"triton.cudagraphs": True} if mode == "reduce-overhead" else {}

    seen = set()

    def backend(gm, example_inputs):
        from torch._guards import CompileContext

        compile_id = str(CompileContext.current_compile_id())  # a restarted analysis calls twice with one id
        if compile_id not in seen:
            seen.add(compile_id)
            owner.compilations += 1
        return compile_fx(gm, example_inputs, config_patches=patches)
    return backend


_SPECIALIZE_FLOATS = torch._dynamo.config.patch(specialize_float=True)
"""Python floats the graphs read (norm epsilons, scales, a router's keep) are constants: traced as
inputs, dynamo's analysis restarts once they turn out constant, and every graph compiles twice."""

_NO_DUCK_SHAPES = torch.fx.experimental._config.patch(use_duck_shape=False)
"""Sizes that happen to be equal when a graph is traced get symbols of their own: with duck shaping
(the default), a shared topology with as many running heads in two layers, or a key span as long as
the running heads' (``full`` mode), would be a guard, and a topology without that equality would
compile once more."""


def _timed_call(owner, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``; when the call compiled, its whole wall time (tracing, compiling and
    the run) is added to ``owner.compile_s``."""
    before, tic = owner.compilations, time.perf_counter()
    with _SPECIALIZE_FLOATS, _NO_DUCK_SHAPES:
        out = fn(*args, **kwargs)
    if owner.compilations > before:
        owner.compile_s += time.perf_counter() - tic
    return out


_STOCK: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compiled_stock(model) -> _Stock:
    """The stock forward of ``model`` compiled once per process (the baseline routed decoding is
    measured against)."""
    if model not in _STOCK:
        _STOCK[model] = _Stock(model)
    return _STOCK[model]
