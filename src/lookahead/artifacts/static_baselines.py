"""Read side of the static_baselines stage (:mod:`lookahead.pipeline.static_baselines`): the two
static head masks every static baseline is taken from, and which is the stronger at each head count.

Both are rankings of the heads (L, H), more important higher, so that static pruning keeping ``k``
heads is the ranking's top ``k`` (:func:`lookahead.graph.nodes.static_gates`):

- ``importance``: E|dL/dmask_h| on the fit windows (Michel et al. 2019, as the probe measures it on
  train windows);
- ``greedy``: a greedy static mask on the fit windows, as a ranking: a head's rank is the step at
  which the search dropped it (the last kept heads rank highest), so the top ``k`` is the mask the
  search held at ``k`` heads — one nested pass gives every count's mask.

At each head count the **stronger** is the one of lower NLL on the selection windows (never decided
on test); the static baselines at that count — phase 1's static pruning, the static control's mask,
evaluate's static rows — take its mask (:meth:`StaticBaselines.ranking`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from lookahead.core.errors import LookaheadError

TENSORS_FILE = "baselines.safetensors"
META_FILE = "meta.json"
METHODS = ("importance", "greedy")
"""The static masks fitted, in the order :attr:`StaticBaselines.stronger` indexes them."""


class StaticBaselinesError(LookaheadError, ValueError):
    """A static baselines directory that is missing, incomplete or does not fit the model."""


class StaticBaselines:
    """The static_baselines stage's directory: both rankings (L, H), their selection NLL at every
    head count and the stronger one's at each, and the val spans the stage read (``spans``)."""

    def __init__(self, directory: str | Path):
        from safetensors.torch import load_file

        self.dir = Path(directory)
        tensors, meta = self.dir / TENSORS_FILE, self.dir / META_FILE
        if not tensors.is_file() or not meta.is_file():
            raise StaticBaselinesError(f"static baselines {self.dir} not found or incomplete: run `dvc repro static_baselines`")
        t = load_file(str(tensors))
        self.rankings = {m: t[m].float() for m in METHODS}
        self.selection_nll = {m: t[f"selection_nll_{m}"].double() for m in METHODS}  # (L·H + 1,) by head count
        self.stronger = t["stronger"].long()  # (L·H + 1,): index into METHODS at each head count
        self.meta = json.loads(meta.read_text(encoding="utf-8"))
        self.spans = {name: [tuple(s) for s in spans] for name, spans in self.meta["spans"].items()}

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.rankings["importance"].shape)

    def check(self, n_layers: int, n_heads: int, what: str) -> None:
        """Refuse a model of another shape (``what`` names it)."""
        if self.shape != (n_layers, n_heads):
            raise StaticBaselinesError(f"static baselines {self.dir} rank {self.shape[0]} x {self.shape[1]} heads, {what} has "
                                       f"{n_layers} x {n_heads}: rerun `dvc repro static_baselines`")

    def method(self, keep: int) -> str:
        """The stronger mask's name at ``keep`` heads."""
        return METHODS[int(self.stronger[keep])]

    def ranking(self, keep: int) -> torch.Tensor:
        """(L, H): the ranking whose top ``keep`` heads are the stronger mask at ``keep`` heads."""
        return self.rankings[self.method(keep)]

    def keep_at(self, fraction: float) -> int:
        """The head count static pruning keeps at ``fraction`` of the heads: ``round(fraction · L·H)``."""
        return round(fraction * int(np.prod(self.shape)))

    def at_fraction(self, fraction: float) -> torch.Tensor:
        """(L, H): :meth:`ranking` at :meth:`keep_at` ``fraction``."""
        return self.ranking(self.keep_at(fraction))
