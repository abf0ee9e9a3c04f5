"""The modulator stage (DESIGN §2 modulator): the geometric modulator of
:mod:`lookahead.pipeline.modulator.model` trained on next-token NLL over the train stream with the
LM frozen, measured before and after: val NLL (coherence), relational alignment with WordNet exactly
as the probe stage measures it (Pearson/Spearman of contextual gloss encodings against path
similarity, mean cosine per similarity band, hypernym-chain decay), and the pentachoron CV of those
encodings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from lookahead.core.config import to_dict
from lookahead.core.seeds import other_seeds, with_spread
from lookahead.lm.nll import causal_lm_nll, evaluate_nll
from lookahead.pipeline.modulator.config import AlignmentConfig, ModulatorConfig, ModulatorError
from lookahead.pipeline.modulator.model import GeometricModulator, ModulatedLM, save_modulator
from lookahead.semantics import geometry
from lookahead.train import data
from lookahead.train.loop import TrainResult, train

MODULATOR_FILE = "modulator.safetensors"
BATCH_SALT = 60  # keeps the modulator's training windows apart from other stages' draws


def resolve_layers(cfg: ModulatorConfig, n_layers: int) -> list[int]:
    """The modulated layers for a model of ``n_layers`` blocks (refuses indices past the model)."""
    if cfg.layers == "all":
        return list(range(n_layers))
    bad = [layer for layer in cfg.layers if layer >= n_layers]
    if bad:
        raise ModulatorError(f"modulator.layers lists {bad} but the base model has {n_layers} layers (0..{n_layers - 1})")
    return sorted(cfg.layers)


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
