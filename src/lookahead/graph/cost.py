"""What a routed forward and its router cost per token, in multiply-accumulates (MACs): the FLOP
side of "NLL as deployed" (phase 1's ``deployed_macs_over_dense``, ``benchmarks/runtime.py``'s ideal).

Counted: the weight matrices a token goes through and attention's QK and AV; not counted: the
embedding lookup, norms, softmax and the top-K (each O(d) or O(L·H) per token). The LM head costs
d·V whether or not it is tied to the embedding (a tied head is still a matmul). The attention is
``n_heads · head_dim`` wide (:func:`lookahead.lm.families.base.head_dim_of`: narrower than the residual
stream in the smaller dense models of docs/research/frontier.md). Non-embedding MACs leave out the
LM head's d·V (:func:`lm_head_macs`), the share that does not shrink with the attention.
"""

from __future__ import annotations

import torch

from lookahead.lm.families.base import head_dim_of


MODES = ("full", "query", "static")
"""How heads are off: per token in a skip mode (``full``, ``query``: lookahead.graph.runtime), or for every token (``static``)."""


def macs_per_token(cfg, context: float, on: float, mode: str) -> float:
    """MACs of one token's forward with a share ``on`` of heads running, attending ``context`` keys
    (prefill: (T + 1) / 2 on average; generation: T). A head off *for this token* (routing):
    ``full``, it has no query, key, value or output there, and a running head's keys are the
    positions it runs at (a share ``on`` of them); ``query``, every key and value exists. A head off
    *for every token* (``static``: pruning): it has no query, key, value or output anywhere, and a
    kept head runs at every position, so it attends every key. Under grouped-query attention keys
    and values are the key/value heads' (:func:`kv_width`) and ``on`` is also the share of key/value
    groups that run (routing whole groups). ``cfg``: a transformers config of a supported family."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    d, a = cfg.hidden_size, attention_width(cfg)
    keys = context * (on if mode == "full" else 1.0)
    kv = 2 * d * kv_width(cfg) * (1.0 if mode == "query" else on)
    attention = on * (2 * d * a + 2 * keys * a)  # q and o projections, QK and AV of the running heads
    return cfg.num_hidden_layers * (kv + attention + 3 * d * cfg.intermediate_size) + lm_head_macs(cfg)


def attention_width(cfg) -> int:
    """Width of a layer's queries (and keys, values): n_heads · head_dim."""
    return cfg.num_attention_heads * head_dim_of(cfg)


def kv_width(cfg) -> int:
    """Width of a layer's keys (and values): n_kv_heads · head_dim (the attention's width without
    grouping)."""
    return (getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads) * head_dim_of(cfg)


def lm_head_macs(cfg) -> int:
    """MACs of the LM head per token (d · V): in every total here, left out of the non-embedding ones."""
    return cfg.hidden_size * cfg.vocab_size


def gate_macs(cfg, on: torch.Tensor, mode: str) -> torch.Tensor:
    """Per-position MACs (B, T) of a forward that runs the gates ``on`` (B, T, L, H; 1: the head
    runs at that position), prefill, counted from the gates as they run rather than from their
    share: under ``full`` (and ``static``: a pruned head is off at every position) a running head at
    t attends the positions s <= t at which it ran (no other keys exist); under ``query`` every head
    has a key and value at every position and a running head attends all t + 1. Under grouped-query
    attention a key/value head is computed where any head of its group runs, and a running head
    attends its group's keys. The closed form :func:`macs_per_token` is this at gates of one share
    spread evenly. Gates over key/value groups (B, T, L, H_kv; ``runtime.unit: group``) count each
    group's query heads."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    on = on.double()
    d, head = cfg.hidden_size, head_dim_of(cfg)
    n_kv = kv_width(cfg) // head
    if on.shape[-1] == n_kv != cfg.num_attention_heads:  # a group's gate is each of its heads'
        on = on.repeat_interleave(cfg.num_attention_heads // n_kv, -1)
    b, t, n_layers, n_heads = on.shape
    group = n_heads // n_kv
    if mode == "query":
        keys = torch.arange(1, t + 1, dtype=on.dtype)[None, :, None, None]  # (1, T, 1, 1)
        kv = 2 * d * head * n_kv * n_layers
    else:
        on_kv = on if group == 1 else on.unflatten(-1, (n_kv, group)).amax(-1)  # (B, T, L, H_kv)
        keys = on_kv.cumsum(1)  # (B, T, L, H_kv): positions <= t at which the group ran
        keys = keys if group == 1 else keys.repeat_interleave(group, -1)
        kv = (2 * d * head * on_kv).sum((-2, -1))  # (B, T)
    attention = (on * (2 * d * head + 2 * keys * head)).sum((-2, -1))  # (B, T): q, o, QK and AV
    return kv + attention + n_layers * 3 * d * cfg.intermediate_size + lm_head_macs(cfg)


def router_macs(predictor) -> int:
    """MACs of a head-gate router per token: its MLP's weight matrices (one per layer for
    ``predictor.input: layer``), the geometric features included."""
    if predictor.cfg.input == "layer":
        return predictor.layer_in.numel() + predictor.layer_out.numel()
    return predictor.mlp[0].weight.numel() + predictor.to_gate.weight.numel()


def deployed_macs(cfg, predictor, context: float, on: float, mode: str, dense_states: bool) -> dict[str, float]:
    """Per-token MACs of routing as deployed, each over a dense forward's: the routed forward, the
    router and its inputs. ``dense_states``: the router reads a dense pass's states (``lm`` and
    ``layer`` before their own routed states: a whole dense forward first); ``None`` for inputs
    from an encoder this module does not count (``cache``)."""
    dense = macs_per_token(cfg, context, 1.0, mode)
    routed = macs_per_token(cfg, context, on, mode)
    router = router_macs(predictor)
    inputs = dense if dense_states and predictor.cfg.input in ("lm", "layer") else 0.0
    total = None if predictor.cfg.input == "cache" else (routed + router + inputs) / dense
    return {"routed_forward_over_dense": routed / dense, "router_over_dense": router / dense,
            "inputs_over_dense": None if predictor.cfg.input == "cache" else inputs / dense, "total_over_dense": total}


def window_at_macs_ratio(cfg, on: float, mode: str, router: float, target: float = 0.8) -> float | None:
    """The prefill window length T at which a routed forward with a share ``on`` of heads running,
    plus a router of ``router`` MACs per token (its inputs not counted), costs ``target`` × a dense
    forward's MACs per token (prefill: (T + 1) / 2 keys on average, :func:`macs_per_token`). Both
    costs are linear in the keys, so T is closed form; None where no length reaches it (the routed
    forward's attention saves too little per key)."""
    dense0, dense1 = macs_per_token(cfg, 0.0, 1.0, mode), macs_per_token(cfg, 1.0, 1.0, mode)
    routed0, routed1 = macs_per_token(cfg, 0.0, on, mode), macs_per_token(cfg, 1.0, on, mode)
    per_key = target * (dense1 - dense0) - (routed1 - routed0)  # MACs saved per key, beyond the target's
    if per_key <= 0:
        return None
    keys = max(0.0, (routed0 + router - target * dense0) / per_key)
    return 2 * keys - 1 if keys >= 1 else 1.0
