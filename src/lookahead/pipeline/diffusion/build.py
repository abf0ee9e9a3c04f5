"""The diffusion stage (docs/pipeline.md): train the diffusion head on the pairs through the
shared loop, then judge it.

Data: every pair is (the router's inputs at its position — ``predictor.input``, the lookahead
contract's, so every decoder reads what the router reads — the token's geometric features, the
topology's allowed-edge bits). On the pairs stage's ε-good sets (``pairs.target: eps_good``) the
val windows' sets are held out, an autoregressive decoder is trained beside the diffusion head, and
every decoder is judged against its nulls (:mod:`lookahead.pipeline.diffusion.decoders`). On
``beats_dense`` pairs a seeded ``heldout_fraction`` of the pair set's windows is held out and the
head is judged against the predictor's own sampler (:mod:`lookahead.pipeline.diffusion.evaluation`).
The periodic evaluation is the denoiser's BCE on held-out pairs at fixed noisy draws.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.pairs import PAIRS_FILE, PairSet, load_pairs
from lookahead.core.config import to_dict
from lookahead.core.inputs import read_safetensors
from lookahead.core.intervals import SE, claim_keys
from lookahead.core.seeds import over_seeds, seeded_headline
from lookahead.graph.denoiser import Denoiser, save_denoiser
from lookahead.graph.predictor import load_init
from lookahead.graph.scoring import GeoLookup
from lookahead.pipeline.diffusion.config import DiffusionConfig
from lookahead.pipeline.diffusion.decoders import FIGURES, SAMPLERS
from lookahead.pipeline.diffusion.judge import DECODER_CLAIMS, decoder_claims, judge_keep_sets, judge_samplers
from lookahead.pipeline.diffusion.module import DiffusionDataError, DiffusionModule, PairFeatures, input_scale
from lookahead.train.checkpoints import checkpoint_dir
from lookahead.train.loop import TrainResult, train


def edge_marginals(pairs: PairSet) -> torch.Tensor:
    """m_e: the share of training pairs with edge e on. (E,)"""
    return pairs.edges[pairs.train].float().mean(0)


def build_model(cfg: DiffusionConfig, pairs: PairSet, features: PairFeatures, geo_dim: int) -> Denoiser:
    torch.manual_seed(cfg.train.seed)
    model = Denoiser(cfg.denoiser, pairs.info["n_layers"], pairs.info["n_heads"], features.dim, geo_dim,
                     edge_marginals(pairs))
    shift, scale = input_scale(features(pairs.rows[pairs.train], pairs.split[pairs.train])[0])
    model.context_shift.copy_(shift)
    model.context_scale.copy_(scale)
    return model


def train_diffusion(cfg: DiffusionConfig, cache: ContextCache, geo: GeoLookup, pairs_dir, checkpoint_dir=None,
                    tracker=None, kind: str = "cache", lm=None) -> tuple[DiffusionModule, TrainResult]:
    """Train the denoiser on the training pairs; return the module (its ``model`` trained) and the
    curves. ``geo`` is the init stage's table; the head is conditioned on it when ``cfg.geo_features``;
    ``kind`` and ``lm``: the router inputs it reads (:class:`PairFeatures`)."""
    pairs = load_pairs(pairs_dir, cache.context_length, cfg.heldout_fraction, cfg.seed)
    if pairs.info["encoder"] != cache.meta["encoder"]:
        raise DiffusionDataError(f"the pairs were made with contexts of {pairs.info['encoder']!r} but the cache holds "
                                 f"{cache.meta['encoder']!r}: rerun `dvc repro pairs`")
    if len(pairs.train) == 0 or len(pairs.heldout) == 0:
        raise DiffusionDataError(f"{pairs_dir}: {len(pairs.train)} training and {len(pairs.heldout)} held-out pairs "
                                 "after the split; the stage needs both (raise pairs.sequences)")
    geo = geo if cfg.geo_features else None
    features = PairFeatures(cache, geo, kind, lm)
    model = build_model(cfg, pairs, features, geo.table.shape[1] + 1 if geo is not None else 0)
    module = DiffusionModule(model, pairs, features, cfg)
    result = train(module, cfg.train, stage="diffusion", checkpoint_dir=checkpoint_dir, tracker=tracker)
    return module, result


def save(module: DiffusionModule, out_dir, kind: str = "cache") -> None:
    """The denoiser with what its users need to feed and read it: the router input kind it reads and,
    for keep-set pairs, the heads kept per token (samples are brought to that budget)."""
    save_denoiser(module.model.cpu(), out_dir, extra={"encoder": module.pairs.info["encoder"], "input": kind,
                                                      "heads_kept": module.pairs.info.get("heads_kept"),
                                                      "diffusion": to_dict(module.cfg)})


# metrics/diffusion.json (lookahead.core.report) on beats_dense pairs: the figures against the predictor's sampler
# and their spread over training and sampling seeds (lookahead.core.seeds)
SEEDED = ("sample_nll", "best_of_k_nll", "baseline_sample_nll", "baseline_best_of_k_nll", "density",
          "within_context_hamming", "across_context_hamming", "mode_recall", "baseline_mode_recall")
HEADLINE = seeded_headline(("sample_nll", "best_of_k_nll", "baseline_sample_nll", "baseline_best_of_k_nll",
                            "deterministic_nll", "dense_nll", "density", "pairs_density", "within_context_hamming",
                            "across_context_hamming", "mode_recall", "baseline_mode_recall"), SEEDED)

# on eps_good pairs (issue: a structure decoder that captures several good topologies): the diffusion head's
# figures, the MLP sampler's (baseline_), the autoregressive decoder's and the frequency-matched null's; every
# sampler's figures are in the report as <sampler>_<figure> (lookahead.pipeline.diffusion.decoders)
KEEPSET_SEEDED = (*(f"{name}_{fig}" for name in SAMPLERS for fig in FIGURES), "recall_at_1", "recall_at_4",
                  "recall_at_8", "baseline_recall_at_1", "baseline_recall_at_4", "baseline_recall_at_8",
                  "sample_nll", "best_of_k_label_free_nll", "null_frequency_best_of_k_nll")
KEEPSET_HEADLINE = seeded_headline(
    ("eps_good_per_position", "eps_good_multi_share", "recall_at_8", "sample_nll", "deterministic_nll",
     "best_of_k_label_free_nll", "null_frequency_best_of_k_nll", "autoregressive_best_of_k_label_free_nll"),
    KEEPSET_SEEDED + ("autoregressive_best_of_k_label_free_nll",)) + (
    *[k for name, _, _ in DECODER_CLAIMS for k in claim_keys(name) if not k.endswith(SE)], "window_set")
"""On the pairs' val windows of the context cache (their ε-good keep sets): ``window_set``; the
decoders' paired claims with their intervals, windows and seeds combined (:func:`decoder_claims`).
Within 400 characters of `dvc metrics show`, so recall@1 and @4 and the other samplers' recall@8
(what the claims compare with) are in the report, with their ``_sd``."""


def headline(pairs_dir) -> tuple[str, ...]:
    """The headline keys of ``metrics/diffusion.json`` for the pairs' target."""
    info, _ = read_safetensors(Path(pairs_dir) / PAIRS_FILE, "np", "lookahead", DiffusionDataError, "run `dvc repro pairs`")
    return KEEPSET_HEADLINE if info.get("target") == "eps_good" else HEADLINE


def build_diffusion(cfg: DiffusionConfig, base_dir, contexts_dir, init_file, predictor_file, pairs_dir, out_dir,
                    checkpoint_root=None, tracker=None) -> tuple[dict, TrainResult, DiffusionModule]:
    """Train the diffusion head, write it to ``out_dir``, evaluate it; return (report, training
    result, module)."""
    from transformers import AutoModelForCausalLM

    from lookahead.core.devices import resolve_device
    from lookahead.graph.predictor import load_predictor
    from lookahead.graph.router_inputs import check_context_dim

    predictor, meta = load_predictor(predictor_file)  # checked before training: a mismatch fails early
    cache = ContextCache(contexts_dir)
    device = torch.device(resolve_device(cfg.train.device, "diffusion.train.device"))
    lm = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval().requires_grad_(False)
    check_context_dim(predictor, meta, cache.dim, lm, DiffusionDataError, predictor_file)
    tensors, _ = load_init(init_file)  # the predictor may take geometric features even when the head does not
    geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float())
    ckpt = checkpoint_dir(checkpoint_root, "diffusion", to_dict(cfg), [init_file, Path(pairs_dir) / PAIRS_FILE],
                          [cache.fingerprint()])
    kind = predictor.cfg.input
    module, result = train_diffusion(cfg, cache, geo, pairs_dir, ckpt, tracker, kind, lm)
    save(module, out_dir, kind)
    if module.pairs.info.get("target") == "eps_good":
        report = judge_keep_sets(cfg, module, predictor, meta, lm, cache, geo, device)
    else:
        report = judge_samplers(cfg, module, predictor, meta, lm, cache, geo, device, pairs_dir)
    report.update({
        "final_val_bce": module.last_eval.get("val_bce"),
        "final_val_bit_accuracy": module.last_eval.get("val_bit_accuracy"),
        "train_steps": cfg.train.steps,
        "train_graphs_per_s": result.tokens_per_s,
        "train_seconds": result.train_seconds,
        "parameters": sum(p.numel() for p in module.model.parameters()),
        "pairs_train": int(len(module.pairs.train)),
        "pairs_heldout": int(len(module.pairs.heldout)),
    })
    return report, result, module


def build_diffusion_seeds(cfg: DiffusionConfig, base_dir, contexts_dir, init_file, predictor_file, pairs_dir, out_dir,
                          checkpoint_root=None, tracker=None) -> tuple[dict, TrainResult, DiffusionModule]:
    """:func:`build_diffusion`, then ``cfg.seeds - 1`` more trainings on other seeds (their heads
    discarded): the report carries the seeded figures' mean and sd (lookahead.core.seeds)."""
    seeded = KEEPSET_SEEDED if headline(pairs_dir) is KEEPSET_HEADLINE else SEEDED
    return over_seeds(cfg, "diffusion", seeded, lambda c, scratch: build_diffusion(
        c, base_dir, contexts_dir, init_file, predictor_file, pairs_dir, scratch / "diffusion" if scratch else out_dir,
        checkpoint_root, None if scratch else tracker), gather=decoder_claims)
