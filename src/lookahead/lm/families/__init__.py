"""Model families: what a decoder-only transformer family does around its attention heads, in one
module each (:mod:`.olmo2`, :mod:`.llama`), as Hugging Face keeps ``modeling_llama.py`` and
``modular_olmo2.py`` apart.

A family answers "what does this model do": where its norms sit, whether queries and keys are
normalised (and over what), which key/value head each query head reads (``h // group`` under
grouped-query attention), RoPE, the MLP, the final norm. The executors of the head graph
(:mod:`lookahead.graph`) answer "which heads run and how fast" and ask the family for the rest; they
name no family. A model is validated once, where it enters (:func:`family_of`), and every feature a
family does not implement is refused there, naming the config key.

Adding a family: one module here with a :class:`Family` subclass registered in :data:`FAMILIES`,
and one row in each parity test (docs/development.md).
"""

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
