"""Phase 2's two controls, each its own stage, trained with phase 2's optimiser and schedule on the
same windows in the same order so that every comparison with phase 2 is at equal tokens:

- ``control``: the base LM trained dense (no topology, NLL alone) — "the same LM trained longer";
- ``static_control``: the base LM trained under static pruning at phase 2's final active-head
  fraction (the stronger static baseline at that head count: importance or the greedy static mask,
  fitted on the fit windows and chosen on the selection windows,
  :mod:`lookahead.artifacts.static_baselines`; the same mask at every token and step, phase 2's
  skip mode and ``distill``) — "static pruning + continued pretraining", the fair baseline of
  "learned per-token routing + continued pretraining".

(Separate stages rather than one: under ``accelerate launch`` the shared loop's worker processes exit
when a training run ends, so one stage runs one training.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
from torch import nn

from lookahead.artifacts.contexts import ContextCache
from lookahead.core.atomic import write_csv
from lookahead.core.config import to_dict
from lookahead.core.devices import eval_mode
from lookahead.core.seeds import kept_seeds, over_seeds
from lookahead.core.windows import set_label
from lookahead.graph.nodes import static_gates, static_topology
from lookahead.graph.plan import execute
from lookahead.graph.runtime import unit_shape
from lookahead.lm.families.base import UNITS
from lookahead.lm.nll import PositionTotals, token_nll
from lookahead.pipeline.phase2.common import Phase2Error, base_lm, data_report
from lookahead.pipeline.phase2.common import curve_rows, load_train_stream
from lookahead.pipeline.phase2.common import routed_loss, save_lm, step_tokens, step_windows, teacher_lm
from lookahead.pipeline.phase2.common import val_batches, val_rows, windows_loss
from lookahead.pipeline.phase2.config import Phase2Config
from lookahead.train.checkpoints import checkpoint_dir
from lookahead.train.loop import TrainResult, train


@dataclasses.dataclass(frozen=True)
class StaticMask:
    """What the static control prunes: a ranking of the heads (L, H) whose top round(fraction · L·H)
    it keeps (``importance``: the stronger static baseline's at that count, or any head ranking in
    tests), the active-head fraction (phase 2's final one), the runtime's skip mode (phase 2's) and
    which ranking it is (``source``)."""

    importance: torch.Tensor
    fraction: float
    skip: str
    source: str = "a given ranking"

    def heads(self) -> list[int]:
        """The heads kept (0 … L·H − 1): the round(fraction · L·H) ranked highest."""
        return static_gates(self.importance, round(self.fraction * self.importance.numel()))[1:].nonzero().flatten().tolist()

    def config(self) -> dict:
        return {"active_head_fraction": self.fraction, "skip": self.skip, "heads": self.heads(), "source": self.source}


class StaticPruned(nn.Module):
    """The LM under one fixed topology, hard: forward(ids) → logits (B, T, V); ``dense=True`` runs
    the stock forward (replay windows) — one module, so DDP sees every forward."""

    def __init__(self, lm, mask: StaticMask):
        super().__init__()
        self.lm = lm
        self.mask = mask
        adjacency, gates = static_topology(mask.importance, mask.fraction, mask.skip)
        self.register_buffer("adjacency", adjacency, persistent=False)  # (N, N)
        self.register_buffer("gates", gates, persistent=False)  # (N,)

    def forward(self, input_ids: torch.Tensor, dense: bool = False, fraction: float | None = None) -> torch.Tensor:
        """``fraction``: another fraction of heads than the mask's (the annealed budget)."""
        if dense:
            return self.lm(input_ids=input_ids).logits
        adjacency, gates = self.adjacency, self.gates
        if fraction is not None:
            adjacency, gates = (x.to(input_ids.device) for x in static_topology(self.mask.importance, fraction,
                                                                                 self.mask.skip))
        return execute(self.lm, input_ids, adjacency, gates, self.mask.skip)  # the off heads' work skipped


class ControlModule:
    """A control's step object for :func:`lookahead.train.loop.train`: the LM dense, or (``mask``)
    under static pruning, distilling from ``teacher`` at ``cfg.distill`` when given one."""

    def __init__(self, lm, cache: ContextCache, cfg: Phase2Config, stream: np.ndarray | None = None,
                 mask: StaticMask | None = None, teacher=None):
        self.model = lm if mask is None or lm is None else StaticPruned(lm, mask)
        self.static, self.mask = mask is not None, mask
        self.cache, self.cfg = cache, cfg
        self.stream = stream  # the train token stream (stream windows, replay)
        self.teacher = teacher  # static control with distill > 0: the frozen dense base
        self.device = torch.device("cpu")
        self.val_rows = val_rows(cfg, cache)
        self.last_eval: dict = {}

    def place(self, device) -> None:
        self.device = torch.device(device)
        if self.teacher is not None:
            self.teacher.to(self.device)

    def batch(self, step: int) -> dict:
        out = step_windows(self.cfg, self.cache, self.stream, step)[0]
        if self.static and self.cfg.budget_warmup:
            out["fraction"] = self.cfg.keep_at(step, self.mask.fraction)
        return out

    def _logits(self, model, ids: torch.Tensor, dense: bool = False, fraction: float | None = None) -> torch.Tensor:
        if self.static:
            return model(ids, dense=dense, fraction=fraction)
        return model(input_ids=ids).logits

    def loss(self, model, batch: dict):
        windows = batch["windows"]
        ids, parts = windows[:, :-1], {}
        logits = self._logits(model, ids, fraction=batch.get("fraction"))
        loss = routed_loss(logits, windows[:, 1:], self.teacher, ids, self.cfg.distill, parts, self.cfg.distill_top_k)
        return windows_loss(loss, batch, lambda x: self._logits(model, x, dense=True), parts), parts

    tokens = staticmethod(step_tokens)

    @torch.no_grad()
    def evaluate(self, model) -> dict[str, float]:
        """Val NLL of the LM on the cache's val windows, dense (phase 2's ``dense_nll``) and, for the
        static control, under its mask (``hard_nll``)."""
        with eval_mode(model):
            totals = PositionTotals()
            lm = model.lm if self.static else model
            for windows, _ in val_batches(self.cache, self.val_rows, self.cfg.eval_batch_size, self.device):
                ids, targets = windows[:, :-1], windows[:, 1:]
                totals.add(targets.numel(), dense=token_nll(lm(input_ids=ids).logits, targets).sum().item())
                if self.static:
                    totals.add(hard=token_nll(model(ids), targets).sum().item())
        self.last_eval = {"dense_nll": totals.mean("dense")}
        if self.static:
            self.last_eval["hard_nll"] = totals.mean("hard")
        return self.last_eval

    @torch.no_grad()
    def score(self, model, batches: list) -> dict[str, np.ndarray]:
        """Per-position NLLs (P,) of the trained LM on the final val set ``batches``
        (:func:`lookahead.pipeline.phase2.score.final_batches`): ``dense`` and, for the static
        control, ``hard`` under its mask (through the execution plan)."""
        out: dict[str, list] = {"dense": [], "hard": []} if self.static else {"dense": []}
        with eval_mode(model):
            lm = model.lm if self.static else model
            for windows, _ in batches:
                ids, targets = windows[:, :-1], windows[:, 1:]
                out["dense"].append(token_nll(lm(input_ids=ids).logits, targets).flatten())
                if self.static:
                    adjacency, gates = model.adjacency, model.gates
                    out["hard"].append(token_nll(execute(lm, ids, adjacency, gates, self.mask.skip), targets).flatten())
        return {k: torch.cat(v).cpu().numpy() for k, v in out.items()}


def control_config(cfg: Phase2Config, mask: StaticMask | None = None) -> dict:
    """The keys of ``phase2`` a control reads (dvc.yaml lists the same), and the static control's mask."""
    out = {"train": to_dict(cfg.train), "windows": cfg.windows, "replay": cfg.replay,
           "eval_sequences": cfg.eval_sequences, "eval_batch_size": cfg.eval_batch_size, "seeds": cfg.seeds}
    if mask is not None:
        out.update(distill=cfg.distill, distill_top_k=cfg.distill_top_k, budget_warmup=cfg.budget_warmup, mask=mask.config())
    return out


def train_control(cfg: Phase2Config, base_dir, tokens_dir, contexts_dir, out_dir, checkpoint_root=None,
                  tracker=None, mask: StaticMask | None = None) -> tuple[dict, TrainResult, ControlModule]:
    """A control of phase 2: the base LM trained with phase 2's optimiser and schedule on the same
    windows in the same order, dense or (``mask``) under static pruning. Writes the LM to
    ``out_dir``; returns (the training figures, the training result, the module). What it scores
    on the scoring windows is :func:`lookahead.pipeline.phase2.score.score_control`'s."""
    from lookahead.core.atomic import atomic_dir

    cache = ContextCache(contexts_dir)
    torch.manual_seed(cfg.train.seed)
    stream = load_train_stream(cfg, tokens_dir)
    teacher = teacher_lm(cfg, base_dir) if mask is not None else None
    lm = base_lm(base_dir)
    if mask is not None and tuple(mask.importance.shape) not in {unit_shape(lm, unit) for unit in UNITS}:
        raise Phase2Error(f"the static mask's ranking {tuple(mask.importance.shape)} and the base model "
                          f"({lm.config.num_hidden_layers} x {lm.config.num_attention_heads} heads, "
                          f"{unit_shape(lm, 'group')[1]} key/value groups) disagree: rerun `dvc repro`")
    module = ControlModule(lm, cache, cfg, stream, mask, teacher)
    stage = "control" if mask is None else "static_control"
    config = control_config(cfg, mask)
    files = [Path(base_dir) / "model.safetensors"] + ([Path(tokens_dir) / "train.npy"] if stream is not None else [])
    ckpt = checkpoint_dir(checkpoint_root, stage, config, files, [cache.fingerprint()])
    start = module.evaluate(module.model)
    result = train(module, cfg.train, stage=stage, checkpoint_dir=ckpt, tracker=tracker)
    result.eval_curve.insert(0, {"step": 0, **start})
    lm = module.model.lm if mask is not None else module.model
    with atomic_dir(out_dir) as tmp:
        save_lm(lm.cpu(), base_dir, tmp, {stage: config})
    if mask is None:
        training = {"base_val_nll": start["dense_nll"]}
    else:
        heads = config["mask"]["heads"]  # StaticMask.config's, listed once
        training = {"start_val_nll": start["hard_nll"], "active_head_fraction": len(heads) / mask.importance.numel(),
                    "heads": heads, "skip": mask.skip}
    training.update(data_report(cfg, cache, module.val_rows, result, len(stream) if stream is not None else 0))
    training["cache_val"] = {"window_set": set_label("cache-val", cache.windows("val")[module.val_rows]),
                             **module.last_eval}
    return training, result, module


def train_control_seeds(cfg: Phase2Config, base_dir, tokens_dir, contexts_dir, out_dir, seeds_dir, checkpoint_root=None,
                        tracker=None, mask: StaticMask | None = None) -> tuple[dict, TrainResult]:
    """The ``control`` and ``static_control`` stages: :func:`train_control` over ``cfg.seeds`` training
    seeds, as :func:`lookahead.pipeline.phase2.build.train_phase2_seeds` (seed i's LM to
    ``seeds_dir``/``seed<i>``); returns (the training report, the primary's training result)."""
    stage = "control" if mask is None else "static_control"
    runs: list[dict] = []

    def run(c: Phase2Config, scratch: Path | None) -> tuple[dict, TrainResult]:
        offset = c.train.seed - cfg.train.seed
        training, result, _ = train_control(c, base_dir, tokens_dir, contexts_dir,
                                            seed_out(offset, scratch / stage) if scratch else out_dir, checkpoint_root,
                                            None if scratch else tracker, mask)
        runs.append(training)
        return training, result

    with kept_seeds(seeds_dir) as seed_out:
        _, result = over_seeds(cfg, stage, (), run)
    return {"seeds": len(runs), "per_seed": runs}, result


def write_control_reports(result, outputs: dict) -> None:
    """A control stage's curves: training loss and val NLL per step (the static control's: under its
    mask, with the same LM run dense beside)."""
    write_csv(outputs["train_curve"], curve_rows(result.train_curve, ["step", "loss", "nll", "kl", "replay_nll", "lr"]))
    write_csv(outputs["eval_curve"], [{"step": r["step"], "val_nll": r.get("hard_nll", r["dense_nll"]),
                                       **({"dense_nll": r["dense_nll"]} if "hard_nll" in r else {})}
                                      for r in result.eval_curve])
