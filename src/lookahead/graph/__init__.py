"""The head graph (docs/design.md): nodes and the allowed-edge mask, the runtime that executes an LM
under a topology, the structure predictor and its cascade gate, topology sampling, the diffusion
denoiser, and the pruning baselines every topology is scored against. Imports ``core`` and ``lm``."""
