"""The phase2 and control stages: joint continued pretraining with the predictor or denoiser, and
its dense control (same windows, same order); they share the ``phase2`` params section."""
