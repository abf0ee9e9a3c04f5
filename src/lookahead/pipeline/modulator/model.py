"""The geometric residual modulator (docs/pipeline.md; the seed notebook's LERP injection).

At each chosen block of a frozen OLMo2 LM, the residual stream entering the block is pulled toward
a per-token geometric target:

    h ← (1 − α_l · m(x)) · h + α_l · m(x) · target(x)

with ``geo`` the init stage's WordNet eigen-embedding of token x (``geo_table``, unit rows), ``P``
its Procrustes projection into the base model's residual space (``projection`` = R · PCA
components, orthonormal rows) and m(x) = 1 for a token with a WordNet match, 0 otherwise (no
nudge). ``target: plain`` is the seed's formula, target(x) = geo(x) P (unit norm);
``target: pca`` is the point of the residual space that the Procrustes fit maps geo(x) to,
μ + s · geo(x) P, with μ the PCA mean of the anchors' gloss encodings and s the mean norm of their
PCA coordinates (the fit aligned unit rows, so s restores the scale). α_l is stored as a logit (``alpha_init``, 0.01
in the seed) and is learned or fixed, per layer or shared; the table and the projection are
trainable or frozen by params. The update is ``torch.lerp``, so α = 0 leaves the stream bit for bit.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

from lookahead.core.config import from_dict
from lookahead.pipeline.modulator.config import ModulatorConfig
from lookahead.pipeline.modulator.hooks import modulated_blocks


def _logit(p: float) -> float:
    if p <= 0.0:
        return -math.inf  # sigmoid(-inf) = 0 exactly: a fixed α = 0 modulates nothing
    if p >= 1.0:
        return math.inf
    return math.log(p / (1.0 - p))


class GeometricModulator(nn.Module):
    """α-weighted LERP of the residual stream entering each modulated block toward the token's
    geometric target. Call it as ``modulator(lm, input_ids, **lm_kwargs)`` (the LM's output)."""

    def __init__(self, table: torch.Tensor, mask: torch.Tensor, projection: torch.Tensor, pca_mean: torch.Tensor,
                 geo_scale: float, layers: list[int], cfg: ModulatorConfig):
        super().__init__()
        self.layers = list(layers)
        self.table = nn.Parameter(table.float().clone(), requires_grad=cfg.train_table)
        self.projection = nn.Parameter(projection.float().clone(), requires_grad=cfg.train_projection)
        self.register_buffer("mask", mask.float().clone())
        plain = cfg.target == "plain"
        self.register_buffer("pca_mean", torch.zeros_like(pca_mean).float() if plain else pca_mean.float().clone())
        self.register_buffer("geo_scale", torch.tensor(1.0 if plain else float(geo_scale)))
        n_alpha = 1 if cfg.alpha_shared else len(self.layers)
        self.alpha_logit = nn.Parameter(torch.full((n_alpha,), _logit(cfg.alpha_init)),
                                        requires_grad=cfg.alpha_mode == "learned")

    def alphas(self) -> torch.Tensor:
        """α of each modulated layer, in the order of ``layers``. (n_layers_modulated,)"""
        return torch.sigmoid(self.alpha_logit).expand(len(self.layers))

    def monitor(self) -> dict[str, float]:
        """α of each modulated layer (``alpha_l<layer>``): the curves logged during training."""
        return {f"alpha_l{layer}": float(a) for layer, a in zip(self.layers, self.alphas().detach().cpu())}

    def target(self, ids: torch.Tensor) -> torch.Tensor:
        """μ + s · geo(x) P for every token (μ = 0, s = 1 for ``target: plain``). (B, T, hidden)"""
        return self.pca_mean + self.geo_scale * (self.table[ids] @ self.projection)

    def attached(self, lm, ids: torch.Tensor):
        """Within the block, ``lm``'s blocks in ``layers`` see the modulated stream for tokens ``ids``."""
        target = self.target(ids)
        weights = self.alphas()[:, None, None, None] * self.mask[ids][None, :, :, None]  # (n, B, T, 1)
        return modulated_blocks(lm, self.layers,
                                lambda h, k: torch.lerp(h, target.to(h.dtype), weights[k].to(h.dtype)))

    def forward(self, lm, input_ids: torch.Tensor, **kwargs):
        with self.attached(lm, input_ids):
            return lm(input_ids=input_ids, **kwargs)


class ModulatedLM(nn.Module):
    """A frozen LM with a modulator attached, usable wherever the LM is (``model(input_ids=...)``,
    ``get_input_embeddings``, ``config``): the probe's encoders measure it unchanged."""

    def __init__(self, lm, modulator: GeometricModulator):
        super().__init__()
        self.lm, self.modulator = lm, modulator

    @property
    def config(self):
        return self.lm.config

    def get_input_embeddings(self):
        return self.lm.get_input_embeddings()

    def forward(self, input_ids: torch.Tensor, **kwargs):
        return self.modulator(self.lm, input_ids, **kwargs)


def save_modulator(modulator: nn.Module, path: str | Path, config: dict) -> None:
    """One safetensors file with the resolved config in its metadata."""
    from safetensors.torch import save_file

    from lookahead.core.atomic import atomic_file

    tensors = {k: v.detach().cpu().contiguous() for k, v in modulator.state_dict().items()}
    with atomic_file(path) as tmp:
        # one metadata key: safetensors writes several in a random order (different bytes each run)
        save_file(tensors, str(tmp), metadata={"config": json.dumps({**config, "resolved_layers": modulator.layers},
                                                                    sort_keys=True)})


def load_modulator(path: str | Path) -> tuple[nn.Module, dict]:
    """(modulator, config) from :func:`save_modulator`'s file: a :class:`GeometricModulator`, or a
    :class:`~lookahead.pipeline.modulator.field.FieldModulator` for ``kind: field``."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    config = json.loads(meta["config"])
    cfg = from_dict(ModulatorConfig, config["modulator"])
    t = load_file(str(path))
    if cfg.kind == "field":
        from lookahead.pipeline.modulator.field import build_field

        modulator = build_field(cfg, int(config["base_hidden_size"]), config["resolved_layers"])
        modulator.load_state_dict(t)
        return modulator, config
    modulator = GeometricModulator(t["table"], t["mask"], t["projection"], t["pca_mean"], float(t["geo_scale"]),
                                   config["resolved_layers"], cfg)
    modulator.load_state_dict(t)
    return modulator, config
