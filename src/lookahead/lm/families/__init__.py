"""Model families: what a decoder-only transformer family does around its attention heads, in one
module each (:mod:`.olmo2`, :mod:`.llama`), as Hugging Face keeps ``modeling_llama.py`` and
``modular_olmo2.py`` apart.

A family answers "what does this model do": where its norms sit, whether queries and keys are
normalised (and over what), which key/value head each query head reads (``h // group`` under
grouped-query attention), RoPE, the MLP, the final norm. The executors of the head graph
(:mod:`lookahead.graph`) answer "which heads run and how fast" and ask the family for the rest; they
name no family. A model is validated once, where it enters
(:func:`lookahead.lm.families.registry.family_of`), and every feature a family does not implement
is refused there, naming the config key.

Adding a family: one module here with a :class:`~lookahead.lm.families.base.Family` subclass
registered in :data:`lookahead.lm.families.registry.FAMILIES`, and one row in each parity test
(docs/development.md).
"""
