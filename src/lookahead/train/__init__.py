"""The one training loop (docs/scaling.md; STYLE 5) and what it needs: resumable checkpoints keyed by
config and inputs, token streams and their batches, training-curve figures. Imports ``core`` only."""
