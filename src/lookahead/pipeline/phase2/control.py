"""The dense control of phase 2 (its own stage, ``control``): the base LM trained with phase 2's
optimiser and schedule on the same windows in the same order (cache windows and replay), with no
topology, so that every comparison with phase 2 is at equal tokens. (Two stages rather than one:
under ``accelerate launch`` the shared loop's worker processes exit when a training run ends, so
one stage runs one training.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from lookahead.artifacts.contexts import ContextCache
from lookahead.core.config import to_dict
from lookahead.core.devices import eval_mode
from lookahead.core.seeds import other_seeds, seeded_headline, with_spread
from lookahead.lm.nll import PositionTotals, token_nll
from lookahead.pipeline.phase2.common import base_lm, data_report, save_lm, step_tokens
from lookahead.pipeline.phase2.common import step_windows, val_batches, val_rows, windows_loss
from lookahead.pipeline.phase2.config import Phase2Config
from lookahead.train import data
from lookahead.train.checkpoints import checkpoint_dir
from lookahead.train.loop import TrainResult, train


class ControlModule:
    """The control's step object for :func:`lookahead.train.loop.train`: the LM alone, dense."""

    def __init__(self, lm, cache: ContextCache, cfg: Phase2Config, stream: np.ndarray | None = None):
        self.model = lm
        self.cache, self.cfg = cache, cfg
        self.stream = stream if cfg.replay else None  # the train token stream (replay windows)
        self.device = torch.device("cpu")
        self.val_rows = val_rows(cfg, cache)
        self.last_eval: dict = {}

    def place(self, device) -> None:
        self.device = torch.device(device)

    def batch(self, step: int) -> dict:
        return step_windows(self.cfg, self.cache, self.stream, step)[0]

    def loss(self, model, batch: dict):
        windows = batch["windows"]
        parts: dict = {}
        nll = token_nll(model(input_ids=windows[:, :-1]).logits, windows[:, 1:]).mean()
        return windows_loss(nll, batch, lambda ids: model(input_ids=ids).logits, parts), parts

    tokens = staticmethod(step_tokens)

    @torch.no_grad()
    def evaluate(self, model) -> dict[str, float]:
        """Val NLL of the LM on the cache's val windows (phase 2's ``dense_nll``)."""
        with eval_mode(model):
            totals = PositionTotals()
            for windows, _ in val_batches(self.cache, self.val_rows, self.cfg.eval_batch_size, self.device):
                ids, targets = windows[:, :-1], windows[:, 1:]
                totals.add(targets.numel(), dense=token_nll(model(input_ids=ids).logits, targets).sum().item())
        self.last_eval = {"dense_nll": totals.mean("dense")}
        return self.last_eval


def control_config(cfg: Phase2Config) -> dict:
    """The keys of ``phase2`` the dense control reads (dvc.yaml lists the same)."""
    return {"train": to_dict(cfg.train), "replay": cfg.replay, "eval_sequences": cfg.eval_sequences,
            "eval_batch_size": cfg.eval_batch_size, "seeds": cfg.seeds}


# metrics/control.json (lookahead.core.report)
CONTROL_SEEDED = ("val_nll",)
CONTROL_HEADLINE = seeded_headline(("base_val_nll", "val_nll", "train_steps", "train_tokens", "passes_over_cache"),
                                   CONTROL_SEEDED)


def build_control(cfg: Phase2Config, base_dir, tokens_dir, contexts_dir, out_dir, checkpoint_root=None,
                  tracker=None) -> tuple[dict, TrainResult]:
    """The dense control of phase 2: the base LM trained with phase 2's optimiser and schedule on
    the same windows in the same order (cache windows and replay), no topology. Writes the LM to
    ``out_dir``; returns the report and the training result."""
    from lookahead.core.atomic import atomic_dir

    cache = ContextCache(contexts_dir)
    torch.manual_seed(cfg.train.seed)
    stream = data.load_stream(tokens_dir, "train") if cfg.replay else None
    module = ControlModule(base_lm(base_dir), cache, cfg, stream)
    files = [Path(base_dir) / "model.safetensors"] + ([Path(tokens_dir) / "train.npy"] if cfg.replay else [])
    ckpt = checkpoint_dir(checkpoint_root, "control", control_config(cfg), files, [cache.fingerprint()])
    start = module.evaluate(module.model)
    result = train(module, cfg.train, stage="control", checkpoint_dir=ckpt, tracker=tracker)
    result.eval_curve.insert(0, {"step": 0, **start})
    with atomic_dir(out_dir) as tmp:
        save_lm(module.model.cpu(), base_dir, tmp, {"control": control_config(cfg)})
    report = {"base_val_nll": start["dense_nll"], "val_nll": module.last_eval["dense_nll"],
              **data_report(cfg, cache, module.val_rows, result)}
    return report, result


def build_control_seeds(cfg: Phase2Config, base_dir, tokens_dir, contexts_dir, out_dir, checkpoint_root=None,
                        tracker=None) -> tuple[dict, TrainResult]:
    """:func:`build_control` over ``cfg.seeds`` training seeds, as :func:`build_phase2_seeds`."""
    report, result = build_control(cfg, base_dir, tokens_dir, contexts_dir, out_dir, checkpoint_root, tracker)
    others = other_seeds(cfg, cfg.seeds, lambda c, scratch: build_control(
        c, base_dir, tokens_dir, contexts_dir, scratch / "control", checkpoint_root)[0], "control")
    return with_spread(report, others, CONTROL_SEEDED), result
