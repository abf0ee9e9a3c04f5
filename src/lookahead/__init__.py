"""Lookahead: per-token attention-head DAGs for causal LMs, as a reproducible DVC pipeline."""

__version__ = "0.1.0"
