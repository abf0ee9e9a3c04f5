"""The language-model side (docs/development.md#layout): where a model comes from (scratch, hub or directory),
the OLMo2 architecture of the embedded default, the NLL every stage scores with, and the context
encoders (MiniLM, the base LM, an HF embedder). Imports ``core`` only."""
