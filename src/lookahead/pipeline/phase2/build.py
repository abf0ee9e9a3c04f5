"""Phase 2 (docs/pipeline.md): continued pretraining of the base LM, unfrozen, with per-token
topologies; its two controls (the ``control`` and ``static_control`` stages) are
:mod:`lookahead.pipeline.phase2.control`.

``decoder: mlp`` — the phase-1 predictor routes: with ``predictor_lr_scale`` > 0 it keeps training
jointly with the LM under phase 1's loss (NLL(A) + lambda_head · mean gate + lambda_edge · mean edge
weight, τ annealed, straight-through hard from ``hard_from_step``); with 0 (the default) it stays the
router phase 1 distilled, and only the LM learns to run under it. ``shared_heads`` makes the S most
important heads run at every token (the router fills the rest of its budget). ``decoder:
diffusion`` — every position's topology is a sample of the frozen diffusion head (a new one each
step) and only the LM trains.

Data (``windows``): ``stream`` (default) — every step draws fresh windows of the whole train
stream, drawn like the base's batches, and the router computes its inputs online from the LM being
trained (``predictor.input: lm | embedding``: the LM's own states under the lookahead contract).
``cache`` — the context cache's train windows (the slow path, for routers that read the cache's
MiniLM / HF encodings and for decoder diffusion): the cache is small (128 windows at the default:
MiniLM encodes ~140 positions/s on 2 cores) and a few passes over it overfit the LM (the control's
val NLL rose from 4.39 to 5.50 in 12.5 passes), which ``replay`` offsets: each step also trains on
as many windows of the whole stream, dense, in every run. The loss is the windows' loss ((1 − w) NLL
+ w KL from the frozen dense base with ``distill`` = w), averaged with the replay windows' NLL, plus
the sparsity terms. The controls (:mod:`lookahead.pipeline.phase2.control`) draw the same windows.
Evaluation: the cache's val windows (the positions every stage reports on).

The predictor trains faster than the LM (phase 1 used lr 3e-2; continued pretraining wants ~1e-3):
its parameters are stored as θ = p / c with ``c = predictor_lr_scale`` (``torch.nn.utils.parametrize``)
so that one AdamW over both gives the predictor steps c times the LM's (Adam's step on θ is about lr
whatever the gradient's scale). The saved predictor holds the plain p.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.phase2 import CONFIG_FILE, LM_DIR, PREDICTOR_FILE
from lookahead.core.config import to_dict
from lookahead.core.seeds import kept_seeds, over_seeds
from lookahead.core.windows import set_label
from lookahead.graph.connectivity import CONNECTIVITY_FILE, save_connectivity
from lookahead.graph.router_inputs import check_context_dim
from lookahead.graph.runtime import meta_runtime, recorded_skip, recorded_unit
from lookahead.graph.scoring import GeoLookup
from lookahead.lm.adapters import VALUE_RESIDUAL_FILE, OutputLoRA, save_value_residual
from lookahead.pipeline.phase2.common import Phase2Error, base_lm, data_report, decoder_sampler
from lookahead.pipeline.phase2.common import load_train_stream, val_batches
from lookahead.pipeline.phase2.common import save_lm, teacher_lm
from lookahead.pipeline.phase2.config import Phase2Config
from lookahead.pipeline.phase2.model import (Phase2Model, added_parameters, additions, connectivity_weights,
                                             plain_parameters, scale_learning_rate, share_heads)
from lookahead.pipeline.phase2.module import Phase2Module
from lookahead.pipeline.phase2.plots import plot_connectivity
from lookahead.train.checkpoints import checkpoint_dir
from lookahead.train.loop import TrainResult, train


CONNECTIVITY_FIGURE = "connectivity.png"  # in the stage's output: the learned edge weights (connectivity on)


def train_phase2(cfg: Phase2Config, base_dir, tokens_dir, contexts_dir, init_file, predictor_file, diffusion_dir, out_dir,
                 checkpoint_root=None, tracker=None, heads_file=None) -> tuple[dict, TrainResult, Phase2Module]:
    """Train the phase-2 LM with its decoder; write the LM (and the predictor) to ``out_dir``;
    return (the training figures, the training result, the module). ``heads_file``: the probe's head
    importance (``shared_heads`` picks the most important). What the trained model scores on the
    scoring windows is :func:`lookahead.pipeline.phase2.score.score_phase2`'s."""
    from lookahead.core.atomic import atomic_dir
    from lookahead.graph.predictor import load_init, load_predictor, save_predictor

    cache = ContextCache(contexts_dir)
    tensors, _ = load_init(init_file)
    geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float())
    predictor, meta = load_predictor(predictor_file)
    sampler = decoder_sampler(cfg.decoder, diffusion_dir, predictor.cfg.gate)

    torch.manual_seed(cfg.train.seed)
    lm = base_lm(base_dir, meta["n_layers"], meta["n_heads"], f"predictor {predictor_file}", recorded_unit(meta))
    check_context_dim(predictor, meta, cache.dim, lm, Phase2Error, predictor_file)
    if cfg.windows == "stream" and predictor.cfg.input == "cache":
        raise Phase2Error(f"phase2.windows: stream needs a router that computes its inputs online, but {predictor_file} "
                          "reads the context cache (predictor.input: cache): set phase2.windows: cache, or "
                          "predictor.input: lm and rerun `dvc repro phase1`")
    if cfg.budget_warmup and (sampler is not None or predictor.cfg.gate != "head" or predictor.cfg.budget == "none"):
        raise Phase2Error(f"phase2.budget_warmup anneals a top-K budget: {predictor_file} has gate "
                          f"{predictor.cfg.gate}, budget {predictor.cfg.budget} (decoder {cfg.decoder}): set budget_warmup: 0")
    if cfg.refresh_every and (sampler is not None or predictor.cfg.gate != "head" or predictor.cfg.budget != "topk"
                              or predictor.cfg.input not in ("lm", "embedding")):
        raise Phase2Error(f"phase2.refresh_every distils the greedy oracle's global top-K into a router that reads "
                          f"the LM's states: {predictor_file} has gate {predictor.cfg.gate}, budget "
                          f"{predictor.cfg.budget}, input {predictor.cfg.input}: set refresh_every: 0")
    if cfg.shared_heads:
        share_heads(predictor, cfg.shared_heads, heads_file, predictor_file)
    if cfg.gate_weights != "binary":
        if sampler is not None or predictor.cfg.gate != "head" or predictor.cfg.budget == "none":
            raise Phase2Error(f"phase2.gate_weights: {cfg.gate_weights} weighs a top-K router's kept heads: {predictor_file} "
                              f"has gate {predictor.cfg.gate}, budget {predictor.cfg.budget} (decoder {cfg.decoder})")
        predictor.cfg = dataclasses.replace(predictor.cfg, weights=cfg.gate_weights)
    if cfg.keep is not None:
        if sampler is not None or predictor.cfg.gate != "head" or predictor.cfg.budget == "none":
            raise Phase2Error(f"phase2.keep sets a top-K router's budget: {predictor_file} has gate {predictor.cfg.gate}, "
                              f"budget {predictor.cfg.budget} (decoder {cfg.decoder}): set keep: null")
        predictor.cfg = dataclasses.replace(predictor.cfg, keep=cfg.keep)
    if sampler is not None:
        predictor = None
    if predictor is not None:
        predictor.train()
        if cfg.predictor_lr_scale == 0:
            predictor.requires_grad_(False)  # the phase-1 router, frozen
        else:
            scale_learning_rate(predictor, cfg.predictor_lr_scale)
    stream = load_train_stream(cfg, tokens_dir)
    model = Phase2Model(lm, predictor, recorded_skip(meta), **additions(cfg, lm, predictor, meta, predictor_file, base_dir))
    module = Phase2Module(model, cache, geo, cfg, sampler, stream=stream, teacher=teacher_lm(cfg, base_dir))
    files = [Path(init_file), Path(predictor_file), Path(base_dir) / "model.safetensors"]
    files += [Path(heads_file)] if cfg.shared_heads else []
    files += [Path(tokens_dir) / "train.npy"] if stream is not None else []
    files += [sampler.weights] if sampler is not None else []
    ckpt = checkpoint_dir(checkpoint_root, "phase2", to_dict(cfg), files, [cache.fingerprint()])

    start = module.evaluate(module.model)  # the starting point: the base LM under the phase-1 decoder
    result = train(module, cfg.train, stage="phase2", checkpoint_dir=ckpt, tracker=tracker)
    result.eval_curve.insert(0, {"step": 0, **start})
    final = module.last_eval
    config = {"phase2": to_dict(cfg), "decoder": cfg.decoder, "n_layers": meta["n_layers"], "n_heads": meta["n_heads"],
              "encoder": cache.meta["encoder"], "skip": recorded_skip(meta),
              "active_head_fraction": final["active_head_fraction"]}  # what the static control prunes to
    config.update(keep=cfg.keep, connectivity=cfg.connectivity, value_residual=cfg.value_residual, adapter=cfg.adapter,
                  train_lm=cfg.train_lm, added_parameters=added_parameters(module.model))
    with atomic_dir(out_dir) as tmp:
        if module.model.connectivity is not None:  # drawn on the periodic evaluation's windows (the cache's val)
            weights = connectivity_weights(module.model, list(val_batches(cache, module.val_rows, cfg.eval_batch_size,
                                                                          module.device)))
            save_connectivity(module.model.connectivity.cpu(), tmp / CONNECTIVITY_FILE)
            plot_connectivity(*weights, meta["n_layers"], meta["n_heads"], tmp / CONNECTIVITY_FIGURE,
                              f"phase 2, connectivity {cfg.connectivity}, keep {predictor.cfg.keep}: learned edge weights "
                              f"(1 = the plain residual stream), seed {cfg.train.seed}")
        if module.model.lora is not None:
            OutputLoRA.merge(module.model.lm)  # the saved LM carries its adapter
        save_lm(module.model.lm.cpu(), base_dir, tmp / LM_DIR, config)
        if module.model.value_residual is not None:
            save_value_residual(module.model.value_residual.cpu(), tmp / VALUE_RESIDUAL_FILE)
        if predictor is not None:
            trained = module.model.predictor.cpu()
            plain_parameters(trained)
            save_predictor(trained, tmp / PREDICTOR_FILE, extra={"phase2": to_dict(cfg), "encoder": cache.meta["encoder"],
                                                                 "runtime": meta_runtime(meta)})
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    training = {
        "decoder": cfg.decoder,
        "base_val_nll": start["dense_nll"],
        "start_hard_nll": start["hard_nll"],
        "start_active_head_fraction": start["active_head_fraction"],
        "soft_nll": final.get("soft_nll"),
        "active_head_fraction": final["active_head_fraction"],
        "router": str(predictor_file),
        "added_parameters": config["added_parameters"],
        "parameters_added": sum(config["added_parameters"][k] for k in ("connectivity", "value_residual", "adapter")),
        "cache_val": {"window_set": set_label("cache-val", cache.windows("val")[module.val_rows]),
                      **{k: final[k] for k in ("dense_nll", "hard_nll", "active_head_fraction")}},
        **data_report(cfg, cache, module.val_rows, result, len(stream) if stream is not None else 0),
        **(module.refresher.report() if module.refresher is not None else {}),
    }
    return training, result, module


def train_phase2_seeds(cfg: Phase2Config, base_dir, tokens_dir, contexts_dir, init_file, predictor_file, diffusion_dir,
                       out_dir, seeds_dir, checkpoint_root=None, tracker=None, heads_file=None, predictor_seeds=None
                       ) -> tuple[dict, TrainResult]:
    """The ``phase2`` stage: :func:`train_phase2` over ``cfg.seeds`` seeds. Seed 0's model goes to
    ``out_dir``, seed i's to ``seeds_dir``/``seed<i>`` (:func:`lookahead.core.seeds.kept_seeds`): what
    the ``score_phase2`` stage reads. ``predictor_seeds``: phase 1's other seeds' routers (a directory
    of ``predictor_seed<i>.safetensors``): seed i of phase 2 starts from seed i of phase 1, so that
    the claims' intervals cover the router's own seed variance (None: every seed from
    ``predictor_file``). Returns (the training report: every seed's figures in ``per_seed``, the
    primary's training result)."""
    files = seed_routers(cfg, predictor_file, predictor_seeds)
    runs: list[dict] = []

    def run(c: Phase2Config, scratch: Path | None) -> tuple[dict, TrainResult]:
        offset = c.train.seed - cfg.train.seed
        training, result, _ = train_phase2(c, base_dir, tokens_dir, contexts_dir, init_file, files[offset], diffusion_dir,
                                           seed_out(offset, scratch / "phase2") if scratch else out_dir,
                                           checkpoint_root, None if scratch else tracker, heads_file)
        runs.append(training)
        return training, result

    with kept_seeds(seeds_dir) as seed_out:
        _, result = over_seeds(cfg, "phase2", (), run)
    return {"seeds": len(runs), "per_seed": runs}, result


def seed_routers(cfg: Phase2Config, predictor_file, predictor_seeds) -> list[Path]:
    """Phase 1's router for each of phase 2's seeds (checked before any work): seed 0 the primary,
    seed i phase 1's seed i from ``predictor_seeds``."""
    from lookahead.graph.predictor import seed_router_name

    files = [Path(predictor_file)]
    for i in range(1, cfg.seeds):
        files.append(Path(predictor_file) if predictor_seeds is None else Path(predictor_seeds) / seed_router_name(i))
        if not files[-1].is_file() and (cfg.decoder == "mlp" or predictor_seeds is None):
            raise Phase2Error(f"phase2.seeds is {cfg.seeds}, but phase 1's router of seed {i} ({files[-1]}) is missing: "
                              "set phase1.seeds >= phase2.seeds and rerun `dvc repro phase1`")
    return files


