"""What the structure predictor reads at position t (``predictor.input``, docs/pipeline.md).

- ``cache``: the context cache's encoding of the window up to t (MiniLM, the base LM or an HF
  encoder: :mod:`lookahead.pipeline.contexts`);
- ``lm``: the LM's own states available before position t's forward under the lookahead contract
  — the token embedding at t and the final (normed) hidden state at t−1 of the dense forward,
  zeros at t = 0 — the input the per-token routers that work read (MoH, MoD, Router-Tuning);
- ``embedding``: the token embedding at t alone;
- ``layer``: the residual stream entering each layer at t (MoH, Deja Vu), one small router per
  layer reading its own layer's: decided inside the forward, layer by layer, not before it. Here,
  the dense forward's streams; as deployed, the routed forward's own
  (:func:`lookahead.graph.generate.layer_routed`, whose gates at a layer depend only on the layers
  before it).

Every kind is causal by construction (the hidden state at t−1 of a causal LM reads tokens ≤ t−1,
a layer's input at t tokens ≤ t); the evaluate stage's causality check runs each through the
predictor.
"""

from __future__ import annotations

import torch


def input_dim(kind: str, cache_dim: int, hidden: int, n_layers: int = 1) -> int:
    """Width of the router's context features for an input kind (``layer``: every layer's input)."""
    return {"cache": cache_dim, "lm": 2 * hidden, "embedding": hidden, "layer": n_layers * hidden}[kind]


@torch.no_grad()
def lm_states(lm, ids: torch.Tensor, kind: str) -> torch.Tensor:
    """(B, T, F) features of ``kind`` ``lm``, ``embedding`` or ``layer`` from an HF causal LM (no
    gradient)."""
    core = lm.model
    if kind == "layer":  # hidden_states[l] enters layer l (the last entry, after the final norm, does not)
        states = core(input_ids=ids, output_hidden_states=True).hidden_states[: lm.config.num_hidden_layers]
        return torch.cat(states, dim=-1).float()
    emb = core.embed_tokens(ids).float()
    if kind == "embedding":
        return emb
    last = core(input_ids=ids).last_hidden_state.float()  # after the final norm
    return lm_input(emb, states_before(last))


def states_before(hidden: torch.Tensor) -> torch.Tensor:
    """Hidden states (B, T, d) moved one position on: at t the state of t − 1 (zeros at t = 0), what
    the ``lm`` input may read at t."""
    return torch.cat([torch.zeros_like(hidden[:, :1]), hidden[:, :-1]], dim=1)


def lm_input(emb: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    """The ``lm`` input (B, T, 2d): the token's embedding beside the final hidden state of the position
    before it (``before``, already moved: :func:`states_before`, or the last state of a decode step)."""
    return torch.cat([emb, before.float()], dim=-1)


def router_context(kind: str, lm, ids: torch.Tensor, cached: torch.Tensor | None) -> torch.Tensor:
    """The router's context features for windows ``ids`` (B, T): the cached ones for ``cache``,
    else computed from ``lm``."""
    if kind == "cache":
        if cached is None:
            raise ValueError("predictor.input: cache needs the context cache's features")
        return cached
    return lm_states(lm, ids, kind)


def check_context_dim(predictor, meta: dict, cache_dim: int, lm, error: type[Exception], source) -> None:
    """Refuse a predictor whose context width does not fit this cache and LM."""
    expected = input_dim(predictor.cfg.input, cache_dim, lm.config.hidden_size, lm.config.num_hidden_layers)
    if meta["context_dim"] != expected:
        raise error(f"predictor {source} takes {meta['context_dim']}-dim contexts but its input "
                    f"({predictor.cfg.input}) gives {expected}-dim ones here: rerun `dvc repro phase1`")
