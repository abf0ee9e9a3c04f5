"""The ``score_phase1`` stage (docs/pipeline.md): phase 1's routers read back from their files —
every seed's, and each seed's static twin — and scored on the scoring windows, with the training
stage's figures merged in; the claims with their intervals. It trains nothing, so that a new test set,
baseline or scoring setting reruns this stage alone. What a seed's figures are is
:mod:`lookahead.pipeline.phase1.final`'s; :func:`score_phase1` also scores a router still in memory
(:func:`lookahead.pipeline.phase1.run.build_phase1`)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.oracle_targets import OracleTargets
from lookahead.artifacts.probe_heads import head_importance
from lookahead.artifacts.static_baselines import StaticBaselines
from lookahead.artifacts.val_scores import ScoringConfig, refuse_choices_on_test, save_scores, scoring_windows
from lookahead.core.config import from_dict
from lookahead.core.devices import resolve_device
from lookahead.core.errors import require
from lookahead.core.intervals import CI_HIGH, CI_LOW, SE, claim_keys
from lookahead.core.seeds import reseeded, with_spread
from lookahead.graph.cost import deployed_macs, router_macs
from lookahead.graph.oracle import routing_stats
from lookahead.graph.predictor import StructurePredictor, load_init, load_predictor, seed_router_name, twin_router_name
from lookahead.graph.scoring import GeoLookup, capture
from lookahead.graph.runtime import recorded_unit, unit_shape
from lookahead.pipeline.phase1.config import Phase1Config, ScoringKeys
from lookahead.pipeline.phase1.final import (CLAIMS, RECALL_CLAIM, ScoringSet, claims, routed, score_final, scoring_set,
                                             seed_figures, static_scores)
from lookahead.pipeline.phase1.module import CACHE_KEYS, Phase1Module
from lookahead.train.checkpoints import checkpoint_dir


# metrics/phase1.json (lookahead.core.report); throughput and per-layer figures stay in the report
# and the research figures over seeds (lookahead.core.seeds): the mean, then `_sd`
SEEDED = ("hard_nll", "deployed_nll", "active_head_fraction", "random_heads_nll", "hard_nll_increase",
          "increase_over_static_increase", "deployed_increase_over_static_increase", "loo_oracle_capture",
          "greedy_capture", "dense_state_greedy_capture", "oracle_recall_at_k", "static_recall_at_k", "dynamic_fraction",
          "context_shuffle_dnll", "static_twin_gap", "equal_macs_static_heads")
# every figure scores one set of windows: the scoring set (test or selection; the cache's val windows
# for a router that reads the cache), recorded as `window_set`; soft_nll, active_edge_fraction,
# gate_entropy_bits, the NLL ratios and the periodic evaluation's figures (`cache_val`) are in the report
HEADLINE = ("dense_nll", "hard_nll", "deployed_nll", "deployed_nll_sd", "active_head_fraction",
            "static_pruning_nll", "static_importance_nll", "static_greedy_nll",
            "random_heads_nll", "loo_oracle_nll", "greedy_oracle_nll",
            "greedy_capture", "greedy_capture_sd", f"greedy_capture{CI_LOW}", f"greedy_capture{CI_HIGH}",
            "oracle_recall_at_k",
            *[k for name, _, _ in (*CLAIMS, RECALL_CLAIM) for k in claim_keys(name) if not k.endswith(SE)],
            "seeds", "window_set")
"""The headline (36 keys at most; `dvc metrics show metrics/phase1.json` within 400 characters — so
``context_shuffle_dnll``, ``static_twin_gap``, ``static_pruning_mask`` (the stronger mask's name: also
``metrics/static_baselines.json``'s ``stronger_at_half``) and the routing statistics stay in the report:
the claims' spreads and intervals in the sibling files); every other figure, and every other
``_sd``, is in the report."""


STATIC_CURVE = "static_heads_"
"""Score-file keys of the static curve (``phase1.score_static_curve``): ``static_heads_<k>``, (P,) each."""
TOKEN_NLL = ("dense", "hard", "static", "deployed", "deployed_macs", "random", "loo", "greedy", "static_equal_macs", "static_importance",
             "static_greedy", "recall", "static_recall")
"""The per-position figures a seed's report carries to the score file (those measured): NLLs, the
deployed forward's MACs (``deployed_macs``: as its gates ran, the router not included), and the
router's and the static mask's recall of the greedy oracle's heads."""


def score_phase1(training: dict, module: Phase1Module, predictor: StructurePredictor, scoring: ScoringSet | None,
                 twin: Phase1Module | None = None) -> dict:
    """One seed's report: its ``training`` figures (:func:`lookahead.pipeline.phase1.build.train_phase1`)
    and every final figure on the scoring set (:mod:`lookahead.pipeline.phase1.final`; their per-position values in
    ``token_nll``) — or, with ``scoring`` None, the cache's val windows, as the periodic evaluation.
    ``module``: the seed's (trained or read back: its LM, importance, config and ``tau_now``);
    ``twin``: its static twin's module (``phase1.static_twin``; None: none)."""
    lm, cfg = module.lm, module.cfg
    cost = None
    if predictor.cfg.gate == "head":  # per-token MACs over a dense forward's, the router's inputs included
        length = scoring.window if scoring is not None else module.cache.context_length
        cost = lambda fraction, state=False: deployed_macs(  # noqa: E731
            lm.config, predictor, (length + 1) / 2, fraction, module.skip, state)
    scored = None
    if scoring is not None:
        scored = score_final(module, predictor, scoring, None if cost is None else router_macs(predictor))
    metrics = {k: training[k] for k in (*CACHE_KEYS, "cache_val", "scored_positions", "window_set")}
    if scored is not None:  # every figure on the scoring set: the cache's val windows' figures stay under cache_val
        metrics = {k: v for k, v in metrics.items() if k not in CACHE_KEYS}
        metrics.update(seed_figures(scored))
        metrics.update({"scored_positions": len(scored["hard"]), "window_set": scoring.label,
                        "token_nll": {k: scored[k] for k in TOKEN_NLL if scored.get(k) is not None}})
    else:  # the cache's val windows alone: the greedy oracle there
        metrics.update({"greedy_oracle_nll": None, "greedy_capture": None, "dense_state_greedy_capture": None,
                        "deployed_nll": None})
        if cfg.oracle == "greedy":
            greedy = module.greedy_oracle_nll(training["oracle_heads_kept"])
            metrics.update({"greedy_oracle_nll": greedy, "dense_state_greedy_capture": capture(
                training["static_pruning_nll"], training["hard_nll"], greedy)})
            metrics["greedy_capture"] = metrics["dense_state_greedy_capture"]  # no deployed router on the cache's windows
        increase, static_increase = (metrics[k] - metrics["dense_nll"] for k in ("hard_nll", "static_pruning_nll"))
        metrics.update({"hard_nll_increase": increase, "static_pruning_nll_increase": static_increase,
                        "increase_over_static_increase": increase / static_increase if static_increase > 0 else None,
                        "deployed_increase_over_static_increase": None,
                        "oracle_heads_kept": training["oracle_heads_kept"],
                        "static_recall_at_k": None, "equal_macs_static_heads": None,  # scoring-set figures
                        "loo_oracle_nll": metrics["oracle_nll"], "loo_oracle_capture": metrics["oracle_capture"],
                        "static_pruning_mask": "probe importance (train windows)",
                        "static_importance_nll": None, "static_greedy_nll": None})
    metrics.update({"init_soft_nll_minus_dense": training["init_soft_nll_minus_dense"], "static_twin_gap": None,
                    "train_steps": training["train_steps"]})
    if "train_tokens_per_s" in training:  # a timing: not in the training report read back from its file
        metrics["train_tokens_per_s"] = training["train_tokens_per_s"]
    metrics.update(dict.fromkeys(("deployed_macs_over_dense", "dense_state_macs_over_dense", "router_macs_over_dense")))
    if cost is not None:
        fraction = metrics["active_head_fraction"]
        # as deployed: the gates it ran, counted as they ran, where the scoring set ran them; else the closed form
        as_run = None if scored is None else scored.get("deployed_macs_over_dense")
        metrics.update({"deployed_macs_over_dense": cost(fraction)["total_over_dense"] if as_run is None else as_run,
                        "dense_state_macs_over_dense": cost(fraction, True)["total_over_dense"],
                        "router_macs_over_dense": cost(fraction)["router_over_dense"]})
    if twin is not None:
        metrics.update(_twin_figures(twin, scoring, metrics["hard_nll"]))
    return metrics


def _twin_figures(twin: Phase1Module, scoring: ScoringSet | None, hard_nll: float) -> dict:
    """The static twin's hard NLL minus the router's (``hard_nll``), on the scoring set where there is
    one (else its periodic evaluation's last figures, the cache's val windows)."""
    if scoring is None:
        last = twin.last_eval or twin.evaluate(twin.model.to(twin.device))
        out = {"static_twin_hard_nll": last["hard_nll"], "static_twin_active_head_fraction": last["active_head_fraction"],
               "static_twin_dynamic_fraction": last["dynamic_fraction"]}
    else:
        hard, on = routed(twin, twin.model, scoring)
        out = {"static_twin_hard_nll": float(hard.mean()),
               "static_twin_active_head_fraction": on.double().mean().item(),
               "static_twin_dynamic_fraction": routing_stats(on, twin.n_layers)["dynamic_fraction"]}
    out["static_twin_gap"] = out["static_twin_hard_nll"] - hard_nll
    return out


def scoring_config(router_file, keys: ScoringKeys, training_file) -> tuple[Phase1Config, dict]:
    """(The seeds' training config as ``router_file`` records it, with the scoring stage's own keys
    from params; the training report ``training_file`` that
    :func:`lookahead.pipeline.phase1.build.train_phase1_seeds` wrote)."""
    _, meta = load_predictor(router_file)
    cfg = dataclasses.replace(from_dict(Phase1Config, meta["phase1"]), **dataclasses.asdict(keys))
    return cfg, json.loads(Path(training_file).read_text(encoding="utf-8"))


def scoring_search(search: dict, cfg: Phase1Config) -> dict:
    """The scoring oracle's greedy search: the oracle stage's (``search``, {} = exact), with
    ``score_per_round`` and ``score_candidates`` where set."""
    out = dict(search)
    if cfg.score_per_round is not None:
        out["per_round"] = cfg.score_per_round
    if cfg.score_candidates is not None:
        out["candidates"] = cfg.score_candidates
    return out


def score_phase1_seeds(cfg: Phase1Config, base_dir, contexts_dir, init_file, heads_file, router_file, seeds_dir,
                       twins_dir, training: dict, scoring_cfg: ScoringConfig, tokens_dir, oracle_dir=None,
                       scores_file=None, static_dir=None, checkpoint_root=None) -> dict:
    """The ``score_phase1`` stage: every seed's router (and static twin) as
    :func:`lookahead.pipeline.phase1.build.train_phase1_seeds` wrote them, read back and scored on the
    scoring windows of ``tokens_dir``'s val stream
    (:func:`score_phase1`), with ``training`` (its report) merged in. Returns the stage's report: the
    :data:`SEEDED` figures' mean and sd over seeds (lookahead.core.seeds), the claims
    (:data:`lookahead.pipeline.phase1.final.CLAIMS`) with their intervals; every seed's per-position
    NLLs go to ``scores_file`` (:func:`lookahead.artifacts.val_scores.save_scores`: ``dense`` (P,), the
    others (seeds, P), the seed-independent ones at each seed's head count). ``cfg``: the router's
    training config, as its file records it, with the scoring stage's own keys
    (``random_draws``, ``oracle``) set from params. ``static_dir``: the static_baselines stage's masks,
    which static pruning keeps (None: the probe's importance ``heads_file``). ``checkpoint_root``: the
    oracles' per-batch results are kept there as they finish (:attr:`ScoringSet.store`, under a digest
    of the search, the base LM, the token streams and the windows), so that a cut-off run resumes;
    removed once the scores are written."""
    from transformers import AutoModelForCausalLM

    per_seed = training["per_seed"]
    require(len(per_seed) == cfg.seeds, "seeds", f"the training report holds {len(per_seed)} seeds, the router "
            f"{router_file} was trained with {cfg.seeds}: rerun `dvc repro phase1`")
    device = resolve_device(cfg.train.device, "phase1.train.device")
    cache = ContextCache(contexts_dir)
    lm = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    tensors, _ = load_init(init_file)
    geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float())
    unit = recorded_unit(load_predictor(router_file)[1])
    n_layers, n_units = unit_shape(lm, unit)  # the router's nodes
    importance = head_importance(heads_file, lm.config.num_attention_heads // n_units)
    oracle = OracleTargets(oracle_dir) if oracle_dir is not None else None
    static = StaticBaselines(static_dir) if static_dir is not None else None
    if static is not None:
        static.check(n_layers, n_units, f"the base LM {base_dir}")
    refuse_choices_on_test(scoring_cfg, tokens_dir, cache, static.spans if static is not None else None)
    scoring = None
    runs = []
    for offset in tqdm(range(cfg.seeds), desc="score_phase1 seeds", unit="seed", disable=cfg.seeds <= 1):
        c = reseeded(cfg, offset)
        file = Path(router_file) if offset == 0 else Path(seeds_dir) / seed_router_name(offset)
        modules = []
        for path, twin in ((file, False), (Path(twins_dir) / twin_router_name(offset), True)):
            if twin and not cfg.static_twin:
                break
            router, meta = load_predictor(path)
            module = Phase1Module(router, lm, cache, geo, importance, c, meta["runtime"]["skip"], zero_inputs=twin,
                                  oracle=oracle)
            module.place(device)
            module.model = router.to(device)
            module.tau_now = c.tau(c.train.steps - 1)  # the last training step's, which the trained router scored at
            module.search = scoring_search(module.search, c)
            modules.append(module)
        if scoring is None:
            scoring = scoring_set(scoring_cfg, scoring_windows(tokens_dir, scoring_cfg, cache.context_length, cache=cache), cache,
                                  modules[0].model.cfg.input, device, static)
            scoring.store = checkpoint_dir(checkpoint_root, "score_phase1",
                                           {"search": modules[0].search, "skip": modules[0].skip, "unit": unit,
                                            "batch_size": scoring_cfg.batch_size},
                                           [Path(base_dir) / "model.safetensors", Path(tokens_dir) / "val.npy"],
                                           [scoring.label])
        runs.append(score_phase1(per_seed[offset], modules[0], modules[0].model, scoring,
                                 modules[1] if len(modules) > 1 else None))
    tokens = [r.pop("token_nll") for r in runs]
    out = with_spread(runs[0], runs[1:], SEEDED)
    if cfg.score_per_round is not None or cfg.score_candidates is not None:  # another search than training's oracle
        out["scoring_oracle_search"] = scoring_search(oracle.search if oracle is not None else {}, cfg)
    scores = {"dense": tokens[0]["dense"]}
    scores.update({k: np.stack([t[k] for t in tokens]) for k in TOKEN_NLL[1:] if all(k in t for t in tokens)})
    if cfg.score_static_curve:  # the frontier's static curve: the stronger mask at every whole head count
        total = modules[0].n_layers * modules[0].n_heads
        for keep in tqdm(range(1, total + 1), desc="static curve", unit="count"):
            scores[f"{STATIC_CURVE}{keep}"] = static_scores(modules[0], scoring, keep)
    if scores_file is not None:
        save_scores(scores_file, scores, scoring.label)
    if scoring.store is not None:
        shutil.rmtree(scoring.store, ignore_errors=True)
    out.update(claims(scores, scoring))
    return out
