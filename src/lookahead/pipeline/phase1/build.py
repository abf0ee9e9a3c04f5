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

Two sets of windows (docs/reproducibility.md): the periodic evaluation (the curves and the Pareto picture)
scores the context cache's val windows, labelled ``cache_val`` in the report; every headline figure
— dense, the router on dense states and as deployed, static pruning, random heads, both oracles,
recall, the routing statistics, the context shuffle and the static twin — scores the ``scoring``
windows (the test set, or the selection set in comparisons; :mod:`lookahead.pipeline.phase1.final`),
every seed, and their per-position NLLs go to ``data/val_nll/phase1.safetensors``: the claims carry
95 % intervals over those positions and the seeds (:mod:`lookahead.core.intervals`).
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import torch

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.oracle_targets import TARGETS_FILE, OracleTargets
from lookahead.artifacts.probe_heads import head_importance
from lookahead.artifacts.val_scores import ScoringConfig, save_scores, scoring_windows
from lookahead.core.atomic import atomic_dir
from lookahead.core.config import to_dict
from lookahead.core.devices import resolve_device
from lookahead.core.errors import ConfigError, require
from lookahead.core.intervals import CI_HIGH, CI_LOW, SE, claim_keys
from lookahead.core.seeds import final_evaluation_only, over_seeds
from lookahead.core.tracking import is_main_process
from lookahead.graph.cost import deployed_macs
from lookahead.graph.oracle import routing_stats
from lookahead.graph.predictor import PredictorConfig, StructurePredictor, load_init, save_predictor
from lookahead.graph.predictor import seed_router_name, twin_router_name
from lookahead.graph.router_inputs import input_dim
from lookahead.graph.runtime import RuntimeConfig
from lookahead.graph.scoring import GeoLookup
from lookahead.pipeline.phase1.config import Phase1Config
from lookahead.pipeline.phase1.final import (CLAIMS, ScoringSet, capture, claims, routed, score_final, scoring_set,
                                             seed_figures)
from lookahead.pipeline.phase1.module import Phase1Module
from lookahead.train.checkpoints import checkpoint_dir
from lookahead.train.loop import TrainResult, train


# metrics/phase1.json (lookahead.core.report); throughput and per-layer figures stay in the report
# and the research figures over seeds (lookahead.core.seeds): the mean, then `_sd`
SEEDED = ("hard_nll", "deployed_nll", "active_head_fraction", "random_heads_nll", "hard_nll_increase",
          "increase_over_static_increase", "deployed_increase_over_static_increase", "oracle_capture",
          "greedy_capture", "oracle_recall_at_k", "static_recall_at_k", "dynamic_fraction", "context_shuffle_dnll",
          "static_twin_gap", "equal_macs_static_heads")
# every figure scores one set of windows: the scoring set (test or selection; the cache's val windows
# for a router that reads the cache), recorded as `window_set`; soft_nll, active_edge_fraction,
# gate_entropy_bits, the NLL ratios and the periodic evaluation's figures (`cache_val`) are in the report
HEADLINE = ("dense_nll", "hard_nll", "hard_nll_sd", "deployed_nll", "deployed_nll_sd", "active_head_fraction",
            "static_pruning_nll", "random_heads_nll", "oracle_nll", "greedy_oracle_nll",
            "greedy_capture", "greedy_capture_sd", f"greedy_capture{CI_LOW}", f"greedy_capture{CI_HIGH}",
            "oracle_recall_at_k", "oracle_recall_at_k_sd", "static_recall_at_k", "dynamic_fraction",
            "context_shuffle_dnll", "static_twin_gap",
            *[k for name, _, _ in CLAIMS for k in claim_keys(name) if not k.endswith(SE)], "seeds", "window_set")
"""The headline (36 keys at most; `dvc metrics show metrics/phase1.json` within 400 characters:
the claims' spreads and intervals in the sibling files); every other figure, and every other
``_sd``, is in the report."""


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


def build_phase1(cfg: Phase1Config, predictor_cfg: PredictorConfig, base_dir, contexts_dir, init_file, heads_file,
                 out_file, checkpoint_root=None, tracker=None, runtime_cfg: RuntimeConfig | None = None,
                 oracle_targets: dict | None = None, scoring: ScoringSet | None = None,
                 val_state: dict | None = None, oracle: OracleTargets | None = None, twin_file=None
                 ) -> tuple[dict, TrainResult, Phase1Module]:
    """Train the predictor; write it to ``out_file``; return (metrics, training result, module).
    ``oracle_targets``: the distillation targets by train window, shared between runs of the same
    inputs (the stage's seeds); filled as they are computed. ``scoring``: the val set the final
    dense, hard and static-pruning NLLs score (their per-position values in ``token_nll``); None:
    the cache's val windows, as the periodic evaluation. ``val_state``: the periodic evaluation's
    seed-independent figures (:data:`VAL_STATE`), shared between runs of the same inputs: read when
    filled, filled otherwise. ``oracle``: the oracle stage's targets, the training windows of a
    router that does not read the cache (None: the cache's train windows, targets computed here).
    ``twin_file``: where the static twin's router goes (``phase1.static_twin``; None: discarded)."""
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
    tensors, _ = load_init(init_file)
    importance = head_importance(heads_file)
    torch.manual_seed(cfg.train.seed)
    predictor = _predictor(predictor_cfg, init_file, cache, lm, importance)
    if (predictor.n_layers, predictor.n_heads) != (lm.config.num_hidden_layers, lm.config.num_attention_heads) \
            or tuple(importance.shape) != (predictor.n_layers, predictor.n_heads):
        raise ValueError(f"init file {init_file} ({predictor.n_layers} x {predictor.n_heads}), head statistics "
                         f"{heads_file} {tuple(importance.shape)} and base model "
                         f"({lm.config.num_hidden_layers} x {lm.config.num_attention_heads}) disagree: "
                         "rerun `dvc repro` from the probe stage")
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
    predictor = module.model
    cost = None
    if predictor_cfg.gate == "head":  # per-token MACs over a dense forward's, the router's inputs included
        length = scoring.window if scoring is not None else module.cache.context_length
        cost = lambda fraction, state=False: deployed_macs(  # noqa: E731
            lm.config, predictor, (length + 1) / 2, fraction, module.skip, state)
    scored = None
    if scoring is not None:
        scored = score_final(module, predictor, scoring,
                             None if cost is None else lambda fraction: cost(fraction)["total_over_dense"])
    predictor = predictor.cpu()
    save_predictor(predictor, out_file, extra={"phase1": to_dict(cfg), "encoder": cache.meta["encoder"],
                                               "runtime": to_dict(runtime_cfg)})
    # the periodic evaluation's last figures: the context cache's val windows (the curves)
    cache_keys = ("dense_nll", "soft_nll", "hard_nll", "active_head_fraction", "active_edge_fraction",
                  "below_dense_fraction", "static_pruning_nll", "random_heads_nll", "oracle_nll", "oracle_capture",
                  "oracle_recall_at_k", "dynamic_fraction", "gate_entropy_bits", "context_shuffle_dnll")
    metrics = {k: final[k] for k in cache_keys}
    metrics["cache_val"] = {"window_set": module.cache_label(), **{k: final[k] for k in cache_keys}}
    metrics["scored_positions"] = len(module.val_rows) * module.cache.context_length
    metrics["window_set"] = module.cache_label()
    if scored is not None:  # every headline figure on the scoring set
        metrics.update(seed_figures(scored))
        metrics.update({"scored_positions": len(scored["hard"]), "window_set": scoring.label,
                        "token_nll": {k: scored[k] for k in TOKEN_NLL if scored.get(k) is not None}})
    else:  # the cache's val windows alone: the greedy oracle there
        metrics.update({"greedy_oracle_nll": None, "greedy_capture": None, "deployed_nll": None})
        if cfg.oracle == "greedy":
            greedy = module.greedy_oracle_nll(final["oracle_heads_kept"])
            metrics.update({"greedy_oracle_nll": greedy,
                            "greedy_capture": capture(final["static_pruning_nll"], final["hard_nll"], greedy)})
        increase, static_increase = (metrics[k] - metrics["dense_nll"] for k in ("hard_nll", "static_pruning_nll"))
        metrics.update({"hard_nll_increase": increase, "static_pruning_nll_increase": static_increase,
                        "increase_over_static_increase": increase / static_increase if static_increase > 0 else None,
                        "deployed_increase_over_static_increase": None, "oracle_heads_kept": final["oracle_heads_kept"],
                        "static_recall_at_k": None, "equal_macs_static_heads": None})  # scoring-set figures
    metrics.update({
        "init_soft_nll_minus_dense": initial["soft_nll"] - initial["dense_nll"],
        "static_twin_gap": None,
        "train_steps": cfg.train.steps,
        "train_tokens_per_s": result.tokens_per_s,
    })
    metrics.update(dict.fromkeys(("deployed_macs_over_dense", "dense_state_macs_over_dense", "router_macs_over_dense")))
    if cost is not None:
        fraction = metrics["active_head_fraction"]
        metrics.update({"deployed_macs_over_dense": cost(fraction)["total_over_dense"],
                        "dense_state_macs_over_dense": cost(fraction, True)["total_over_dense"],
                        "router_macs_over_dense": cost(fraction)["router_over_dense"]})
    if cfg.static_twin:
        metrics.update(_static_twin(cfg, predictor_cfg, module, init_file, files, checkpoint_root, final, scoring,
                                    metrics["hard_nll"], twin_file, runtime_cfg))
    return metrics, result, module


TOKEN_NLL = ("dense", "hard", "static", "deployed", "random", "loo", "greedy", "static_equal_macs")
"""The per-position NLLs a seed's report carries to the score file (those measured)."""


def _static_twin(cfg: Phase1Config, predictor_cfg: PredictorConfig, module: Phase1Module, init_file, files,
                 checkpoint_root, final: dict, scoring: ScoringSet | None, hard_nll: float, twin_file=None,
                 runtime_cfg: RuntimeConfig | None = None) -> dict:
    """Train the same router, same seed, on zeroed inputs; its hard NLL minus the router's
    (``hard_nll``), on the scoring set where there is one. The twin's router goes to ``twin_file``
    (None: discarded)."""
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
    twin_eval = twin_module.last_eval
    if twin_file is not None:  # what a scoring stage reads (save_predictor copies the weights to the CPU)
        save_predictor(twin_module.model, twin_file, extra={
            "phase1": to_dict(cfg), "encoder": module.cache.meta["encoder"],
            "runtime": to_dict(runtime_cfg or RuntimeConfig()), "static_twin": True})
    out = {"static_twin_hard_nll": twin_eval["hard_nll"],
           "static_twin_active_head_fraction": twin_eval["active_head_fraction"],
           "static_twin_dynamic_fraction": twin_eval["dynamic_fraction"]}
    if scoring is not None:
        hard, on = routed(twin_module, twin_module.model, scoring)
        out.update({"static_twin_hard_nll": float(hard.mean()),
                    "static_twin_active_head_fraction": on.double().mean().item(),
                    "static_twin_dynamic_fraction": routing_stats(on, module.n_layers)["dynamic_fraction"]})
    out["static_twin_gap"] = out["static_twin_hard_nll"] - hard_nll
    return out


def build_phase1_seeds(cfg: Phase1Config, predictor_cfg: PredictorConfig, base_dir, contexts_dir, init_file, heads_file,
                       out_file, checkpoint_root=None, tracker=None, runtime_cfg: RuntimeConfig | None = None,
                       scoring_cfg: ScoringConfig | None = None, tokens_dir=None, scores_file=None, oracle_dir=None,
                       seeds_dir=None, twins_dir=None) -> tuple[dict, TrainResult, Phase1Module]:
    """:func:`build_phase1`, then ``cfg.seeds - 1`` more trainings on other seeds: the metrics carry
    the :data:`SEEDED` figures' mean and sd (lookahead.core.seeds). ``seeds_dir``: where seed i's
    router goes (``predictor_seed<i>.safetensors``, i ≥ 1: phase 2's seed i routes with it; None:
    discarded). ``twins_dir``: where seed i's static twin goes (``twin_seed<i>.safetensors``, i ≥ 0, with
    ``phase1.static_twin``; None: discarded). With ``scoring_cfg``: every final figure scores its windows of ``tokens_dir``'s val
    stream (:mod:`lookahead.pipeline.phase1.final`), every seed's per-position NLLs go to
    ``scores_file`` (:func:`lookahead.artifacts.val_scores.save_scores`: ``dense`` (P,), the others
    (seeds, P), the seed-independent ones at each seed's head count) and the claims
    (:data:`lookahead.pipeline.phase1.final.CLAIMS`) get their intervals. ``oracle_dir``: the oracle
    stage's targets (:mod:`lookahead.artifacts.oracle_targets`)."""
    oracle = OracleTargets(oracle_dir) if oracle_dir is not None else None
    targets: dict = {}  # the oracle's targets do not depend on the seed: computed once
    val_state: dict = {}  # nor does the periodic evaluation's reference work
    scoring = None
    if scoring_cfg is not None:
        cache = ContextCache(contexts_dir)
        scoring = scoring_set(scoring_cfg, scoring_windows(tokens_dir, scoring_cfg, cache.context_length), cache,
                              predictor_cfg.input, resolve_device(cfg.train.device, "phase1.train.device"))
    keep_seeds = seeds_dir is not None and is_main_process()  # a worker's seed runs write to scratch only
    tokens: list = []  # every seed's per-position NLLs, popped from its report
    # the seeds' routers replace seeds_dir once every seed has trained (a killed run leaves nothing there)
    keep_twins = twins_dir is not None and is_main_process()  # empty without phase1.static_twin
    with (atomic_dir(seeds_dir) if keep_seeds else contextlib.nullcontext() as seeds_tmp,
          atomic_dir(twins_dir) if keep_twins else contextlib.nullcontext() as twins_tmp):

        def router_file(c: Phase1Config, scratch: Path | None) -> Path:
            if scratch is None:
                return Path(out_file)
            return seeds_tmp / seed_router_name(c.train.seed - cfg.train.seed) if keep_seeds \
                else scratch / "predictor.safetensors"

        def twin_file(c: Phase1Config) -> Path | None:
            return twins_tmp / twin_router_name(c.train.seed - cfg.train.seed) if keep_twins else None

        out, result, module = over_seeds(cfg, "phase1", SEEDED, lambda c, scratch: build_phase1(
            c, predictor_cfg, base_dir, contexts_dir, init_file, heads_file, router_file(c, scratch), checkpoint_root,
            None if scratch else tracker, runtime_cfg, targets, scoring, val_state, oracle, twin_file(c)),
            lambda runs: tokens.extend(r.pop("token_nll", None) for r in runs))
    if scoring is not None:
        scores = {"dense": tokens[0]["dense"]}
        scores.update({k: np.stack([t[k] for t in tokens]) for k in TOKEN_NLL[1:] if all(k in t for t in tokens)})
        if scores_file is not None:
            save_scores(scores_file, scores, scoring.label)
        out.update(claims(scores, scoring))
    return out, result, module
