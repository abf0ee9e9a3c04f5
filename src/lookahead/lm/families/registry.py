"""Which family a model belongs to: ``config.model_type`` → its :class:`~lookahead.lm.families.base.Family`."""

from __future__ import annotations

import weakref

from lookahead.lm.families.base import Family, FamilyError, Shape
from lookahead.lm.families.llama import Llama
from lookahead.lm.families.olmo2 import Olmo2

FAMILIES: dict[str, type[Family]] = {"olmo2": Olmo2, "llama": Llama}
"""``config.model_type`` → its family."""

_SEEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

__all__ = ["FAMILIES", "Family", "FamilyError", "Shape", "family_of"]


def family_of(model) -> Family:
    """The family of a transformers causal LM, validated on first sight and remembered for the
    model object (a config changed in place afterwards is not seen again). Raises
    :class:`FamilyError` naming the config key of anything the executors cannot run."""
    hit = _SEEN.get(model)
    if hit is not None:
        return hit
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in FAMILIES or not hasattr(model, "lm_head") or not hasattr(model, "model"):
        raise FamilyError(f"model_type: the head graph runs causal LMs of the families {', '.join(FAMILIES)} "
                          f"(lookahead.lm.families); got {kind!r} ({type(model).__name__})")
    family = FAMILIES[kind](cfg)
    _SEEN[model] = family
    return family
