"""What every family shares: the model's shape and the interface the executors ask."""

from __future__ import annotations

import dataclasses

import torch

from lookahead.core.errors import LookaheadError


class FamilyError(LookaheadError, ValueError):
    """A model whose family, or a feature of it, the head graph cannot run."""


UNITS = ("head", "group")
"""What a node of the head graph is (``runtime.unit``): a query head, or a whole key/value group
(its query heads, keys and values on or off together)."""


def read_unit(params_path) -> str:
    """``runtime.unit`` of a params file (``head`` where unset), validated as
    :class:`lookahead.graph.runtime.RuntimeConfig` does, for stages that run no head graph."""
    from lookahead.core.config import read_params
    from lookahead.core.errors import ConfigError

    value = (read_params(params_path).get("runtime") or {}).get("unit", "head")
    if value not in UNITS:
        raise ConfigError("runtime.unit", f"must be one of {', '.join(UNITS)}; got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Shape:
    """The attention's shape: n_heads query heads in n_kv_heads key/value groups of ``group``."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, cfg) -> Shape:
        """The shape an HF config gives (no key/value head count: one per query head)."""
        heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        if heads % kv:
            raise FamilyError(f"num_key_value_heads: must divide num_attention_heads ({heads}); got {kv}")
        return cls(cfg.num_hidden_layers, heads, kv, head_dim_of(cfg))

    @property
    def group(self) -> int:
        """Query heads per key/value head; query head h reads key/value head h // group."""
        return self.n_heads // self.n_kv_heads

    def units(self, unit: str) -> int:
        """Nodes of the head graph per layer under a routing unit (``runtime.unit``): its query heads
        (``head``) or its key/value groups (``group``)."""
        if unit not in UNITS:
            raise FamilyError(f"runtime.unit must be one of {', '.join(UNITS)}; got {unit!r}")
        return self.n_heads if unit == "head" else self.n_kv_heads


def head_dim_of(config) -> int:
    """Per-head query/key/value width of an HF config: its ``head_dim`` where it names one (as
    transformers' attention modules read it), else hidden_size / num_attention_heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def refuse(cfg, key: str, allowed, why: str) -> None:
    """Raise :class:`FamilyError` naming ``key`` when the config's value is not in ``allowed``."""
    value = getattr(cfg, key, None)
    if value not in allowed:
        raise FamilyError(f"{key}: {why}; got {value!r}")


class Family:
    """One family's rules around the attention heads. Subclasses set the class flags and override
    the methods where the family differs; every method takes a decoder layer of the model.

    ``qk_norm``: queries and keys are RMS-normalised over the concatenation of the heads' slices
    (OLMo2), so the executors take that mean square over the heads that run. ``post_norm``: each
    sublayer's output is normalised before it joins the stream (OLMo2), so a head's contribution is
    divided by the RMS of its layer's gated attention sum; without it (Llama) the contributions
    simply add up."""

    name = ""
    qk_norm = False
    post_norm = False

    def __init__(self, cfg):
        refuse(cfg, "attention_bias", (False, None), "a bias of the projections belongs to no head")
        self.config = cfg
        self.shape = Shape.of(cfg)

    def attention_input(self, layer, x: torch.Tensor) -> torch.Tensor:
        """What the attention's projections read from a stream x (…, d)."""
        return x

    def attention_output(self, layer, s: torch.Tensor) -> torch.Tensor:
        """What the attention adds to the stream, from the output projection's sum s (…, d)."""
        return s

    def contributions(self, layer, s: torch.Tensor, o: torch.Tensor | None, dtype: torch.dtype
                      ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Per-head contributions and their total from the gated attention sum s (…, d) float32 and
        the heads' gated outputs o (h, …, d) (None: not wanted): (o's contributions or None, the
        total), both in ``dtype``. The total is :meth:`attention_output` of s."""
        return (None if o is None else o.to(dtype)), s.to(dtype)

    def mlp(self, layer, stream: torch.Tensor) -> torch.Tensor:
        """The MLP's contribution to the stream (…, d)."""
        raise NotImplementedError

    def qk_norm_weights(self, layer) -> tuple[torch.Tensor, torch.Tensor, float]:
        """(q-norm weight (H, D), k-norm weight (H_kv, D), eps) of a family with ``qk_norm``."""
        raise NotImplementedError(f"the {self.name} family has no QK-norm")
