"""What phase 2 and its two controls (dense, static) share, so that all three train on the same
windows in the same order: the step's windows (fresh windows of the train stream, or the context
cache's), the loss over them and the replay windows, distillation from the frozen base, the base LM,
saving and the data report. The periodic evaluation (the curves, the ``start_`` figures) scores the
cache's val windows.

The final figures' windows (the scoring set, :mod:`lookahead.artifacts.val_scores`) are
``score_phase2``'s alone (:func:`lookahead.pipeline.phase2.score.final_batches`): no training stage
imports the scoring windows, so a new test set or window role rescores and retrains nothing."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lookahead.artifacts.contexts import ContextCache
from lookahead.core.errors import LookaheadError
from lookahead.lm.nll import token_nll
from lookahead.pipeline.phase2.config import DECODER_INPUTS, DECODER_MODULES, Phase2Config
from lookahead.train import data
from lookahead.train.loop import TrainResult


class Phase2Error(LookaheadError, ValueError):
    """Inputs that do not fit phase 2."""


def window_rows(seed: int, step: int, n_windows: int, batch_size: int) -> np.ndarray:
    """The cache's train windows of ``step`` (``windows: cache``): the same in every run."""
    return np.random.default_rng([seed, step, 0, 52]).integers(0, n_windows, batch_size)


def load_train_stream(cfg: Phase2Config, tokens_dir) -> np.ndarray | None:
    """The train token stream when a run draws from it (``windows: stream`` or ``replay``), else None."""
    return data.load_stream(tokens_dir, "train") if cfg.windows == "stream" or cfg.replay else None


def step_windows(cfg: Phase2Config, cache: ContextCache, stream: np.ndarray | None,
                 step: int) -> tuple[dict, torch.Tensor | None]:
    """({``windows``: (B, T+1) the windows of ``step``, with ``replay``: (B, T+1) more of the train
    stream when configured}, the cache's contexts of the windows (B, T, C), None for ``stream``):
    the same in phase 2 and both controls. ``stream`` windows are drawn like the base's batches
    (:func:`lookahead.train.data.train_batch`, salt 52; replay salt 53)."""
    t = cfg.train
    if cfg.windows == "stream":
        out = {"windows": data.train_batch(stream, step, t.batch_size, cache.context_length, t.seed, salt=52)}
        contexts = None
    else:
        rows = window_rows(t.seed, step, len(cache.windows("train")), t.batch_size)
        windows, contexts = cache.batch("train", rows)
        out = {"windows": windows}
    if cfg.replay:
        salt = 53 if cfg.windows == "stream" else 52  # the cache path keeps its earlier draws
        out["replay"] = data.train_batch(stream, step, t.batch_size, cache.context_length, t.seed, salt=salt)
    return out, contexts


def val_rows(cfg: Phase2Config, cache: ContextCache) -> np.ndarray:
    """The cache's val windows both runs are scored on."""
    n_val = len(cache.windows("val"))
    return np.arange(n_val if cfg.eval_sequences == 0 else min(cfg.eval_sequences, n_val))


def val_batches(cache: ContextCache, rows: np.ndarray, batch_size: int, device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(windows (B, T+1), contexts (B, T, C)) of the val ``rows``, batch by batch, on ``device``."""
    for i in range(0, len(rows), batch_size):
        windows, contexts = cache.batch("val", rows[i : i + batch_size])
        yield windows.to(device), contexts.to(device)


def top_k_kl(logits: torch.Tensor, ref_logp: torch.Tensor, k: int) -> torch.Tensor:
    """Mean KL(p ‖ q) over positions between the teacher's distribution p (log-probabilities
    ``ref_logp`` (…, V)) and the student's q = softmax(``logits``), both coarsened to the teacher's
    k most likely words plus one tail bucket holding the rest of the mass: Σ_{i ∈ top-k} p_i log(p_i /
    q_i) + p_tail log(p_tail / q_tail). It is 0 iff q agrees with p on those k words (and so on the
    tail's mass), and it never exceeds the full KL (coarsening never increases a KL)."""
    top_logp, index = ref_logp.topk(k, dim=-1)  # (…, k)
    logq_all = torch.log_softmax(logits.float(), -1)
    logq = logq_all.gather(-1, index)
    p = top_logp.exp()
    tail_p = (1 - p.sum(-1)).clamp_min(0.0)
    tail_logq = torch.log1p(-logq.exp().sum(-1).clamp_max(1 - 1e-6))
    head = (p * (top_logp - logq)).sum(-1)
    tail = torch.where(tail_p > 0, tail_p * (tail_p.clamp_min(1e-30).log() - tail_logq), torch.zeros_like(tail_p))
    return (head + tail).mean()


def routed_loss(logits: torch.Tensor, targets: torch.Tensor, teacher, ids: torch.Tensor, distill: float,
                parts: dict, top_k: int = 0) -> torch.Tensor:
    """The loss of the routed windows: mean NLL, mixed with the KL from the frozen ``teacher``'s
    next-token distribution at weight ``distill`` ((1 − w) NLL + w KL; no teacher: NLL), over the
    whole vocabulary or (``top_k`` > 0) the teacher's top-k words and a tail bucket
    (:func:`top_k_kl`). ``parts`` gets ``nll`` (and ``kl``)."""
    nll = token_nll(logits, targets).mean()
    parts["nll"] = nll.item()
    if teacher is None or distill == 0:
        return nll
    with torch.no_grad():
        ref = torch.log_softmax(teacher(input_ids=ids).logits.float(), -1)  # (B, T, V)
    if top_k:
        kl = top_k_kl(logits, ref, top_k)
    else:
        with torch.no_grad():
            p = ref.exp()
            entropy = -(p * ref).sum(-1).mean()
        # KL(p ‖ q) = H(p, q) − H(p): torch's fused cross-entropy with probability targets (a third
        # faster than the KL written out, the same gradient)
        kl = F.cross_entropy(logits.flatten(0, 1).float(), p.flatten(0, 1)) - entropy
    parts["kl"] = kl.item()
    return (1 - distill) * nll + distill * kl


def windows_loss(loss: torch.Tensor, batch: dict, dense_logits: Callable[[torch.Tensor], torch.Tensor],
                 parts: dict) -> torch.Tensor:
    """The LM loss of a step: the windows' loss, averaged with the replay windows' mean NLL when the
    batch has them (``dense_logits``: ids (B, T) -> (B, T, V), through the trained model's wrapper
    so that DDP sees the forward); ``parts`` gets ``replay_nll``."""
    if "replay" not in batch:
        return loss
    replay = batch["replay"]
    replay_nll = token_nll(dense_logits(replay[:, :-1]), replay[:, 1:]).mean()
    parts["replay_nll"] = replay_nll.item()
    return (loss + replay_nll) / 2


def step_tokens(batch: dict) -> int:
    """Target tokens of one step (cache windows and replay)."""
    return batch["windows"][:, 1:].numel() + (batch["replay"][:, 1:].numel() if "replay" in batch else 0)


def save_lm(lm, tokenizer_dir, out_dir: Path, config: dict) -> None:
    """``save_pretrained`` (safetensors) with the base's tokenizer and the resolved config (STYLE 6)."""
    from transformers import AutoTokenizer

    lm.save_pretrained(out_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out_dir)
    (out_dir / "lookahead_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def teacher_lm(cfg: Phase2Config, base_dir):
    """The frozen dense base the routed runs distill from (``distill`` > 0), else None."""
    if cfg.distill == 0:
        return None
    return base_lm(base_dir).eval().requires_grad_(False)


def base_lm(base_dir, n_layers: int | None = None, n_heads: int | None = None, source: str = "", unit: str = "head"):
    """The base LM in float32, in training mode; with ``n_layers``/``n_heads`` (nodes per layer under
    the routing ``unit``), checked against ``source`` (the predictor or denoiser it must fit)."""
    from transformers import AutoModelForCausalLM

    from lookahead.graph.runtime import unit_shape

    lm = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    if n_layers is not None and unit_shape(lm, unit) != (n_layers, n_heads):
        found = unit_shape(lm, unit)
        raise Phase2Error(f"base model ({found[0]} x {found[1]} {unit}s) and {source} ({n_layers} x {n_heads}) "
                          "disagree: rerun `dvc repro phase1`")
    return lm.train()


def data_report(cfg: Phase2Config, cache: ContextCache, val_rows: np.ndarray, result: TrainResult,
                stream_tokens: int = 0) -> dict:
    """The tokens a run trained on (over the cache's windows or the ``stream_tokens``-long train
    stream: passes) and the val positions it was scored on (every run alike)."""
    windows = cfg.train.steps * cfg.train.batch_size
    tokens = windows * cache.context_length * (2 if cfg.replay else 1)
    from_stream = tokens if cfg.windows == "stream" else tokens // 2 if cfg.replay else 0  # replay: half
    return {
        "windows": cfg.windows,
        "train_steps": cfg.train.steps,
        "train_tokens": tokens,
        "passes_over_cache": windows / len(cache.windows("train")) if cfg.windows == "cache" else None,
        "passes_over_stream": from_stream / stream_tokens if stream_tokens else None,
        "val_positions": int(len(val_rows) * cache.context_length),
        "train_tokens_per_s": result.tokens_per_s,
        "train_seconds": result.train_seconds,
    }


def curve_rows(curve: list[dict], columns: list[str]) -> list[dict]:
    """A training or eval curve's rows restricted to ``columns`` (a missing or None value: blank)."""
    return [{k: r.get(k, "") if r.get(k) is not None else "" for k in columns} for r in curve]


def decoder_sampler(decoder: str, diffusion_dir, gate_kind: str):
    """The frozen diffusion head's :class:`TopologySampler` under ``decoder: diffusion`` (its module
    imported by name: :data:`lookahead.pipeline.phase2.config.DECODER_MODULES`); None under ``mlp``."""
    if decoder not in DECODER_MODULES:
        return None
    sampler = importlib.import_module(DECODER_MODULES[decoder]).TopologySampler
    try:
        return sampler(diffusion_dir, gate_kind)
    except LookaheadError as err:
        raise Phase2Error(f"phase2.decoder {decoder}: {err} (dvc.yaml passes decoder_inputs.weights: "
                          f"{DECODER_INPUTS[decoder]['weights']} there)") from err
