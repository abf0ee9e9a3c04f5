"""The evaluate stage: every LM and topology against dense baselines, the causality check, the
table and the explainer."""
