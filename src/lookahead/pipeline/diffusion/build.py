"""The diffusion stage (DESIGN §2 diffusion, §7): train the diffusion head on the pairs through the
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

import dataclasses
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.pairs import PAIRS_FILE, PairSet, load_pairs
from lookahead.core.windows import set_label
from lookahead.core.config import to_dict
from lookahead.core.errors import LookaheadError, require
from lookahead.core.inputs import read_safetensors, recorded
from lookahead.core.seeds import over_seeds, seeded_headline
from lookahead.graph.denoiser import Denoiser, DenoiserConfig, alpha_bar, q_probs, save_denoiser
from lookahead.graph.nodes import allowed_mask
from lookahead.graph.predictor import load_init
from lookahead.pipeline.diffusion.decoders import FIGURES, SAMPLERS
from lookahead.graph.router_inputs import input_dim, lm_states
from lookahead.graph.scoring import GeoLookup
from lookahead.train.checkpoints import checkpoint_dir
from lookahead.train.loop import TrainConfig, TrainResult, train


SPLITS = ("train", "val")  # a pair's split (lookahead.artifacts.pairs) → the context cache's


class DiffusionDataError(LookaheadError, ValueError):
    """Pairs, contexts or a predictor that do not fit the diffusion stage."""


@dataclasses.dataclass
class AutoregressiveConfig:
    """The autoregressive keep-set decoder (:class:`lookahead.graph.keepsets.KeepSetAR`), trained on
    ε-good pairs only."""

    steps: int = 600
    """Adam steps (maximum likelihood of the train windows' ε-good sets)."""
    batch_size: int = 256
    """Pairs per step."""
    lr: float = 3e-3
    """Peak learning rate (cosine decay to a tenth)."""
    hidden: int = 128
    """Width of the MLP from the inputs to the per-head logits."""
    temperature: float = 0.5
    """Divides every decision's logit while sampling (< 1: nearer the mode; 1 = the model)."""
    router_logits: bool = False
    """Stack it on the phase-1 router: its keep logits (a function of the same inputs) are an input
    and a prior added to its own logits, with a learned weight per head."""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "hidden"):
            require(getattr(self, name) >= 1, name, f"must be >= 1; got {getattr(self, name)}")
        for name in ("lr", "temperature"):
            value = getattr(self, name)
            require(math.isfinite(value) and value > 0, name, f"must be a finite number > 0; got {value}")


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
    sample_temperature: float = 0.5
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
    autoregressive: AutoregressiveConfig = dataclasses.field(default_factory=AutoregressiveConfig)
    """The autoregressive decoder judged beside the diffusion head (ε-good pairs)."""
    baseline_noise: float = 0.5
    """ε-good pairs: scale of the logistic noise on the MLP router's keep logits in its sampler (top-K
    of logits + noise; 1 = the phase-1 sampler's)."""
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
        require(math.isfinite(self.baseline_noise) and self.baseline_noise > 0, "baseline_noise",
                f"must be a finite number > 0; got {self.baseline_noise}")
        require(self.recall_radius >= 0, "recall_radius", f"must be >= 0; got {self.recall_radius}")
        require(math.isfinite(self.heldout_fraction) and 0 < self.heldout_fraction < 1, "heldout_fraction",
                f"must be in (0, 1); got {self.heldout_fraction}")
        require(self.eval_sequences >= 0, "eval_sequences", f"must be >= 0 (0 = all); got {self.eval_sequences}")
        require(self.seed >= 0, "seed", f"must be >= 0; got {self.seed}")


class PairFeatures:
    """Conditioning of pairs: the router's inputs (``kind``: ``predictor.input``; ``cache`` reads the
    context cache, the others the LM's states) and the token's geometric features at each pair's
    position, computed once per window."""

    def __init__(self, cache: ContextCache, geo: GeoLookup | None, kind: str = "cache", lm=None):
        self.cache, self.geo, self.kind, self.lm = cache, geo, kind, lm
        self.t_len = cache.context_length
        self._inputs: dict[tuple[int, int], torch.Tensor] = {}

    @property
    def dim(self) -> int:
        hidden = self.lm.config.hidden_size if self.lm is not None else 0
        layers = self.lm.config.num_hidden_layers if self.lm is not None else 1
        return input_dim(self.kind, self.cache.dim, hidden, layers)

    def _windows(self, split: int, windows: np.ndarray) -> torch.Tensor:
        """Router inputs (W, T, C) of windows of one split (0 train, 1 val)."""
        name = SPLITS[split]
        missing = [int(w) for w in np.unique(windows) if (split, int(w)) not in self._inputs]
        for start in range(0, len(missing), 8):
            part = np.asarray(missing[start : start + 8])
            if self.kind == "cache":
                states = torch.from_numpy(np.asarray(self.cache.contexts(name)[part], dtype=np.float32))
            else:
                device = next(self.lm.parameters()).device
                ids = torch.from_numpy(self.cache.windows(name)[part][:, :-1].astype(np.int64)).to(device)
                states = lm_states(self.lm, ids, self.kind).cpu()
            for i, w in enumerate(part):
                self._inputs[(split, int(w))] = states[i]
        return torch.stack([self._inputs[(split, int(w))] for w in windows])

    def __call__(self, rows: np.ndarray, split: np.ndarray | int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(inputs (P, C) float32, geo (P, G) or None) of cache rows (window · T + position) of
        ``split`` (one per row, or one for all)."""
        rows = np.asarray(rows)
        split = np.broadcast_to(np.asarray(split, dtype=np.int64), rows.shape)
        w, p = rows // self.t_len, rows % self.t_len
        inputs = torch.empty(len(rows), self.dim)
        ids = torch.empty(len(rows), dtype=torch.long)
        for s in np.unique(split):
            sel = np.flatnonzero(split == s)
            windows, inverse = np.unique(w[sel], return_inverse=True)
            inputs[sel] = self._windows(int(s), windows)[torch.from_numpy(inverse), torch.from_numpy(p[sel])]
            ids[sel] = torch.from_numpy(self.cache.windows(SPLITS[s])[w[sel], p[sel]].astype(np.int64))
        return inputs, (self.geo(ids) if self.geo is not None else None)


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
        contexts, geo = self.features(self.pairs.rows[idx], self.pairs.split[idx])
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


def build_model(cfg: DiffusionConfig, pairs: PairSet, features: PairFeatures, geo_dim: int) -> Denoiser:
    torch.manual_seed(cfg.train.seed)
    model = Denoiser(cfg.denoiser, pairs.info["n_layers"], pairs.info["n_heads"], features.dim, geo_dim,
                     edge_marginals(pairs))
    shift, scale = input_scale(features(pairs.rows[pairs.train], pairs.split[pairs.train])[0])
    model.context_shift.copy_(shift)
    model.context_scale.copy_(scale)
    return model


def input_scale(inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-feature mean and sd (floored) of training inputs (P, C), to standardise them."""
    return inputs.mean(0), inputs.std(0).clamp_min(1e-4)


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
    ("eps_good_per_position", "eps_good_multi_share", "recall_at_1", "recall_at_4", "recall_at_8",
     "baseline_recall_at_1", "baseline_recall_at_4", "baseline_recall_at_8", "sample_nll", "deterministic_nll",
     "best_of_k_label_free_nll", "null_frequency_best_of_k_nll", "autoregressive_recall_at_8",
     "autoregressive_best_of_k_label_free_nll"),
    KEEPSET_SEEDED + ("autoregressive_recall_at_8", "autoregressive_best_of_k_label_free_nll")) + ("window_set",)
"""On the pairs' val windows of the context cache (their ε-good keep sets): ``window_set``."""


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


def judge_keep_sets(cfg: DiffusionConfig, module: DiffusionModule, predictor, meta: dict, lm, cache: ContextCache,
                    geo: GeoLookup, device) -> dict:
    """Train the autoregressive decoder and judge every decoder against its nulls on the val windows'
    ε-good sets (:mod:`lookahead.pipeline.diffusion.decoders`)."""
    from lookahead.graph.runtime import recorded_skip
    from lookahead.graph.gating import logistic_noise
    from lookahead.graph.keepsets import topk_set
    from lookahead.graph.sampling import executed_topology
    from lookahead.pipeline.diffusion.decoders import Scorer, judge, static_set, train_autoregressive, truth_sets

    pairs, features = module.pairs, module.features
    n_l, n_h, k = pairs.info["n_layers"], pairs.info["n_heads"], int(pairs.info["heads_kept"])
    mask = allowed_mask(n_l, n_h)
    keep = executed_topology(pairs.edges.float(), mask, n_l, n_h, "head")[1][..., 1:] > 0.5  # (pairs, L·H)
    # every decoder reads the router's inputs and, as each was built, the geometric features
    full = features if features.geo is not None else PairFeatures(cache, geo, features.kind, lm)
    a = cfg.autoregressive
    predictor.eval()

    def geo_of(model_geo_dim, g):
        return g if model_geo_dim else None

    def ar_inputs(x, g):
        parts = [x, g] if cfg.geo_features else [x]
        if a.router_logits:
            with torch.no_grad():
                parts.append(predictor.head_logits(x, geo_of(predictor.geo_dim, g)))
        return torch.cat(parts, -1)

    train_x, train_g = full(pairs.rows[pairs.train], 0)
    ar_in = ar_inputs(train_x, train_g)
    shift, scale = input_scale(ar_in)
    if a.router_logits:  # the prior logits enter as they are
        shift[-keep.shape[1] :], scale[-keep.shape[1] :] = 0.0, 1.0
    ar, ar_curve = train_autoregressive(ar_in, keep[pairs.train], k, a.steps, a.batch_size, a.lr, cfg.train.seed,
                                        a.hidden, scale=(shift, scale), prior=a.router_logits)
    t_len = cache.context_length
    n_val = int(pairs.rows[pairs.heldout].max() // t_len) + 1  # the first val windows
    positions = np.arange(n_val * t_len)
    val_x, val_g = full(positions, 1)
    truth, valid, has_truth = truth_sets(pairs.rows[pairs.heldout], keep[pairs.heldout], len(positions))
    denoiser = module.model.eval()
    steps, temperature = cfg.sample_steps, cfg.sample_temperature

    def baseline(x, g, gen):  # the router's sampler: top-K of its keep logits plus logistic noise
        with torch.no_grad():
            z = predictor.head_logits(x, geo_of(predictor.geo_dim, g))
        return topk_set(z + cfg.baseline_noise * logistic_noise(z.shape, z.device, z.dtype, gen), k)

    draws = {
        "baseline": baseline,
        "autoregressive": lambda x, g, gen: ar.sample(ar_inputs(x, g), gen, temperature=a.temperature)[0],
        "diffusion": lambda x, g, gen: denoiser.sample_keep_sets(x, geo_of(denoiser.geo_dim, g), steps, k, gen,
                                                                 temperature),
    }
    with torch.no_grad():
        deterministic = predictor(val_x, geo_of(predictor.geo_dim, val_g), hard=True)[1][..., 1:] > 0.5
    windows = torch.from_numpy(cache.windows("val")[:n_val].astype(np.int64))
    scorer = Scorer(lm, windows, n_l, n_h, recorded_skip(meta), cfg.eval_batch_size)
    table = judge(draws, deterministic, static_set(keep[pairs.train], k), scorer, val_x, val_g, truth, valid,
                  has_truth, k, cfg.eval_samples, cfg.seed)
    counts = valid.sum(-1)[has_truth].float()
    report = {f"{name}_{fig}": value for name, figs in table.items() for fig, value in figs.items()}
    d, b = table["diffusion"], table["baseline"]
    report.update({
        "eps_good_per_position": float(counts.mean()), "eps_good_multi_share": float((counts >= 2).float().mean()),
        **{f"recall_at_{n}": d[f"recall_at_{n}"] for n in (1, 4, 8)},
        **{f"baseline_recall_at_{n}": b[f"recall_at_{n}"] for n in (1, 4, 8)},
        "sample_nll": d["sample_nll"], "deterministic_nll": table["router"]["sample_nll"],
        "best_of_k_label_free_nll": d["best_of_k_label_free_nll"],
        "null_frequency_best_of_k_nll": table["diffusion_frequency"]["best_of_k_label_free_nll"],
        "dense_nll": table["dense"]["sample_nll"], "heads_kept": k, "eval_samples": cfg.eval_samples,
        "val_positions": len(positions), "truth_positions": int(has_truth.sum()),
        "window_set": set_label("cache-val", windows),
        "autoregressive_train_curve": ar_curve, "best_of_k_criterion": "least KL(dense || routed), no label",
    })
    return report


def judge_samplers(cfg: DiffusionConfig, module: DiffusionModule, predictor, meta: dict, lm, cache: ContextCache,
                   geo: GeoLookup, device, pairs_dir) -> dict:
    """The diffusion head against the predictor's own sampler on beats_dense pairs."""
    from lookahead.graph.runtime import recorded_skip
    from lookahead.pipeline.diffusion.evaluation import lm_comparison, make_samplers, mode_recall

    lm.to(device)
    denoiser = module.model.to(device).eval()
    predictor.to(device).eval()
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    flip_prob = float(recorded(module.pairs.info, "config", "flip_prob", stage="pairs", source=pairs_dir))
    samplers = make_samplers(denoiser, predictor, cfg.sample_steps, cfg.sample_temperature, flip_prob, generator)
    skip = recorded_skip(meta)
    lm_figures = lm_comparison(lm, predictor, samplers, cache, geo.to(device), cfg.eval_samples, cfg.eval_sequences,
                               cfg.eval_batch_size, device, cfg.seed, skip)
    # every sampler takes the geometric features if its model was built with them: the full table here
    features = module.features if module.features.geo is not None else PairFeatures(cache, geo, module.features.kind, lm)
    recall = mode_recall(samplers, predictor, module.pairs, features, cfg.eval_samples, cfg.recall_radius, device)
    pairs = module.pairs
    diff, base = lm_figures["diffusion"], lm_figures["baseline"]
    return {
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
        "explore_flip_prob": flip_prob,
    }


def build_diffusion_seeds(cfg: DiffusionConfig, base_dir, contexts_dir, init_file, predictor_file, pairs_dir, out_dir,
                          checkpoint_root=None, tracker=None) -> tuple[dict, TrainResult, DiffusionModule]:
    """:func:`build_diffusion`, then ``cfg.seeds - 1`` more trainings on other seeds (their heads
    discarded): the report carries the seeded figures' mean and sd (lookahead.core.seeds)."""
    seeded = KEEPSET_SEEDED if headline(pairs_dir) is KEEPSET_HEADLINE else SEEDED
    return over_seeds(cfg, "diffusion", seeded, lambda c, scratch: build_diffusion(
        c, base_dir, contexts_dir, init_file, predictor_file, pairs_dir, scratch / "diffusion" if scratch else out_dir,
        checkpoint_root, None if scratch else tracker))
