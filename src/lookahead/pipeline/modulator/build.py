"""The geometric residual modulator (DESIGN §2 modulator; the seed notebook's LERP injection).

At each chosen block of a frozen OLMo2 LM, the residual stream entering the block is pulled toward
a per-token geometric target:

    h ← (1 − α_l · m(x)) · h + α_l · m(x) · target(x)

with ``geo`` the init stage's WordNet eigen-embedding of token x (``geo_table``, unit rows), ``P``
its Procrustes projection into the base model's residual space (``projection`` = R · PCA
components, orthonormal rows) and m(x) = 1 for a token with a WordNet match, 0 otherwise (no
nudge). ``target: plain`` is the seed's formula, target(x) = geo(x) P (unit norm);
``target: pca`` is the point of the residual space that the Procrustes fit maps geo(x) to,
μ + s · geo(x) P, with μ the PCA mean of the anchors' gloss encodings and s the mean norm of their
PCA coordinates (the fit aligned unit rows, so s restores the scale). α_l is stored as a logit (``alpha_init``, 0.01
in the seed) and is learned or fixed, per layer or shared; the table and the projection are
trainable or frozen by params. The update is ``torch.lerp``, so α = 0 leaves the stream bit for bit.

The ``modulator`` stage trains it on next-token NLL over the train stream with the LM frozen, and
measures before and after: val NLL (coherence), relational alignment with WordNet exactly as the
probe stage measures it (Pearson/Spearman of contextual gloss encodings against path similarity,
mean cosine per similarity band, hypernym-chain decay), and the pentachoron CV of those encodings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn

from lookahead.core.config import to_dict
from lookahead.core.errors import LookaheadError, require
from lookahead.core.seeds import other_seeds, with_spread
from lookahead.lm.nll import causal_lm_nll, evaluate_nll
from lookahead.semantics import geometry
from lookahead.train import data
from lookahead.train.loop import TrainConfig, TrainResult, train

MODULATOR_FILE = "modulator.safetensors"
BATCH_SALT = 60  # keeps the modulator's training windows apart from other stages' draws


class ModulatorError(LookaheadError, ValueError):
    """Inputs of the modulator stage do not fit its params."""


@dataclasses.dataclass
class ModulatorConfig:
    """The LERP geometric residual modulator, trained with the LM frozen."""

    seeds: int = 3
    """Runs over seeds of training, for each headline figure's mean and `_sd`
    (lookahead.core.seeds); the first, with the configured seeds, writes the outputs."""
    layers: list[int] | Literal["all"] = "all"
    """Blocks whose incoming residual stream is modulated (0-based), or `all`."""
    target: Literal["plain", "pca"] = "plain"
    """`plain`: geo(x) P, the seed's formula; `pca`: μ + s · geo(x) P, the gloss-encoding point it maps to."""
    alpha_init: float = 0.01
    """α at the start (every modulated layer); a fixed α keeps this value."""
    alpha_mode: Literal["learned", "fixed"] = "learned"
    """`learned`: α is a trained logit ("alpha finds itself"); `fixed`: α stays at alpha_init."""
    alpha_shared: bool = False
    """One α for every modulated layer instead of one per layer."""
    train_table: bool = False
    """Train the geometric table geo (V × n_geo) too."""
    train_projection: bool = False
    """Train the projection P (n_geo × hidden) too."""
    seq_len: int = 0
    """Tokens per training and evaluation window (0 = the model's max_position_embeddings)."""
    eval_tokens: int = 32768
    """Val tokens scored for the val NLL, from the start of the val stream (0 = all)."""
    eval_batch_size: int = 16
    """Windows per forward pass when scoring."""
    train: TrainConfig = dataclasses.field(default_factory=lambda: TrainConfig(
        steps=200, batch_size=8, lr=3e-2, warmup_steps=20, weight_decay=0.0, eval_every=50, checkpoint_every=50))
    """Optimisation of the modulator's parameters (batch_size = train windows per step)."""

    def __post_init__(self) -> None:
        require(self.seeds >= 1, "seeds", f"must be >= 1; got {self.seeds}")
        if self.layers != "all":
            require(len(self.layers) >= 1, "layers", "must list at least one layer, or be `all`")
            require(all(layer >= 0 for layer in self.layers), "layers", f"must be layer indices >= 0; got {self.layers}")
            require(len(set(self.layers)) == len(self.layers), "layers", f"must not repeat a layer; got {self.layers}")
        if self.alpha_mode == "learned":
            require(math.isfinite(self.alpha_init) and 0.0 < self.alpha_init < 1.0, "alpha_init",
                    f"must be in (0, 1) when alpha_mode is `learned` (it is stored as a logit); got {self.alpha_init}")
        else:
            require(math.isfinite(self.alpha_init) and 0.0 <= self.alpha_init <= 1.0, "alpha_init",
                    f"must be in [0, 1]; got {self.alpha_init}")
        require(self.seq_len >= 0, "seq_len", f"must be >= 0 (0 = the model's context length); got {self.seq_len}")
        require(self.eval_tokens >= 0, "eval_tokens", f"must be >= 0 (0 = all); got {self.eval_tokens}")
        require(self.eval_batch_size >= 1, "eval_batch_size", f"must be >= 1; got {self.eval_batch_size}")

    @property
    def trains(self) -> bool:
        """Whether anything is trainable (a fixed α with table and projection frozen trains nothing)."""
        return self.alpha_mode == "learned" or self.train_table or self.train_projection


@dataclasses.dataclass
class AlignmentConfig:
    """What the modulator stage reads of the ``probe`` section: relational alignment is measured
    exactly as the probe stage measures it (lookahead.pipeline.probe.build)."""

    seeds: list[int] = dataclasses.field(default_factory=lambda: [0, 1, 2])
    """Seeds of the sampled statistics (bootstrap of the correlations, pentachoron draws)."""
    pentachora: int = 300
    """Random 5-point simplices per seed for the Cayley-Menger volume CV."""
    chain_depth: int = 4
    """Hypernym-chain steps for the cosine decay."""
    max_text_tokens: int = 64
    """Truncate glosses to this many tokens when encoding."""
    encode_batch_size: int = 64
    """Texts per forward pass when encoding glosses."""

    def __post_init__(self) -> None:
        require(len(self.seeds) >= 1 and len(set(self.seeds)) == len(self.seeds), "seeds", "must list distinct seeds")
        for name in ("pentachora", "chain_depth", "max_text_tokens", "encode_batch_size"):
            require(getattr(self, name) >= 1, name, f"must be >= 1; got {getattr(self, name)}")


def _logit(p: float) -> float:
    if p <= 0.0:
        return -math.inf  # sigmoid(-inf) = 0 exactly: a fixed α = 0 modulates nothing
    if p >= 1.0:
        return math.inf
    return math.log(p / (1.0 - p))


class GeometricModulator(nn.Module):
    """α-weighted LERP of the residual stream entering each modulated block toward the token's
    geometric target. Call it as ``modulator(lm, input_ids, **lm_kwargs)`` (the LM's output)."""

    def __init__(self, table: torch.Tensor, mask: torch.Tensor, projection: torch.Tensor, pca_mean: torch.Tensor,
                 geo_scale: float, layers: list[int], cfg: ModulatorConfig):
        super().__init__()
        self.layers = list(layers)
        self.table = nn.Parameter(table.float().clone(), requires_grad=cfg.train_table)
        self.projection = nn.Parameter(projection.float().clone(), requires_grad=cfg.train_projection)
        self.register_buffer("mask", mask.float().clone())
        plain = cfg.target == "plain"
        self.register_buffer("pca_mean", torch.zeros_like(pca_mean).float() if plain else pca_mean.float().clone())
        self.register_buffer("geo_scale", torch.tensor(1.0 if plain else float(geo_scale)))
        n_alpha = 1 if cfg.alpha_shared else len(self.layers)
        self.alpha_logit = nn.Parameter(torch.full((n_alpha,), _logit(cfg.alpha_init)),
                                        requires_grad=cfg.alpha_mode == "learned")

    def alphas(self) -> torch.Tensor:
        """α of each modulated layer, in the order of ``layers``. (n_layers_modulated,)"""
        return torch.sigmoid(self.alpha_logit).expand(len(self.layers))

    def target(self, ids: torch.Tensor) -> torch.Tensor:
        """μ + s · geo(x) P for every token (μ = 0, s = 1 for ``target: plain``). (B, T, hidden)"""
        return self.pca_mean + self.geo_scale * (self.table[ids] @ self.projection)

    @contextlib.contextmanager
    def attached(self, lm, ids: torch.Tensor):
        """Within the block, ``lm``'s blocks in ``layers`` see the modulated stream for tokens ``ids``."""
        blocks = lm.model.layers
        target = self.target(ids)
        weights = self.alphas()[:, None, None, None] * self.mask[ids][None, :, :, None]  # (n, B, T, 1)

        def hook(k: int):
            def pre(module, args, kwargs):
                if args:
                    h = args[0]
                    return (torch.lerp(h, target.to(h.dtype), weights[k].to(h.dtype)), *args[1:]), kwargs
                h = kwargs["hidden_states"]
                return args, {**kwargs, "hidden_states": torch.lerp(h, target.to(h.dtype), weights[k].to(h.dtype))}
            return pre

        handles = [blocks[layer].register_forward_pre_hook(hook(k), with_kwargs=True) for k, layer in enumerate(self.layers)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def forward(self, lm, input_ids: torch.Tensor, **kwargs):
        with self.attached(lm, input_ids):
            return lm(input_ids=input_ids, **kwargs)


class ModulatedLM(nn.Module):
    """A frozen LM with a modulator attached, usable wherever the LM is (``model(input_ids=...)``,
    ``get_input_embeddings``, ``config``): the probe's encoders measure it unchanged."""

    def __init__(self, lm, modulator: GeometricModulator):
        super().__init__()
        self.lm, self.modulator = lm, modulator

    @property
    def config(self):
        return self.lm.config

    def get_input_embeddings(self):
        return self.lm.get_input_embeddings()

    def forward(self, input_ids: torch.Tensor, **kwargs):
        return self.modulator(self.lm, input_ids, **kwargs)


def resolve_layers(cfg: ModulatorConfig, n_layers: int) -> list[int]:
    """The modulated layers for a model of ``n_layers`` blocks (refuses indices past the model)."""
    if cfg.layers == "all":
        return list(range(n_layers))
    bad = [layer for layer in cfg.layers if layer >= n_layers]
    if bad:
        raise ModulatorError(f"modulator.layers lists {bad} but the base model has {n_layers} layers (0..{n_layers - 1})")
    return sorted(cfg.layers)


def save_modulator(modulator: GeometricModulator, path: str | Path, config: dict) -> None:
    """One safetensors file with the resolved config in its metadata."""
    from safetensors.torch import save_file

    from lookahead.core.atomic import atomic_file

    tensors = {k: v.detach().cpu().contiguous() for k, v in modulator.state_dict().items()}
    with atomic_file(path) as tmp:
        # one metadata key: safetensors writes several in a random order (different bytes each run)
        save_file(tensors, str(tmp), metadata={"config": json.dumps({**config, "resolved_layers": modulator.layers},
                                                                    sort_keys=True)})


def load_modulator(path: str | Path) -> tuple[GeometricModulator, dict]:
    """(modulator, config) from :func:`save_modulator`'s file."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    config = json.loads(meta["config"])
    cfg = ModulatorConfig(**{k: v for k, v in config["modulator"].items() if k != "train"})
    t = load_file(str(path))
    modulator = GeometricModulator(t["table"], t["mask"], t["projection"], t["pca_mean"], float(t["geo_scale"]),
                                   config["resolved_layers"], cfg)
    modulator.load_state_dict(t)
    return modulator, config


class ModulatorModule:
    """The stage's step object for :func:`lookahead.train.loop.train`: the modulator trains, the LM is frozen."""

    def __init__(self, modulator: GeometricModulator, lm, train_stream: np.ndarray, val_windows: torch.Tensor,
                 cfg: ModulatorConfig):
        self.model = modulator
        self.lm = lm.eval().requires_grad_(False)
        self.stream, self.val_windows, self.cfg = train_stream, val_windows, cfg
        self.seq_len = int(val_windows.shape[1]) - 1

    def place(self, device) -> None:
        self.lm.to(device)

    def batch(self, step: int) -> torch.Tensor:
        t = self.cfg.train
        return data.train_batch(self.stream, step, t.batch_size, self.seq_len, t.seed, salt=BATCH_SALT)

    def loss(self, model, windows: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        nll = causal_lm_nll(ModulatedLM(self.lm, model), windows)
        alphas = self.model.alphas().detach().cpu().tolist()
        return nll, {f"alpha_l{layer}": a for layer, a in zip(self.model.layers, alphas)}

    def evaluate(self, model) -> dict[str, float]:
        return {"val_nll": evaluate_nll(ModulatedLM(self.lm, model), self.val_windows, self.cfg.eval_batch_size)}

    def tokens(self, windows: torch.Tensor) -> int:
        return windows[:, 1:].numel()


def alignment(model, tokenizer, wn, anchors: list[dict], pairs: np.ndarray, path_sim: np.ndarray,
              acfg: AlignmentConfig) -> tuple[dict, np.ndarray]:
    """Relational alignment of ``model`` with WordNet as the probe stage measures it: Pearson and
    Spearman of the anchors' contextual gloss encodings against path similarity, mean cosine per
    band, hypernym-chain decay; plus the pentachoron CV of those encodings, and (``lemma``) the same
    correlations for each anchor's lemma token encoded alone. Returns (block, gloss encodings)."""
    from lookahead.lm.encoders import encode_texts
    from lookahead.semantics.alignment import chain_decay, relational_alignment, static_texts

    ctx = encode_texts(model, tokenizer, [a["gloss"] for a in anchors], acfg.encode_batch_size, acfg.max_text_tokens)
    correlations, bands = relational_alignment(ctx, pairs, path_sim, acfg.seeds)
    lemmas = [" " + a["lemma"] for a in anchors]
    decay = chain_decay(model, tokenizer, wn, anchors, acfg.chain_depth, acfg, ctx, static_texts(model, tokenizer, lemmas))
    # diagnostic beside the probe's measure: each anchor's lemma token alone, encoded by the model
    # (its final hidden state), against the same path similarities; the nudge reaches it directly
    lemma = encode_texts(model, tokenizer, lemmas, acfg.encode_batch_size, acfg.max_text_tokens)
    lemma_correlations, _ = relational_alignment(lemma, pairs, path_sim, acfg.seeds)
    cv: dict[str, list] = {}
    for seed in acfg.seeds:
        for k, v in geometry.pentachoron_cv(ctx.astype(np.float64), acfg.pentachora, np.random.default_rng([seed, 10])).items():
            cv.setdefault(k, []).append(v)
    block = {**correlations, "lemma": lemma_correlations, "bands": bands, "chain_decay": decay["contextual"],
             "pentachoron": {k: geometry.mean_ci(v) for k, v in cv.items()}}
    return block, ctx


def _gain_pct(before: float, after: float) -> float | None:
    return 100.0 * (after - before) / abs(before) if before else None


# metrics/modulator.json: these scalars plus `alpha_per_layer` ({"l<i>": α}, one column per layer in dvc exp show)
HEADLINE = {
    "val_nll_before": "val_nll_before", "val_nll_after": "val_nll_after", "val_nll_change_pct": "val_nll_change_pct",
    "pearson_before": "pearson_before", "pearson_after": "pearson_after", "pearson_gain_pct": "pearson_gain_pct",
    "spearman_before": "spearman_before", "spearman_after": "spearman_after", "spearman_gain_pct": "spearman_gain_pct",
    "cv_ratio_before": "before.pentachoron.cv_ratio.mean", "cv_ratio_after": "after.pentachoron.cv_ratio.mean",
    "lemma_spearman_before": "before.lemma.spearman.mean", "lemma_spearman_after": "after.lemma.spearman.mean",
    "alpha_mean": "alpha_mean",
}
# and their spread over training seeds (lookahead.core.seeds): the gains and what the training moves
SEEDED = ("val_nll_after", "val_nll_change_pct", "pearson_gain_pct", "spearman_gain_pct", "alpha_mean")
HEADLINE = {**HEADLINE, **{f"{key}_sd": f"{key}_sd" for key in SEEDED}, "seeds": "seeds",
            "alpha_per_layer": "alpha_per_layer"}  # {l<i>: α}: `dvc metrics show` flattens it to alpha_per_layer.l<i>


def build_modulator(cfg: ModulatorConfig, acfg: AlignmentConfig, base_dir, tokens_dir, wordnet_dir, wordnet_path,
                    init_file, out_dir, checkpoint_root=None, tracker=None) -> tuple[dict, TrainResult | None, list[dict]]:
    """Measure the base model, train the modulator, measure the modulated model; write
    ``out_dir/modulator.safetensors``. Returns (report, training result or None, α curve rows)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lookahead.artifacts.wordnet_tables import read_eval_pairs
    from lookahead.core.atomic import atomic_dir
    from lookahead.core.devices import resolve_device
    from lookahead.core.tracking import is_main_process
    from lookahead.semantics.wordnet_source import open_wordnet
    from lookahead.train.checkpoints import checkpoint_dir

    lm = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval().requires_grad_(False)
    layers = resolve_layers(cfg, lm.config.num_hidden_layers)  # refuse bad layers before any work
    init = load_file(str(init_file))
    if init["projection"].shape[1] != lm.config.hidden_size or init["geo_table"].shape[0] != lm.config.vocab_size:
        raise ModulatorError(f"init file {init_file} (table {tuple(init['geo_table'].shape)}, projection "
                             f"{tuple(init['projection'].shape)}) does not fit the base model (vocab {lm.config.vocab_size}, "
                             f"hidden {lm.config.hidden_size}): rerun `dvc repro init`")
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    wn = open_wordnet(wordnet_path)
    anchors, pairs, path_sim = read_eval_pairs(wordnet_dir)
    context = lm.config.max_position_embeddings
    if cfg.seq_len > context:
        raise ModulatorError(f"modulator.seq_len is {cfg.seq_len} but the base model's context is {context} tokens")
    val_windows = data.eval_windows(data.load_stream(tokens_dir, "val"), cfg.seq_len or context, cfg.eval_tokens)
    device = torch.device(resolve_device(cfg.train.device, "modulator.train.device"))
    lm.to(device)

    before, ctx = alignment(lm, tokenizer, wn, anchors, pairs, path_sim, acfg)
    nll_before = evaluate_nll(lm, val_windows, cfg.eval_batch_size)
    pcs = (ctx.astype(np.float64) - init["pca_mean"].double().numpy()) @ init["pca_components"].double().numpy().T
    geo_scale = float(np.linalg.norm(pcs, axis=1).mean())

    torch.manual_seed(cfg.train.seed)
    modulator = GeometricModulator(init["geo_table"], init["geo_mask"], init["projection"], init["pca_mean"],
                                   geo_scale, layers, cfg).to(device)
    alpha_rows = [{"step": 0, "series": f"layer {layer}", "alpha": a} for layer, a in zip(layers, modulator.alphas().tolist())]
    result = None
    if cfg.trains:
        module = ModulatorModule(modulator, lm, data.load_stream(tokens_dir, "train"), val_windows, cfg)
        ckpt = checkpoint_dir(checkpoint_root, "modulator", {"modulator": to_dict(cfg), "geo_scale": geo_scale},
                              [Path(base_dir) / "model.safetensors", init_file, Path(tokens_dir) / "train.npy"])
        result = train(module, cfg.train, stage="modulator", checkpoint_dir=ckpt, tracker=tracker)
        result.eval_curve.insert(0, {"step": 0, "val_nll": nll_before})
        modulator = module.model
        alpha_rows += [{"step": r["step"], "series": f"layer {layer}", "alpha": r[f"alpha_l{layer}"]}
                       for r in result.train_curve for layer in layers]
    elif not is_main_process():
        raise SystemExit(0)  # nothing to train: the main process measures and writes (as after training)
    modulator.eval()
    modulated = ModulatedLM(lm, modulator)
    with torch.no_grad():
        after, _ = alignment(modulated, tokenizer, wn, anchors, pairs, path_sim, acfg)
        nll_after = evaluate_nll(modulated, val_windows, cfg.eval_batch_size)
        matched = float(modulator.mask[val_windows[:, :-1].to(device)].mean())
        alphas = modulator.alphas().cpu().tolist()

    config = {"modulator": to_dict(cfg), "base_hidden_size": lm.config.hidden_size, "geo_scale": geo_scale}
    with atomic_dir(out_dir) as tmp:
        save_modulator(modulator, tmp / MODULATOR_FILE, config)
    change = _gain_pct(nll_before, nll_after)
    report = {
        "val_nll_before": nll_before, "val_nll_after": nll_after, "val_nll_change_pct": change,
        "coherent": change <= 1.0,
        "pearson_before": before["pearson"]["mean"], "pearson_after": after["pearson"]["mean"],
        "pearson_gain_pct": _gain_pct(before["pearson"]["mean"], after["pearson"]["mean"]),
        "spearman_before": before["spearman"]["mean"], "spearman_after": after["spearman"]["mean"],
        "spearman_gain_pct": _gain_pct(before["spearman"]["mean"], after["spearman"]["mean"]),
        "alpha_mean": float(np.mean(alphas)),
        "alpha_per_layer": {f"l{layer}": a for layer, a in zip(layers, alphas)},
        "layers": layers, "geo_scale": geo_scale, "val_tokens": int(val_windows[:, 1:].numel()),
        "val_matched_token_fraction": matched, "trained": cfg.trains,
        "before": before, "after": after,
    }
    if result is not None:
        report.update({"train_steps": cfg.train.steps, "train_tokens_per_s": result.tokens_per_s,
                       "train_seconds": result.train_seconds, "resumed_from": result.resumed_from})
    return report, result, alpha_rows


def build_modulator_seeds(cfg: ModulatorConfig, acfg: AlignmentConfig, base_dir, tokens_dir, wordnet_dir, wordnet_path,
                          init_file, out_dir, checkpoint_root=None,
                          tracker=None) -> tuple[dict, TrainResult | None, list[dict]]:
    """:func:`build_modulator`, then ``cfg.seeds - 1`` more trainings on other seeds (their
    modulators discarded): the report carries the :data:`SEEDED` figures' mean and sd."""
    report, result, alpha_rows = build_modulator(cfg, acfg, base_dir, tokens_dir, wordnet_dir, wordnet_path, init_file,
                                                 out_dir, checkpoint_root, tracker)
    others = other_seeds(cfg, cfg.seeds, lambda c, scratch: build_modulator(
        c, acfg, base_dir, tokens_dir, wordnet_dir, wordnet_path, init_file, scratch / "modulator", checkpoint_root)[0],
        "modulator")
    return with_spread(report, others, SEEDED), result, alpha_rows
