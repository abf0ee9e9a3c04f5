"""Lookahead: per-token attention-head DAGs for causal LMs, as a reproducible DVC pipeline.

The package is grouped by what each part is, and imports run one way (tests/test_layout.py):

    core       errors, typed config, the stage CLI, atomic writes, input checks, reports, MLflow, devices, seeds
    train      the one training loop, checkpoints, token streams, training-curve figures   (core)
    lm         the LM side: HF model source, OLMo2 config, NLL, context encoders          (core)
    graph      the head graph: nodes and mask, runtime, predictor, sampling, denoiser, baselines  (core, lm)
    semantics  WordNet source and similarity, geometry, head probes, relational alignment  (core, lm)
    artifacts  readers of one stage's outputs that later stages use                       (the libraries)
    pipeline   one module or package per DVC stage, never importing another stage         (all of the above)
    tools      command-line helpers no stage runs: params and launch check, share, verify, offline page, faults
"""
