"""The ``score_phase2`` and ``score_control`` stages (docs/pipeline.md): phase 2's LM and the static
control (``score_phase2``), the dense control and the base LM it started from (``score_control``), every
seed's, read back from the files their training stages wrote and scored on the scoring windows (the
cache's val windows with ``windows: cache``) — the per-position NLLs evaluate pairs, the headline
figures and their spread over seeds, with each training stage's figures merged in. They train nothing,
so a new test set or scoring setting reruns them (and evaluate) alone; the dense control's scoring is
a stage of its own so that a dense model (the frontier's smaller dense models) is scored without a
router, phase 2 or a static control. The measurements are the training modules' own
(:meth:`lookahead.pipeline.phase2.module.Phase2Module.score`,
:meth:`lookahead.pipeline.phase2.control.ControlModule.score`), so that a model scored in memory and
read back score alike."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.phase2 import CONFIG_FILE, LM_DIR, PREDICTOR_FILE
from lookahead.artifacts.val_scores import ScoringConfig, batches, refuse_choices_on_test, save_scores, scoring_windows
from lookahead.core.config import from_dict
from lookahead.core.devices import resolve_device
from lookahead.core.errors import require
from lookahead.core.seeds import seeded_headline, with_spread
from lookahead.core.windows import set_label
from lookahead.graph.connectivity import CONNECTIVITY_FILE, load_connectivity
from lookahead.graph.scoring import GeoLookup
from lookahead.lm.adapters import VALUE_RESIDUAL_FILE, load_value_residual
from lookahead.pipeline.phase2.common import base_lm, decoder_sampler, val_batches
from lookahead.pipeline.phase2.config import Phase2Config
from lookahead.pipeline.phase2.control import ControlModule, StaticMask
from lookahead.pipeline.phase2.static_mask import mask_at
from lookahead.pipeline.phase2.model import Phase2Model, connectivity_weights, weight_summary
from lookahead.pipeline.phase2.module import Phase2Module


def final_batches(cfg: Phase2Config, scoring: ScoringConfig, tokens_dir, cache: ContextCache,
                  device) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(windows (B, T+1), contexts (B, T, C) or None) of the val set the final figures score: the
    scoring windows, or the cache's val windows with ``windows: cache`` (the same in phase 2 and
    both controls, so that their per-position NLLs pair)."""
    if cfg.windows == "cache":
        rows = np.arange(len(cache.windows("val")))
        return list(val_batches(cache, rows, scoring.batch_size, device))
    windows = scoring_windows(tokens_dir, scoring, cache.context_length, cache=cache)
    return [(w, None) for w in batches(windows, scoring.batch_size, device)]


def final_label(cfg: Phase2Config, scoring: ScoringConfig, tokens_dir, cache: ContextCache) -> str:
    """The :func:`lookahead.artifacts.val_scores.set_label` of :func:`final_batches`' windows."""
    if cfg.windows == "cache":
        return set_label("cache-val", cache.windows("val"))
    return set_label(scoring.set, scoring_windows(tokens_dir, scoring, cache.context_length, cache=cache))


def save_seed_scores(path, runs: list[dict], shared: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Pop each run's ``token_nll`` ({name: (P,)}) and write them, stacked over the runs (seeds, P),
    with ``shared`` ({name: (P,)}: one model's, not the seeds') to ``path`` (None: not written) with the
    runs' ``window_set``; return the stacked arrays."""
    tokens = [run.pop("token_nll") for run in runs]
    stacked = {name: np.stack([t[name] for t in tokens]) for name in tokens[0]}
    stacked.update(shared or {})
    if path is not None:
        save_scores(path, stacked, runs[0].get("window_set"))
    return stacked


# metrics/phase2.json (lookahead.core.report) and their spread over training seeds
# (lookahead.core.seeds); dense_nll and hard_nll score the
# final val set (scored_positions), the start_ figures and soft_nll (in the report) the cache's val windows
SEEDED = ("dense_nll", "hard_nll", "deployed_nll", "soft_nll", "active_head_fraction")
HEADLINE = (*seeded_headline(("base_val_nll", "start_hard_nll", "dense_nll", "hard_nll", "deployed_nll",
                              "active_head_fraction", "start_active_head_fraction", "scored_positions", "train_steps",
                              "train_tokens", "passes_over_cache", "passes_over_stream", "parameters_added"), SEEDED),
            "window_set", "cache_window_set")

# metrics/control.json and metrics/static_control.json (lookahead.core.report)
DATA_KEYS = ("train_steps", "train_tokens", "passes_over_cache", "passes_over_stream")
CONTROL_SEEDED = ("val_nll",)
# val_nll and dense_nll score the final val set (scored_positions); base_val_nll and start_val_nll the
# cache's val windows (the periodic evaluation's, like phase 2's start_ figures)
CONTROL_HEADLINE = (*seeded_headline(("base_val_nll", "val_nll", "scored_positions", *DATA_KEYS), CONTROL_SEEDED),
                    "window_set", "cache_window_set")
STATIC_SEEDED = ("val_nll", "dense_nll")
STATIC_HEADLINE = (*seeded_headline(("start_val_nll", "val_nll", "dense_nll", "active_head_fraction", "scored_positions",
                                     *DATA_KEYS), STATIC_SEEDED), "mask", "window_set", "cache_window_set")
"""Each headline names both window sets it holds: ``window_set`` (the scoring set: ``dense_nll``,
``hard_nll``, ``val_nll``...) and ``cache_window_set`` (the cache's val windows: ``base_``/``start_`` figures)."""

STAGES = ("phase2", "control", "static_control")
"""The training stages whose models the scoring stages score (``score_phase2``: phase2 and static_control;
``score_control``: control), in the order they score them."""
BASE_KEY = "base"
"""The base LM's per-position NLLs in the dense control's score file: the model its training started from."""

_PHASE2_ORDER = ("decoder", "base_val_nll", "start_hard_nll", "start_active_head_fraction", "dense_nll", "hard_nll",
                 "deployed_nll", "soft_nll", "active_head_fraction", "scored_positions", "window_set", "router",
                 "added_parameters", "parameters_added", "hard_minus_dense", "connectivity_weights",
                 "scored_active_head_fraction", "deployed_macs_over_dense", "cache_window_set", "cache_val")
"""A phase-2 seed's report, key by key, before its data figures (the training report's order)."""


def score_phase2(training: dict, module: Phase2Module, batches: list, window_set: str) -> dict:
    """One phase-2 seed's report: its ``training`` figures (:func:`lookahead.pipeline.phase2.build.train_phase2`)
    and what ``module.model`` scores on ``batches`` (labelled ``window_set``), per position in ``token_nll``."""
    model = module.model
    scored = module.score(model, batches)
    weights = connectivity_weights(model, batches) if model.connectivity is not None else None
    figures = {
        "dense_nll": float(scored["dense"].mean()),
        "hard_nll": float(scored["hard"].mean()),
        "deployed_nll": float(scored["deployed"].mean()) if "deployed" in scored else None,
        "scored_positions": len(scored["hard"]),
        "window_set": window_set,
        "hard_minus_dense": float((scored["hard"] - scored["dense"]).mean()),
        "connectivity_weights": (weight_summary(weights[0], model.connectivity.mask.cpu()) if weights is not None
                                 else None),
        "scored_active_head_fraction": scored["active_head_fraction"],
        "deployed_macs_over_dense": scored.get("deployed_macs_over_dense"),
    }
    figures["cache_window_set"] = set_label("cache-val", module.cache.windows("val"))
    report = {k: figures[k] if k in figures else training[k] for k in _PHASE2_ORDER}
    report.update({k: v for k, v in training.items() if k not in report})  # the data report, the refresher's
    report["token_nll"] = {k: scored[k] for k in ("dense", "hard", "deployed", "deployed_macs") if k in scored}
    return report


def score_control(training: dict, module: ControlModule, batches: list, window_set: str) -> dict:
    """One control seed's report: its ``training`` figures (:func:`lookahead.pipeline.phase2.control.train_control`)
    and what its LM scores on ``batches``, dense and (the static control) under its mask."""
    scored = module.score(module.model, batches)
    final = {k: float(v.mean()) for k, v in scored.items()}
    if module.mask is None:
        report = {"base_val_nll": training["base_val_nll"], "val_nll": final["dense"]}
    else:
        report = {"start_val_nll": training["start_val_nll"], "val_nll": final["hard"], "dense_nll": final["dense"]}
    if module.mask is not None:
        report["mask"] = module.mask.source  # which static baseline it trained under
    report.update({k: v for k, v in training.items() if k not in report and k != "cache_val"})
    return {**report, "scored_positions": len(scored["dense"]), "window_set": window_set,
            "cache_window_set": set_label("cache-val", module.cache.windows("val")), "cache_val": training["cache_val"],
            "token_nll": scored}


def load_phase2_model(model_dir, base_dir, predictor_file, diffusion_dir) -> tuple[Phase2Model, Phase2Config, object]:
    """A phase-2 seed's model as :func:`lookahead.pipeline.phase2.build.train_phase2` saved it (its
    LM with any adapter merged, its router, connectivity and value residual), the config it trained
    with, and its decoder's sampler (``decoder: diffusion``: the frozen head of ``diffusion_dir``, its
    gates of the kind of phase 1's router ``predictor_file``; None under ``mlp``)."""
    from lookahead.graph.predictor import load_predictor

    model_dir = Path(model_dir)
    config = json.loads((model_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    cfg = from_dict(Phase2Config, config["phase2"])
    lm = base_lm(model_dir / LM_DIR)
    predictor = load_predictor(model_dir / PREDICTOR_FILE)[0] if cfg.decoder == "mlp" else None
    sampler = decoder_sampler(cfg.decoder, diffusion_dir, load_predictor(predictor_file)[0].cfg.gate)
    connectivity = load_connectivity(model_dir / CONNECTIVITY_FILE) if (model_dir / CONNECTIVITY_FILE).is_file() else None
    value_residual = load_value_residual(model_dir / VALUE_RESIDUAL_FILE).attach(lm) if cfg.value_residual else None
    reference = None
    if not cfg.train_lm and (cfg.adapter != "none" or cfg.value_residual):  # the dense figures' frozen LM
        reference = base_lm(base_dir).eval().requires_grad_(False)
    return Phase2Model(lm, predictor, config["skip"], connectivity, value_residual, None, reference), cfg, sampler


def control_model(model_dir, stage: str, static_dir) -> tuple[object, Phase2Config, StaticMask | None]:
    """A control seed's LM (the static control's under its mask: the heads its training kept, the
    stronger static baseline of ``static_dir`` at its fraction) and the keys of ``phase2`` it trained with."""
    saved = json.loads((Path(model_dir) / "lookahead_config.json").read_text(encoding="utf-8"))[stage]
    names = {f.name for f in dataclasses.fields(Phase2Config)}
    cfg = from_dict(Phase2Config, {k: v for k, v in saved.items() if k in names})
    lm = base_lm(model_dir)
    if "mask" not in saved:
        return lm, cfg, None
    mask = mask_at(static_dir, saved["mask"]["active_head_fraction"], saved["mask"]["skip"])
    require(mask.heads() == saved["mask"]["heads"], "heads", f"{static_dir} ranks other heads first than the static "
            f"control in {model_dir} kept: rerun `dvc repro static_control`")
    return lm, cfg, mask


def seed_dirs(out_dir, seeds_dir, seeds: int) -> list[Path]:
    """Where a training stage put each seed's model: seed 0 in ``out_dir``, seed i in ``seeds_dir``/``seed<i>``."""
    return [Path(out_dir)] + [Path(seeds_dir) / f"seed{i}" for i in range(1, seeds)]


def read_training(path) -> dict:
    """A training stage's report (``metrics/<stage>_training.json``): every seed's figures in ``per_seed``."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def score_phase2_seeds(models: dict[str, tuple], training: dict[str, dict], base_dir, tokens_dir, contexts_dir,
                       init_file, static_dir, predictor_file, diffusion_dir, scoring: ScoringConfig,
                       scores_files: dict[str, Path] | None = None) -> dict[str, dict]:
    """The ``score_phase2`` and ``score_control`` stages: for each of :data:`STAGES` in ``models``, every
    seed's model (``models[stage]``: (its output directory, its seeds directory)) read back and scored on
    the final val set with its training stage's report ``training[stage]`` merged in. Returns each
    stage's report (the seeded figures' mean and sd over seeds); every seed's per-position NLLs go to
    ``scores_files[stage]``, and for the dense control the base LM's too (:data:`BASE_KEY`, its
    ``base_nll`` in the report: the control's start, scored on the same windows)."""
    from lookahead.graph.predictor import load_init

    cache = ContextCache(contexts_dir)
    refuse_choices_on_test(scoring, tokens_dir, cache)
    geo = None
    if "phase2" in models:  # the router's geometric features (the controls read none)
        tensors, _ = load_init(init_file)
        geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float())
    reports = {}
    unknown = set(models) - set(STAGES)
    if unknown:
        raise ValueError(f"no scoring for {sorted(unknown)}: the stages scored are {', '.join(STAGES)}")
    for stage in (s for s in STAGES if s in models):
        per_seed = training[stage]["per_seed"]
        runs = []
        for i, model_dir in enumerate(tqdm(seed_dirs(*models[stage], len(per_seed)), desc=f"score {stage}",
                                           unit="seed")):
            if stage == "phase2":
                model, cfg, sampler = load_phase2_model(model_dir, base_dir, predictor_file, diffusion_dir)
                module = Phase2Module(model, cache, geo, dataclasses.replace(cfg, refresh_every=0), sampler)
            else:
                lm, cfg, mask = control_model(model_dir, stage, static_dir)
                module = ControlModule(lm, cache, cfg, mask=mask)
            require(cfg.seeds == len(per_seed), "seeds", f"{model_dir} was trained over {cfg.seeds} seeds, its training "
                    f"report holds {len(per_seed)}: rerun `dvc repro {stage}`")
            device = resolve_device(cfg.train.device, "phase2.train.device")
            module.place(device)
            module.model.to(device)
            batches = final_batches(cfg, scoring, tokens_dir, cache, device)
            label = final_label(cfg, scoring, tokens_dir, cache)
            score = score_phase2 if stage == "phase2" else score_control
            runs.append(score(per_seed[i], module, batches, label))
        shared = {}
        if stage == "control":
            base = ControlModule(base_lm(base_dir), cache, cfg)
            base.place(device)
            base.model.to(device)
            shared[BASE_KEY] = base.score(base.model, batches)["dense"]
        save_seed_scores((scores_files or {}).get(stage), runs, shared)
        seeded = {"phase2": SEEDED, "control": CONTROL_SEEDED, "static_control": STATIC_SEEDED}[stage]
        reports[stage] = with_spread(runs[0], runs[1:], seeded)
        if shared:
            reports[stage]["base_nll"] = float(np.mean(shared[BASE_KEY]))
    return reports

