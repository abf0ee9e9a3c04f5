"""The diffusion stage (DESIGN §2 diffusion, §7): train the diffusion head on the pairs through the
shared loop, then judge it against the predictor's own sampler (:mod:`lookahead.pipeline.diffusion.evaluation`).

Data: every pair is (the context embedding at its position, the token's geometric features, the
executed topology's allowed-edge bits). Pairs are split by window: a seeded ``heldout_fraction`` of
the pair set's windows is never trained on; the periodic evaluation is the denoiser's BCE on those
held-out pairs at fixed noisy draws, and mode recall is measured on them.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.pairs import PAIRS_FILE, PairSet, load_pairs
from lookahead.core.config import to_dict
from lookahead.core.errors import LookaheadError, require
from lookahead.core.inputs import recorded
from lookahead.core.seeds import over_seeds, seeded_headline
from lookahead.graph.denoiser import Denoiser, DenoiserConfig, alpha_bar, q_probs, save_denoiser
from lookahead.graph.predictor import load_init
from lookahead.graph.router_inputs import lm_states
from lookahead.graph.scoring import GeoLookup
from lookahead.train.checkpoints import checkpoint_dir
from lookahead.train.loop import TrainConfig, TrainResult, train


class DiffusionDataError(LookaheadError, ValueError):
    """Pairs, contexts or a predictor that do not fit the diffusion stage."""


@dataclasses.dataclass
class DiffusionConfig:
    """The diffusion head, its training and its evaluation (DESIGN §7)."""

    seeds: int = 3
    """Runs over seeds of training, hold-out split and evaluation samples, for each headline figure's mean and `_sd`
    (lookahead.core.seeds); the first, with the configured seeds, writes the outputs."""
    denoiser: DenoiserConfig = dataclasses.field(default_factory=DenoiserConfig)
    """Shape of the denoiser network."""
    geo_features: bool = True
    """Condition on the init stage's geometric embedding of the token (and a matched flag) too."""
    sample_steps: int = 10
    """Ancestral sampling steps from t = 1 to 0."""
    sample_temperature: float = 1.0
    """Divides the a_0 logits while sampling: < 1 trades diversity for samples nearer the mode."""
    eval_samples: int = 8
    """K: samples per position for best-of-K NLL, diversity and mode recall (both samplers)."""
    recall_radius: int = 1
    """A kept topology counts as recovered when a sample is within this Hamming distance (bits)."""
    heldout_fraction: float = 0.2
    """Share of the pair set's windows held out of training (mode recall and val BCE are measured on them)."""
    eval_sequences: int = 0
    """Val windows of the context cache for the LM NLL comparison (0 = all of them)."""
    eval_batch_size: int = 8
    """Windows per LM forward in evaluation."""
    val_pairs: int = 2048
    """Held-out pairs scored for the periodic val BCE (at most)."""
    seed: int = 0
    """Seed of the hold-out split and of the evaluation samples."""
    train: TrainConfig = dataclasses.field(default_factory=lambda: TrainConfig(
        steps=1500, batch_size=128, lr=2e-3, beta2=0.99, warmup_steps=50, weight_decay=0.0, eval_every=250,
        checkpoint_every=250))
    """Optimisation of the denoiser (batch_size = pairs per step)."""

    def __post_init__(self) -> None:
        require(self.seeds >= 1, "seeds", f"must be >= 1; got {self.seeds}")
        for name in ("sample_steps", "eval_samples", "eval_batch_size", "val_pairs"):
            require(getattr(self, name) >= 1, name, f"must be >= 1; got {getattr(self, name)}")
        require(math.isfinite(self.sample_temperature) and self.sample_temperature > 0, "sample_temperature",
                f"must be a finite number > 0; got {self.sample_temperature}")
        require(self.recall_radius >= 0, "recall_radius", f"must be >= 0; got {self.recall_radius}")
        require(math.isfinite(self.heldout_fraction) and 0 < self.heldout_fraction < 1, "heldout_fraction",
                f"must be in (0, 1); got {self.heldout_fraction}")
        require(self.eval_sequences >= 0, "eval_sequences", f"must be >= 0 (0 = all); got {self.eval_sequences}")
        require(self.seed >= 0, "seed", f"must be >= 0; got {self.seed}")


class PairFeatures:
    """Conditioning of pairs: context embedding and geometric features at each pair's position."""

    def __init__(self, cache: ContextCache, geo: GeoLookup | None):
        self.cache, self.geo = cache, geo
        self.t_len = cache.context_length

    def __call__(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(contexts (P, C) float32, geo (P, G) or None) of cache rows (window · T + position)."""
        w, p = rows // self.t_len, rows % self.t_len
        order = np.argsort(w, kind="stable")  # memory-mapped reads in file order
        contexts = np.empty((len(rows), self.cache.dim), dtype=np.float32)
        contexts[order] = self.cache.contexts("train")[w[order], p[order]]
        ids = torch.from_numpy(self.cache.windows("train")[w, p].astype(np.int64))
        return torch.from_numpy(contexts), (self.geo(ids) if self.geo is not None else None)

    def router(self, rows: np.ndarray, kind: str, lm) -> torch.Tensor:
        """The predictor's own context features (``predictor.input`` ``lm`` or ``embedding``) at cache
        rows: the LM's states over each row's train window, read at its position. (P, C')"""
        w, p = rows // self.t_len, rows % self.t_len
        windows, inverse = np.unique(w, return_inverse=True)
        device = next(lm.parameters()).device
        ids = torch.from_numpy(self.cache.windows("train")[windows][:, :-1].astype(np.int64)).to(device)
        states = lm_states(lm, ids, kind)  # (W, T, C')
        return states[torch.from_numpy(inverse).to(device), torch.from_numpy(p).to(device)].cpu()


class DiffusionModule:
    """The stage's step object for :func:`lookahead.train.loop.train`: the denoiser learns a_0 from a_t."""

    def __init__(self, model: Denoiser, pairs: PairSet, features: PairFeatures, cfg: DiffusionConfig):
        self.model, self.pairs, self.features, self.cfg = model, pairs, features, cfg
        self.device = torch.device("cpu")
        n_val = min(cfg.val_pairs, len(pairs.heldout))
        pick = np.sort(np.random.default_rng([cfg.seed, 71]).choice(pairs.heldout, n_val, replace=False))
        # fixed noisy draws of the held-out pairs: the val BCE compares like with like across steps
        self.val = self._noised(pick, np.random.default_rng([cfg.seed, 72]))
        self.last_eval: dict = {}

    def place(self, device) -> None:
        self.device = torch.device(device)

    def _noised(self, idx: np.ndarray, rng: np.random.Generator) -> dict:
        a0 = self.pairs.edges[idx].float()
        t = torch.from_numpy(1.0 - rng.random(len(idx))).float()  # (0, 1]
        u = torch.from_numpy(rng.random(a0.shape, dtype=np.float32))
        probs = q_probs(a0, alpha_bar(t, self.model.cfg.schedule_offset)[:, None], self.model.marginal.cpu())
        contexts, geo = self.features(self.pairs.rows[idx])
        batch = {"a0": a0, "a_t": (u < probs).float(), "t": t, "contexts": contexts}
        if geo is not None:
            batch["geo"] = geo
        return batch

    def batch(self, step: int) -> dict:
        t = self.cfg.train
        rng = np.random.default_rng([t.seed, step, 80])
        return self._noised(rng.choice(self.pairs.train, t.batch_size), rng)

    def loss(self, model, batch: dict) -> torch.Tensor:
        logits = model(batch["a_t"], batch["t"], batch["contexts"], batch.get("geo"))
        return F.binary_cross_entropy_with_logits(logits, batch["a0"])

    def tokens(self, batch: dict) -> int:
        return batch["a0"].shape[0]  # graphs

    @torch.no_grad()
    def evaluate(self, model) -> dict[str, float]:
        """BCE of the a_0 logits on the fixed noisy draws of held-out pairs, and bit accuracy."""
        total, correct, count = 0.0, 0.0, 0
        rows = self.val["a0"].shape[0]
        for start in range(0, rows, 512):
            part = {k: v[start : start + 512].to(self.device) for k, v in self.val.items()}
            logits = model(part["a_t"], part["t"], part["contexts"], part.get("geo")).float()
            total += F.binary_cross_entropy_with_logits(logits, part["a0"], reduction="sum").item()
            correct += ((logits > 0).float() == part["a0"]).sum().item()
            count += part["a0"].numel()
        self.last_eval = {"val_bce": total / count, "val_bit_accuracy": correct / count}
        return self.last_eval


def edge_marginals(pairs: PairSet) -> torch.Tensor:
    """m_e: the share of training pairs with edge e on. (E,)"""
    return pairs.edges[pairs.train].float().mean(0)


def build_model(cfg: DiffusionConfig, pairs: PairSet, context_dim: int, geo_dim: int) -> Denoiser:
    torch.manual_seed(cfg.train.seed)
    return Denoiser(cfg.denoiser, pairs.info["n_layers"], pairs.info["n_heads"], context_dim, geo_dim,
                    edge_marginals(pairs))


def train_diffusion(cfg: DiffusionConfig, cache: ContextCache, geo: GeoLookup, pairs_dir, checkpoint_dir=None,
                    tracker=None) -> tuple[DiffusionModule, TrainResult]:
    """Train the denoiser on the training pairs; return the module (its ``model`` trained) and the
    curves. ``geo`` is the init stage's table; the head is conditioned on it when ``cfg.geo_features``."""
    pairs = load_pairs(pairs_dir, cache.context_length, cfg.heldout_fraction, cfg.seed)
    if pairs.info["encoder"] != cache.meta["encoder"]:
        raise DiffusionDataError(f"the pairs were made with contexts of {pairs.info['encoder']!r} but the cache holds "
                                 f"{cache.meta['encoder']!r}: rerun `dvc repro pairs`")
    if len(pairs.train) == 0 or len(pairs.heldout) == 0:
        raise DiffusionDataError(f"{pairs_dir}: {len(pairs.train)} training and {len(pairs.heldout)} held-out pairs "
                                 "after the split; the stage needs both (raise pairs.sequences)")
    geo = geo if cfg.geo_features else None
    model = build_model(cfg, pairs, cache.dim, geo.table.shape[1] + 1 if geo is not None else 0)
    module = DiffusionModule(model, pairs, PairFeatures(cache, geo), cfg)
    result = train(module, cfg.train, stage="diffusion", checkpoint_dir=checkpoint_dir, tracker=tracker)
    return module, result


def save(module: DiffusionModule, out_dir) -> None:
    save_denoiser(module.model.cpu(), out_dir, extra={"encoder": module.pairs.info["encoder"],
                                                      "diffusion": to_dict(module.cfg)})


# metrics/diffusion.json (lookahead.core.report): the headline keys
# and their spread over training and sampling seeds (lookahead.core.seeds)
SEEDED = ("sample_nll", "best_of_k_nll", "baseline_sample_nll", "baseline_best_of_k_nll", "density",
          "within_context_hamming", "across_context_hamming", "mode_recall", "baseline_mode_recall")
HEADLINE = seeded_headline(("sample_nll", "best_of_k_nll", "baseline_sample_nll", "baseline_best_of_k_nll",
                            "deterministic_nll", "dense_nll", "density", "pairs_density", "within_context_hamming",
                            "across_context_hamming", "mode_recall", "baseline_mode_recall"), SEEDED)


def build_diffusion(cfg: DiffusionConfig, base_dir, contexts_dir, init_file, predictor_file, pairs_dir, out_dir,
                    checkpoint_root=None, tracker=None) -> tuple[dict, TrainResult, DiffusionModule]:
    """Train the diffusion head, write it to ``out_dir``, evaluate both samplers; return (report,
    training result, module)."""
    from transformers import AutoModelForCausalLM

    from lookahead.core.devices import resolve_device
    from lookahead.graph.predictor import load_predictor
    from lookahead.graph.router_inputs import check_context_dim
    from lookahead.graph.runtime import recorded_skip
    from lookahead.pipeline.diffusion.evaluation import lm_comparison, make_samplers, mode_recall

    predictor, meta = load_predictor(predictor_file)  # checked before training: a mismatch fails early
    cache = ContextCache(contexts_dir)
    device = torch.device(resolve_device(cfg.train.device, "diffusion.train.device"))
    lm = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval().requires_grad_(False)
    check_context_dim(predictor, meta, cache.dim, lm, DiffusionDataError, predictor_file)
    tensors, _ = load_init(init_file)  # the predictor may take geometric features even when the head does not
    geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float())
    ckpt = checkpoint_dir(checkpoint_root, "diffusion", to_dict(cfg), [init_file, Path(pairs_dir) / PAIRS_FILE],
                          [cache.fingerprint()])
    module, result = train_diffusion(cfg, cache, geo, pairs_dir, ckpt, tracker)
    save(module, out_dir)

    lm.to(device)
    denoiser = module.model.to(device).eval()
    predictor.to(device).eval()
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    flip_prob = float(recorded(module.pairs.info, "config", "flip_prob", stage="pairs", source=pairs_dir))
    samplers = make_samplers(denoiser, predictor, cfg.sample_steps, cfg.sample_temperature, flip_prob, generator)
    skip = recorded_skip(meta)
    lm_figures = lm_comparison(lm, predictor, samplers, cache, geo.to(device), cfg.eval_samples, cfg.eval_sequences,
                               cfg.eval_batch_size, device, cfg.seed, skip)
    pair_features = PairFeatures(cache, geo)
    router = None if predictor.cfg.input == "cache" else (lambda rows: pair_features.router(rows, predictor.cfg.input, lm))
    recall = mode_recall(samplers, predictor, module.pairs, pair_features, cfg.eval_samples,
                         cfg.recall_radius, device, router_features=router)
    pairs = module.pairs
    diff, base = lm_figures["diffusion"], lm_figures["baseline"]
    report = {
        "sample_nll": diff["sample_nll"],
        "best_of_k_nll": diff["best_of_k_nll"],
        "baseline_sample_nll": base["sample_nll"],
        "baseline_best_of_k_nll": base["best_of_k_nll"],
        "deterministic_nll": lm_figures["deterministic_nll"],
        "dense_nll": lm_figures["dense_nll"],
        "density": diff["density"],
        "pairs_density": float(pairs.edge_fraction.mean()),
        "within_context_hamming": diff["within_context_hamming"],
        "across_context_hamming": diff["across_context_hamming"],
        "mode_recall": recall["diffusion"]["mode_recall"],
        "baseline_mode_recall": recall["baseline"]["mode_recall"],
        "samples_per_s": samplers["diffusion"].graphs / max(samplers["diffusion"].seconds, 1e-9),
        "active_head_fraction": diff["active_head_fraction"],
        "pairs_active_head_fraction": float(pairs.head_fraction.mean()),
        "deterministic_active_head_fraction": lm_figures["deterministic_active_head_fraction"],
        "eval_samples": cfg.eval_samples,
        "recall_radius": cfg.recall_radius,
        "samplers": {name: {**lm_figures[name], **recall[name],
                            "samples_per_s": s.graphs / max(s.seconds, 1e-9)} for name, s in samplers.items()},
        "recall_positions": recall["positions"],
        "recall_topologies": recall["topologies"],
        "val_positions": lm_figures["positions"],
        "pairs_train": int(len(pairs.train)),
        "pairs_heldout": int(len(pairs.heldout)),
        "explore_flip_prob": flip_prob,
        "final_val_bce": module.last_eval.get("val_bce"),
        "final_val_bit_accuracy": module.last_eval.get("val_bit_accuracy"),
        "train_steps": cfg.train.steps,
        "train_graphs_per_s": result.tokens_per_s,
        "train_seconds": result.train_seconds,
        "parameters": sum(p.numel() for p in module.model.parameters()),
    }
    return report, result, module


def build_diffusion_seeds(cfg: DiffusionConfig, base_dir, contexts_dir, init_file, predictor_file, pairs_dir, out_dir,
                          checkpoint_root=None, tracker=None) -> tuple[dict, TrainResult, DiffusionModule]:
    """:func:`build_diffusion`, then ``cfg.seeds - 1`` more trainings on other seeds (their heads
    discarded): the report carries the :data:`SEEDED` figures' mean and sd (lookahead.core.seeds)."""
    return over_seeds(cfg, "diffusion", SEEDED, lambda c, scratch: build_diffusion(
        c, base_dir, contexts_dir, init_file, predictor_file, pairs_dir, scratch / "diffusion" if scratch else out_dir,
        checkpoint_root, None if scratch else tracker))
