"""Phase 1 (docs/pipeline.md): train the lookahead structure predictor with the LM and the
context encoder frozen, on the cached contexts.

Loss per batch: NLL(A) + lambda_head · mean gate + lambda_edge · mean active edge weight, τ annealed
geometrically from ``tau_start`` to ``tau_end``. The estimator lets a head that is off come back
(docs/design.md): training always *executes* the soft graph (every head's output is computed and weighted by
its gate); edges and gates are soft with logistic noise, or — from ``hard_from_step`` on — hard in
the forward pass with straight-through gradients evaluated at the soft values
(:func:`lookahead.graph.predictor.cascade`). Evaluation runs the deterministic hard graph with the work of
off heads skipped (``forward_with_topology(hard=True)``), next to two baselines at the same
active-head fraction: static pruning of the least important heads (probe importance, Michel et al.
2019) and random per-position heads, and the label-free oracle (:mod:`lookahead.graph.oracle`).

Head gates (``predictor.gate: head``) add the router's regularisers: z-loss, load balance, the
closed-form L0 penalty of hard-concrete gates, and a noise temperature annealed like τ. Whether the
router routes per token is measured, not assumed: ``dynamic_fraction`` and ``gate_entropy_bits``
of its hard gates, ``context_shuffle_dnll`` (its router inputs permuted across val positions) and
``static_twin_gap`` (the same router trained on zeroed inputs, ``phase1.static_twin``).

This stage trains (every seed's router and static twin, kept as files) and evaluates periodically on
the context cache's val windows: the curves, the Pareto picture and the training report
(``metrics/phase1_training.json``, labelled ``cache_val``). Every headline figure — dense, the router
on dense states and as deployed, static pruning, random heads, both oracles, recall, the routing
statistics, the context shuffle and the static twin — is the ``score_phase1`` stage's, on the
``scoring`` windows (:mod:`lookahead.pipeline.phase1.score`, :mod:`lookahead.pipeline.phase1.final`).
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.oracle_targets import TARGETS_FILE, OracleTargets
from lookahead.artifacts.probe_heads import head_importance
from lookahead.core.atomic import atomic_dir
from lookahead.core.config import to_dict
from lookahead.core.devices import resolve_device
from lookahead.core.errors import ConfigError, require
from lookahead.core.seeds import final_evaluation_only, over_seeds
from lookahead.core.tracking import is_main_process
from lookahead.graph.predictor import PredictorConfig, StructurePredictor, init_nodes, load_init, save_predictor
from lookahead.graph.predictor import seed_router_name, twin_router_name
from lookahead.graph.router_inputs import input_dim
from lookahead.graph.runtime import RuntimeConfig, unit_shape
from lookahead.graph.scoring import GeoLookup
from lookahead.pipeline.phase1.config import Phase1Config
from lookahead.pipeline.phase1.module import CACHE_KEYS, Phase1Module
from lookahead.train.checkpoints import checkpoint_dir
from lookahead.train.loop import TrainResult, train


VAL_STATE = ("_val", "_dense", "_loo", "_oracle", "_greedy", "static_curve", "_train_inputs")
"""What a :class:`Phase1Module`'s periodic evaluation computes once and no seed changes: the val
batches and the router's inputs there, the frozen LM's dense NLL, the leave-one-out oracle (its KL
and its NLL per head count), the greedy oracle's gates per head count and the static-pruning curve."""


def _predictor(predictor_cfg: PredictorConfig, init_file, cache: ContextCache, lm, importance) -> StructurePredictor:
    """A fresh predictor for this cache and base LM (head gates start at static importance)."""
    predictor = StructurePredictor.from_init(predictor_cfg, init_file, input_dim(
        predictor_cfg.input, cache.dim, lm.config.hidden_size, lm.config.num_hidden_layers))
    if predictor_cfg.gate == "head":
        predictor.init_head_bias(importance)
    return predictor


def train_phase1(cfg: Phase1Config, predictor_cfg: PredictorConfig, base_dir, contexts_dir, init_file, heads_file,
                 out_file, checkpoint_root=None, tracker=None, runtime_cfg: RuntimeConfig | None = None,
                 oracle_targets: dict | None = None, val_state: dict | None = None, oracle: OracleTargets | None = None,
                 twin_file=None) -> tuple[dict, TrainResult, Phase1Module, Phase1Module | None]:
    """Train the predictor (and, with ``phase1.static_twin``, its static twin); write it to
    ``out_file``; return (the training figures, the training result, the module, the twin's module
    or None). The training figures (:data:`TRAINING_KEYS`) are the periodic evaluation's last ones,
    on the cache's val windows; what the router scores on the scoring windows is
    :func:`score_phase1`'s. ``oracle_targets``: the distillation targets by train window, shared
    between runs of the same inputs (the stage's seeds); filled as they are computed. ``val_state``:
    the periodic evaluation's seed-independent figures (:data:`VAL_STATE`), shared between runs of
    the same inputs: read when filled, filled otherwise. ``oracle``: the oracle stage's targets, the
    training windows of a router that does not read the cache (None: the cache's train windows,
    targets computed here). ``twin_file``: where the static twin's router goes (None: not written)."""
    from transformers import AutoModelForCausalLM

    runtime_cfg = runtime_cfg or RuntimeConfig()
    if predictor_cfg.gate == "cascade" and cfg.static_twin:  # zeroed inputs collapse its soft edges (~3 s/step)
        raise ConfigError("phase1.static_twin", "is for head-gate routers: the cascade trained on zeroed inputs "
                          "collapses (every edge logit the same: ~3 s/step for nothing); set it to false for "
                          "predictor.gate: cascade")
    if predictor_cfg.gate != "head":
        for name in ("distill", "z_loss", "balance"):
            require(getattr(cfg, name) == 0, name, f"acts on head gates' keep logits: set it to 0 for "
                    f"predictor.gate: {predictor_cfg.gate} (or use predictor.gate: head)")
    cache = ContextCache(contexts_dir)
    lm = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    tensors, init_meta = load_init(init_file)
    unit = runtime_cfg.unit
    units = unit_shape(lm, unit)
    importance = head_importance(heads_file, lm.config.num_attention_heads // units[1])
    nodes = init_nodes(tensors, init_meta, init_file)  # the predictor's, checked before any work
    if nodes != units or tuple(importance.shape) != units:
        raise ValueError(f"init file {init_file} ({nodes[0]} x {nodes[1]}), head statistics "
                         f"{heads_file} {tuple(importance.shape)} and base model ({units[0]} x {units[1]} "
                         f"{unit}s, runtime.unit) disagree: rerun `dvc repro` from the probe stage")
    torch.manual_seed(cfg.train.seed)
    predictor = _predictor(predictor_cfg, init_file, cache, lm, importance)
    geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float())
    oracle_targets = {} if oracle_targets is None else oracle_targets
    module = Phase1Module(predictor, lm, cache, geo, importance, cfg, runtime_cfg.skip, oracle_targets=oracle_targets,
                          oracle=oracle)
    for name, value in (val_state or {}).items():
        setattr(module, name, value)

    module.place(resolve_device(cfg.train.device, "phase1.train.device"))  # before the first evaluation
    initial = module.evaluate(predictor.to(module.device))  # the starting point: near the dense graph
    config = {"phase1": to_dict(cfg), "predictor": to_dict(predictor_cfg), "runtime": to_dict(runtime_cfg)}
    files = [init_file, Path(base_dir) / "model.safetensors"]
    if module.oracle is not None:  # its windows and targets are what the router trains on
        files.append(module.oracle.dir / TARGETS_FILE)
    ckpt = checkpoint_dir(checkpoint_root, "phase1", config, files, [cache.fingerprint()])
    result = train(module, cfg.train, stage="phase1", checkpoint_dir=ckpt, tracker=tracker)
    result.eval_curve.insert(0, {"step": 0, **initial})
    final = module.last_eval
    if val_state is not None and not val_state:
        val_state.update({name: getattr(module, name) for name in VAL_STATE})
    save_predictor(module.model, out_file, extra={"phase1": to_dict(cfg), "encoder": cache.meta["encoder"],
                                                  "runtime": to_dict(runtime_cfg)})  # (copied to the CPU)
    # the periodic evaluation's last figures: the context cache's val windows (the curves)
    training = {k: final[k] for k in CACHE_KEYS}
    training.update({"cache_val": {"window_set": module.cache_label(), **training},
                     "scored_positions": len(module.val_rows) * module.cache.context_length,
                     "window_set": module.cache_label(), "oracle_heads_kept": final["oracle_heads_kept"],
                     "init_soft_nll_minus_dense": initial["soft_nll"] - initial["dense_nll"],
                     "train_steps": cfg.train.steps, "train_tokens_per_s": result.tokens_per_s})
    twin = None
    if cfg.static_twin:
        twin = _static_twin(cfg, predictor_cfg, module, init_file, files, checkpoint_root, twin_file, runtime_cfg)
    return training, result, module, twin


def _static_twin(cfg: Phase1Config, predictor_cfg: PredictorConfig, module: Phase1Module, init_file, files,
                 checkpoint_root, twin_file=None, runtime_cfg: RuntimeConfig | None = None) -> Phase1Module:
    """Train the same router, same seed, on zeroed inputs; return its module. The twin's router goes
    to ``twin_file`` (None: not written)."""
    torch.manual_seed(cfg.train.seed)
    twin = _predictor(predictor_cfg, init_file, module.cache, module.lm, module.importance)
    twin_module = Phase1Module(twin, module.lm, module.cache, module.geo, module.importance, cfg, module.skip,
                               zero_inputs=True, oracle_targets=module._train_loo, oracle=module.oracle)
    for name in VAL_STATE:  # the same LM and val windows: the seed-independent work is the router's
        if name != "_val":  # the twin's inputs are zeros
            setattr(twin_module, name, getattr(module, name))
    twin_module.place(module.device)
    twin_cfg = final_evaluation_only(cfg)
    ckpt = checkpoint_dir(checkpoint_root, "phase1_twin", {"phase1": to_dict(twin_cfg),
                                                           "predictor": to_dict(predictor_cfg), "skip": module.skip},
                          files, [module.cache.fingerprint()])
    train(twin_module, twin_cfg.train, stage="phase1 twin", checkpoint_dir=ckpt)
    if twin_file is not None:  # what the scoring stage reads (save_predictor copies the weights to the CPU)
        save_predictor(twin_module.model, twin_file, extra={
            "phase1": to_dict(cfg), "encoder": module.cache.meta["encoder"],
            "runtime": to_dict(runtime_cfg or RuntimeConfig()), "static_twin": True})
    return twin_module


def train_phase1_seeds(cfg: Phase1Config, predictor_cfg: PredictorConfig, base_dir, contexts_dir, init_file,
                       heads_file, out_file, seeds_dir, twins_dir, checkpoint_root=None, tracker=None,
                       runtime_cfg: RuntimeConfig | None = None, oracle_dir=None
                       ) -> tuple[dict, TrainResult, Phase1Module]:
    """The ``phase1`` stage: :func:`train_phase1` over ``cfg.seeds`` seeds. Seed 0's router goes to
    ``out_file``, seed i's (i ≥ 1) to ``seeds_dir`` (``predictor_seed<i>.safetensors``: phase 2's seed
    i routes with it), every seed's static twin to ``twins_dir`` (``twin_seed<i>.safetensors``, with
    ``phase1.static_twin``): what the ``score_phase1`` stage reads. Returns (the training report: every
    seed's training figures in ``per_seed``, the primary's result and module). ``oracle_dir``: the
    oracle stage's targets (:mod:`lookahead.artifacts.oracle_targets`)."""
    oracle = OracleTargets(oracle_dir) if oracle_dir is not None else None
    targets: dict = {}  # the oracle's targets do not depend on the seed: computed once
    val_state: dict = {}  # nor does the periodic evaluation's reference work
    keep = is_main_process()  # a worker's seed runs write to scratch only
    runs: list[dict] = []
    # the seeds' routers replace seeds_dir once every seed has trained (a killed run leaves nothing there)
    with (atomic_dir(seeds_dir) if keep else contextlib.nullcontext() as seeds_tmp,
          atomic_dir(twins_dir) if keep else contextlib.nullcontext() as twins_tmp):

        def run(c: Phase1Config, scratch: Path | None) -> tuple[dict, TrainResult, Phase1Module]:
            offset = c.train.seed - cfg.train.seed
            router = Path(out_file) if scratch is None else seeds_tmp / seed_router_name(offset) if keep \
                else scratch / "predictor.safetensors"
            twin = twins_tmp / twin_router_name(offset) if keep else None
            training, result, module, _ = train_phase1(
                c, predictor_cfg, base_dir, contexts_dir, init_file, heads_file, router, checkpoint_root,
                None if scratch else tracker, runtime_cfg, targets, val_state, oracle, twin)
            runs.append(training)
            return training, result, module

        _, result, module = over_seeds(cfg, "phase1", (), run)
    return {"seeds": len(runs), "per_seed": runs}, result, module
