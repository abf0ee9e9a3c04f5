"""The diffusion stage: the topology denoiser trained on the pairs, its evaluation and plots."""
