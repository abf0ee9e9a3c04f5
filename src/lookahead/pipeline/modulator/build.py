"""The modulator stage (docs/pipeline.md): a geometric modulator — the LERP one of
:mod:`lookahead.pipeline.modulator.model` or the field one of :mod:`lookahead.pipeline.modulator.field`
(``modulator.kind``) — trained on next-token NLL over the train stream with the LM frozen, measured
before and after: val NLL (coherence), relational alignment with WordNet exactly as the probe stage
measures it (Pearson/Spearman of contextual gloss encodings against path similarity, mean cosine per
similarity band, hypernym-chain decay), the token-level alignment (each lemma's own hidden state read
after its gloss), and the pentachoron CV of the gloss encodings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from lookahead.core.config import to_dict
from lookahead.core.intervals import CI_HIGH, CI_LOW, SE, claim_keys, ratio_interval
from lookahead.core.seeds import mean_ci, over_seeds
from lookahead.core.windows import set_label
from lookahead.core.devices import eval_mode
from lookahead.lm.nll import causal_lm_nll, evaluate_nll
from lookahead.pipeline.modulator.config import AlignmentConfig, ModulatorConfig, ModulatorError
from lookahead.pipeline.modulator.field import build_field
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
    """The stage's step object for :func:`lookahead.train.loop.train`: the modulator trains, the LM is frozen.
    ``gloss_cv(modulated_lm)``, when given, is evaluated with the val NLL (the field modulator's CV
    monitor) and ends training once the CV has left ``cfg.field.cv_band`` for ``cv_patience`` evaluations."""

    def __init__(self, modulator, lm, train_stream: np.ndarray, val_windows: torch.Tensor, cfg: ModulatorConfig,
                 gloss_cv=None):
        self.model = modulator
        self.lm = lm.eval().requires_grad_(False)
        self.stream, self.val_windows, self.cfg, self.gloss_cv = train_stream, val_windows, cfg, gloss_cv
        self.seq_len = int(val_windows.shape[1]) - 1

    def place(self, device) -> None:
        self.lm.to(device)

    def batch(self, step: int) -> torch.Tensor:
        t = self.cfg.train
        return data.train_batch(self.stream, step, t.batch_size, self.seq_len, t.seed, salt=BATCH_SALT)

    def loss(self, model, windows: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        nll = causal_lm_nll(ModulatedLM(self.lm, model), windows)
        return nll, self.model.monitor()

    def lr_scale(self, name: str) -> float:
        """The field modulator's optimiser groups (seed notebook section 12): α logits at
        ``alpha_lr_scale``, gate projections at 1, the rest of each expert (deformation map,
        validator) at ``geometric_lr_scale``; every LERP parameter at 1."""
        if self.cfg.kind != "field":
            return 1.0
        if name == "alpha_logit":
            return self.cfg.field.alpha_lr_scale
        return 1.0 if ".gate." in name else self.cfg.field.geometric_lr_scale

    def evaluate(self, model) -> dict[str, float]:
        modulated = ModulatedLM(self.lm, model)
        out = {"val_nll": evaluate_nll(modulated, self.val_windows, self.cfg.eval_batch_size)}
        if self.gloss_cv is not None:
            out["pentachoron_cv"] = self.gloss_cv(modulated)
        return out

    def stop_reason(self, eval_curve: list[dict]) -> str | None:
        """Why to stop now (the loop's early-stop hook): the CV, inside the band at some evaluation,
        has been outside it for the last ``cv_patience`` evaluations; None otherwise or when off."""
        patience = self.cfg.field.cv_patience
        cvs = [row["pentachoron_cv"] for row in eval_curve if "pentachoron_cv" in row]
        if not patience or len(cvs) < patience:
            return None
        lo, hi = self.cfg.field.cv_band
        inside = [lo <= cv <= hi for cv in cvs]
        if any(inside) and not any(inside[-patience:]):
            return f"pentachoron CV {cvs[-1]:.3f} outside [{lo}, {hi}] for {patience} evaluations"
        return None

    def tokens(self, windows: torch.Tensor) -> int:
        return windows[:, 1:].numel()


def alignment(model, tokenizer, wn, anchors: list[dict], pairs: np.ndarray, path_sim: np.ndarray,
              acfg: AlignmentConfig) -> tuple[dict, np.ndarray]:
    """Relational alignment of ``model`` with WordNet as the probe stage measures it: Pearson and
    Spearman of the anchors' contextual gloss encodings against path similarity, mean cosine per
    band, hypernym-chain decay; plus the pentachoron CV of those encodings, the token-level
    correlations (``token``: each lemma's own hidden state read after its gloss, as the probe's
    ``token_level`` option) and (``lemma``) the same for each lemma token encoded alone, without
    context. Returns (block, gloss encodings)."""
    from lookahead.lm.encoders import encode_texts
    from lookahead.semantics.alignment import chain_decay, relational_alignment, static_texts, token_encodings

    ctx = gloss_encodings(model, tokenizer, anchors, acfg)
    correlations, bands = relational_alignment(ctx, pairs, path_sim, acfg.seeds)
    lemmas = [" " + a["lemma"] for a in anchors]
    decay = chain_decay(model, tokenizer, wn, anchors, acfg.chain_depth, acfg, ctx, static_texts(model, tokenizer, lemmas))
    # diagnostic beside the probe's measure: each anchor's lemma token alone, encoded by the model
    # (its final hidden state), against the same path similarities; the nudge reaches it directly
    lemma = encode_texts(model, tokenizer, lemmas, acfg.encode_batch_size, acfg.max_text_tokens)
    lemma_correlations, _ = relational_alignment(lemma, pairs, path_sim, acfg.seeds)
    tokens = token_encodings(model, tokenizer, anchors, acfg.encode_batch_size, acfg.max_text_tokens)
    token_correlations, _ = relational_alignment(tokens, pairs, path_sim, acfg.seeds)
    cv: dict[str, list] = {}
    for seed in acfg.seeds:
        for k, v in gloss_cv(ctx, acfg, seed).items():
            cv.setdefault(k, []).append(v)
    block = {**correlations, "token": token_correlations, "lemma": lemma_correlations, "bands": bands,
             "chain_decay": decay["contextual"], "pentachoron": {k: mean_ci(v) for k, v in cv.items()}}
    return block, ctx


def gloss_encodings(model, tokenizer, anchors: list[dict], acfg: AlignmentConfig) -> np.ndarray:
    """The anchors' gloss encodings as the probe stage computes them (mean-pooled last hidden state)."""
    from lookahead.lm.encoders import encode_texts

    return encode_texts(model, tokenizer, [a["gloss"] for a in anchors], acfg.encode_batch_size, acfg.max_text_tokens)


def gloss_cv(ctx: np.ndarray, acfg: AlignmentConfig, seed: int) -> dict[str, float]:
    """The pentachoron CV of gloss encodings ``ctx`` (and its Gaussian reference), drawn with ``seed``."""
    return geometry.pentachoron_cv(ctx.astype(np.float64), acfg.pentachora, np.random.default_rng([seed, 10]))


@torch.no_grad()
def position_nll(model, windows: torch.Tensor, batch_size: int) -> torch.Tensor:
    """NLL (N·T,) float32 on the CPU of every target token of ``windows`` (N, T+1), window by window:
    what :func:`~lookahead.lm.nll.evaluate_nll` averages, kept per position for the NLL change's interval."""
    device = next(model.parameters()).device
    with eval_mode(model):
        return torch.cat([causal_lm_nll(model, windows[i : i + batch_size].to(device), "none").cpu()
                          for i in range(0, len(windows), batch_size)])


def _gain_pct(before: float, after: float) -> float | None:
    return 100.0 * (after - before) / abs(before) if before else None


TOKEN_KEY, NLL_CLAIM = "token_nll", "val_nll_change_pct"


def nll_claim(reports: list[dict]) -> None:
    """Pop every seed's per-position NLLs (:data:`TOKEN_KEY`; primary first) and give the primary
    report the NLL change's 95 % interval, windows and seeds combined: the change in % is a ratio of
    sums over the test positions, 100 · Σ(after − before) / Σ before
    (:func:`~lookahead.core.intervals.ratio_interval`), the same windows resampled for every seed."""
    tokens = [r.pop(TOKEN_KEY) for r in reports]
    before = tokens[0]["before"].astype(np.float64)
    after = np.stack([t["after"] for t in tokens]).astype(np.float64)  # (S, P)
    interval = ratio_interval(100.0 * (after - before), np.abs(before), tokens[0]["window"])
    reports[0].update({f"{NLL_CLAIM}{SE}": interval["se"], f"{NLL_CLAIM}{CI_LOW}": interval["ci_low"],
                       f"{NLL_CLAIM}{CI_HIGH}": interval["ci_high"]})


# metrics/modulator.json: these scalars (the CV ratio before and the lemma and token alignments on both
# sides stay in the report: before.*, after.*) plus `alpha_per_layer` ({"l<i>": α}, or {"l<i>_k<k>": α} per
# layer per expert for the field modulator: one column each in dvc exp show); `validity_mean` is
# null for the LERP modulator (no simplex); `cv_in_band` reads the after CV against field.cv_band for both
HEADLINE = {
    "val_nll_before": "val_nll_before", "val_nll_after": "val_nll_after", "val_nll_change_pct": "val_nll_change_pct",
    "pearson_before": "pearson_before", "pearson_after": "pearson_after", "pearson_gain_pct": "pearson_gain_pct",
    "spearman_before": "spearman_before", "spearman_after": "spearman_after", "spearman_gain_pct": "spearman_gain_pct",
    "cv_ratio_after": "after.pentachoron.cv_ratio.mean", "token_spearman_gain_pct": "token_spearman_gain_pct",
    "alpha_mean": "alpha_mean", "kind": "kind", "validity_mean": "validity_mean", "cv_in_band": "cv_in_band",
}
# and their spread over training seeds (lookahead.core.seeds): the gains and what the training moves
SEEDED = ("val_nll_after", "val_nll_change_pct", "pearson_gain_pct", "spearman_gain_pct", "token_spearman_gain_pct",
          "alpha_mean")
HEADLINE = {**HEADLINE, **{f"{key}_sd": f"{key}_sd" for key in SEEDED}, "seeds": "seeds",
            **{key: key for key in claim_keys(NLL_CLAIM)[2:] if not key.endswith(SE)},  # its interval
            "alpha_per_layer": "alpha_per_layer", "window_set": "window_set"}  # {l<i>: α}: `dvc metrics show` flattens it to alpha_per_layer.l<i>


def new_modulator(cfg: ModulatorConfig, init: dict, geo_scale: float, layers: list[int], hidden: int):
    """The untrained modulator of ``cfg.kind`` (seeded by the caller)."""
    if cfg.kind == "field":
        return build_field(cfg, hidden, layers)
    return GeometricModulator(init["geo_table"], init["geo_mask"], init["projection"], init["pca_mean"], geo_scale,
                              layers, cfg)


def alpha_rows(step: int, monitor: dict[str, float]) -> list[dict]:
    """Rows of the α curve from a modulator's monitor: ``alpha_l<i>`` → series "layer i",
    ``alpha_l<i>_k<k>`` → "layer i, k=k"."""
    rows = []
    for key, value in monitor.items():
        if key.startswith("alpha_l"):
            layer, _, k = key[len("alpha_l"):].partition("_k")
            rows.append({"step": step, "series": f"layer {layer}" + (f", k={k}" if k else ""), "alpha": value})
    return rows


def gloss_cv_monitor(tokenizer, anchors: list[dict], acfg: AlignmentConfig):
    """``cv(model)``: the pentachoron CV of ``model``'s gloss encodings, drawn as :func:`alignment`
    draws its first seed's (so the last evaluation's CV is the `after` block's first seed)."""
    return lambda model: gloss_cv(gloss_encodings(model, tokenizer, anchors, acfg), acfg, acfg.seeds[0])["pentachoron_cv"]


@torch.no_grad()
def field_validity(lm, modulator, val_windows: torch.Tensor, batch_size: int) -> list[list[float]]:
    """The field modulator's validity fraction (share of tokens with V² > 0) per layer per expert
    over the val windows. (n_layers, n_experts) as lists."""
    total = torch.zeros_like(modulator.last_validity)
    device = next(lm.parameters()).device
    for i in range(0, len(val_windows), batch_size):
        batch = val_windows[i : i + batch_size, :-1].to(device)
        modulator(lm, batch)
        total += modulator.last_validity * len(batch)
    return (total / len(val_windows)).tolist()


def modulator_windows(cfg: ModulatorConfig, roles, tokens_dir, contexts_dir) -> dict[str, torch.Tensor]:
    """The val windows the modulator reads (:mod:`lookahead.artifacts.val_scores`): ``test``, every test
    window (its NLL before and after, the claim's), and ``curve``, the first selection windows holding
    ``cfg.eval_tokens`` tokens (0: all; its periodic validation curve). Windows of the context cache's
    length, which the test set is chosen apart from."""
    from lookahead.artifacts.contexts import ContextCache
    from lookahead.artifacts.val_scores import ScoringConfig, scoring_windows

    cache = ContextCache(contexts_dir)
    if cfg.seq_len and cfg.seq_len != cache.context_length:
        raise ModulatorError(f"modulator.seq_len is {cfg.seq_len}, but the test windows hold {cache.context_length} "
                             "tokens (the context cache's windows): set it to 0")
    scoring = ScoringConfig(roles=roles)
    test = scoring_windows(tokens_dir, scoring, cache.context_length, "test", cache)
    curve = scoring_windows(tokens_dir, scoring, cache.context_length, "selection")
    if cfg.eval_tokens:
        curve = curve[: max(1, cfg.eval_tokens // cache.context_length)]
    return {"test": test, "curve": curve}


def build_modulator(cfg: ModulatorConfig, acfg: AlignmentConfig, base_dir, tokens_dir, wordnet_dir, wordnet_path,
                    init_file, out_dir, checkpoint_root=None, tracker=None,
                    base_measures: dict | None = None,
                    windows: dict[str, torch.Tensor] | None = None) -> tuple[dict, TrainResult | None, list[dict]]:
    """Measure the base model, train the modulator, measure the modulated model; write
    ``out_dir/modulator.safetensors``. Returns (report, training result or None, α curve rows).
    ``base_measures``, when given, holds the base model's measures across calls (they depend on no
    seed): filled by the first call, read by the next. ``windows``: :func:`modulator_windows` (the
    stage's: the test set scored, the selection set's curve); None: the first ``eval_tokens`` of the
    val stream for both (tests of a stream with no context cache)."""
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
    if windows is None:
        val_windows = data.eval_windows(data.load_stream(tokens_dir, "val"), cfg.seq_len or context, cfg.eval_tokens)
        windows, labels = {"test": val_windows, "curve": val_windows}, ("val-start", "val-start")
    else:
        labels = ("test", "selection")
    val_windows = windows["test"]
    device = torch.device(resolve_device(cfg.train.device, "modulator.train.device"))
    lm.to(device)

    if not base_measures:  # no cache, or the first call of several
        before, ctx = alignment(lm, tokenizer, wn, anchors, pairs, path_sim, acfg)
        tokens = position_nll(lm, val_windows, cfg.eval_batch_size)
        measured = {"before": before, "ctx": ctx, "tokens_before": tokens, "nll_before": float(tokens.double().mean())}
        if base_measures is not None:
            base_measures.update(measured)
        base_measures = measured
    before, ctx, nll_before, tokens_before = (base_measures[key] for key in ("before", "ctx", "nll_before",
                                                                             "tokens_before"))
    pcs = (ctx.astype(np.float64) - init["pca_mean"].double().numpy()) @ init["pca_components"].double().numpy().T
    geo_scale = float(np.linalg.norm(pcs, axis=1).mean())

    torch.manual_seed(cfg.train.seed)
    modulator = new_modulator(cfg, init, geo_scale, layers, lm.config.hidden_size).to(device)
    curve = alpha_rows(0, modulator.monitor())
    result = None
    if cfg.trains:
        gloss_cv = gloss_cv_monitor(tokenizer, anchors, acfg) if cfg.kind == "field" else None
        module = ModulatorModule(modulator, lm, data.load_stream(tokens_dir, "train"), windows["curve"], cfg, gloss_cv)
        ckpt = checkpoint_dir(checkpoint_root, "modulator", {"modulator": to_dict(cfg), "geo_scale": geo_scale},
                              [Path(base_dir) / "model.safetensors", init_file, Path(tokens_dir) / "train.npy"])
        result = train(module, cfg.train, stage="modulator", checkpoint_dir=ckpt, tracker=tracker)
        with torch.no_grad():  # the curve's windows: the base LM's NLL there before training
            start = nll_before if windows["curve"] is val_windows else evaluate_nll(lm, windows["curve"], cfg.eval_batch_size)
        result.eval_curve.insert(0, {"step": 0, "val_nll": start})
        modulator = module.model
        curve += [row for r in result.train_curve for row in alpha_rows(r["step"], r)]
    elif not is_main_process():
        raise SystemExit(0)  # nothing to train: the main process measures and writes (as after training)
    modulator.eval()
    modulated = ModulatedLM(lm, modulator)
    with torch.no_grad():
        after, _ = alignment(modulated, tokenizer, wn, anchors, pairs, path_sim, acfg)
        tokens_after = position_nll(modulated, val_windows, cfg.eval_batch_size)
        nll_after = float(tokens_after.double().mean())
    alphas = {key[len("alpha_"):]: a for key, a in modulator.monitor().items() if key.startswith("alpha_")}

    config = {"modulator": to_dict(cfg), "base_hidden_size": lm.config.hidden_size, "geo_scale": geo_scale}
    with atomic_dir(out_dir) as tmp:
        save_modulator(modulator, tmp / MODULATOR_FILE, config)
    change = _gain_pct(nll_before, nll_after)
    lo, hi = cfg.field.cv_band
    cv_after = after["pentachoron"]["pentachoron_cv"]["mean"]
    report = {
        "kind": cfg.kind,
        "val_nll_before": nll_before, "val_nll_after": nll_after, "val_nll_change_pct": change,
        "coherent": change <= 1.0,
        "pearson_before": before["pearson"]["mean"], "pearson_after": after["pearson"]["mean"],
        "pearson_gain_pct": _gain_pct(before["pearson"]["mean"], after["pearson"]["mean"]),
        "spearman_before": before["spearman"]["mean"], "spearman_after": after["spearman"]["mean"],
        "spearman_gain_pct": _gain_pct(before["spearman"]["mean"], after["spearman"]["mean"]),
        "token_spearman_gain_pct": _gain_pct(before["token"]["spearman"]["mean"], after["token"]["spearman"]["mean"]),
        "alpha_mean": float(np.mean(list(alphas.values()))),
        "alpha_per_layer": alphas,
        "cv_band": [lo, hi], "cv_in_band": bool(lo <= cv_after <= hi), "validity_mean": None,
        "layers": layers, "geo_scale": geo_scale, "val_tokens": int(val_windows[:, 1:].numel()),
        "window_set": set_label(labels[0], val_windows), "curve_window_set": set_label(labels[1], windows["curve"]),
        "trained": cfg.trains, "before": before, "after": after,
        # per position, for the NLL change's interval over seeds (nll_claim pops them before the report is written)
        TOKEN_KEY: {"window": val_windows.shape[1] - 1, "before": tokens_before.numpy(), "after": tokens_after.numpy()},
    }
    if cfg.kind == "field":
        validity = field_validity(lm, modulator, val_windows, cfg.eval_batch_size)
        report.update({"validity_mean": float(np.mean(validity)), "experts": list(cfg.field.experts),
                       "validity": {f"l{layer}_k{k}": validity[i][e] for i, layer in enumerate(layers)
                                    for e, k in enumerate(cfg.field.experts)},
                       "health": modulator.health(), "active_dims": len(modulator.active),
                       "parameters": sum(p.numel() for p in modulator.parameters())})
    else:
        with torch.no_grad():
            report["val_matched_token_fraction"] = float(modulator.mask[val_windows[:, :-1].to(device)].mean())
    if result is not None:
        report.update({"train_steps": cfg.train.steps, "train_tokens_per_s": result.tokens_per_s,
                       "train_seconds": result.train_seconds, "resumed_from": result.resumed_from,
                       "stopped_at": result.stopped_at, "stop_reason": result.stop_reason})
    return report, result, curve


def build_modulator_seeds(cfg: ModulatorConfig, acfg: AlignmentConfig, base_dir, tokens_dir, wordnet_dir, wordnet_path,
                          init_file, out_dir, checkpoint_root=None, tracker=None,
                          windows: dict[str, torch.Tensor] | None = None) -> tuple[dict, TrainResult | None, list[dict]]:
    """:func:`build_modulator`, then ``cfg.seeds - 1`` more trainings on other seeds (their
    modulators discarded): the report carries the :data:`SEEDED` figures' mean and sd. The base
    model is measured once, for every seed."""
    base_measures: dict = {}
    return over_seeds(cfg, "modulator", SEEDED, lambda c, scratch: build_modulator(
        c, acfg, base_dir, tokens_dir, wordnet_dir, wordnet_path, init_file, scratch / "modulator" if scratch else out_dir,
        checkpoint_root, None if scratch else tracker, base_measures, windows), gather=nll_claim)
