"""The one training loop (STYLE 5): base pretraining, phase 1, diffusion and phase 2 all use it.

A phase supplies a small :class:`TrainModule` (the model, how to get batch ``step``, the loss, an
evaluation); the loop owns everything else: AdamW, linear warmup + cosine decay, gradient clipping,
HF Accelerate (so ``accelerate launch`` runs it data-parallel, docs/scaling.md), the NaN/inf guard,
periodic evaluation, tqdm progress, MLflow step metrics, and checkpoint/resume.

Data parallelism: the module hands out the global batch of a step; each of N processes keeps its
contiguous share of the rows and DDP averages the gradients, so N processes follow the same
trajectory as one (up to floating-point summation order) at the same ``batch_size``.

Resuming is exact: batches are a pure function of the step (see :mod:`lookahead.train.data`), and the
checkpoint holds model, optimizer, scheduler, RNG state and the curves so far, so an interrupted
run that resumes ends with the same weights as one that never stopped.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Literal, Protocol

import numpy as np
import torch
from tqdm import tqdm

from lookahead.core.checkpointing import activation_checkpointing
from lookahead.core.config import OMIT_DEFAULT, to_dict
from lookahead.core.errors import ConfigError, LookaheadError, require
from lookahead.core.seeds import following
from lookahead.train.checkpoints import (CHECKPOINT_FILE, CheckpointError, rng_state, save_checkpoint,
                                         set_rng_state)



class NonFiniteLoss(LookaheadError, FloatingPointError):
    """A loss or gradient norm became NaN or infinite; the stage stops."""


@dataclasses.dataclass
class TrainConfig:
    """Optimisation, evaluation and checkpoint cadence of one training phase."""

    steps: int = 1000
    """Optimizer steps."""
    batch_size: int = 32
    """Sequences per optimizer step over all processes (each of N processes takes batch_size / N)."""
    lr: float = 1.0e-3
    """Peak learning rate (AdamW)."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of `lr` (end of the cosine)."""
    warmup_steps: int = 100
    """Linear warmup steps from 0 to `lr`."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay, on matrices only (not norms or biases)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.95
    """AdamW beta2."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 = no clipping)."""
    eval_every: int = 200
    """Evaluate every N steps (and after the last step)."""
    log_every: int = 10
    """Record training loss every N steps."""
    checkpoint_every: int = 200
    """Save a resumable checkpoint every N steps (0 = never)."""
    seed: int = 0
    """Seed of initialisation and of the batch draw."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """`auto` = CUDA when available."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """`bf16` = autocast to bfloat16 (weights and optimizer stay fp32)."""
    accumulate: int = dataclasses.field(default=1, metadata=OMIT_DEFAULT)
    """Micro-batches per optimizer step: each process's share of a step's batch runs as this many
    equal slices, forward and backward one after another, their gradients summed (Accelerate's
    gradient accumulation) before one clip and one AdamW step: the same step as one pass over the
    batch for a loss that is a mean over windows, at 1/accumulate of the activation memory."""
    checkpoint_activations: bool = dataclasses.field(default=False, metadata=OMIT_DEFAULT)
    """Keep only each decoder layer's inputs in the forward pass and recompute the layer in the
    backward pass (torch.utils.checkpoint), in every forward a stage trains through: the head-graph
    runtime, the execution plan and the stock forward (lookahead.core.checkpointing)."""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_every", "log_every", "accumulate"):
            require(getattr(self, name) >= 1, name, f"must be >= 1; got {getattr(self, name)}")
        for name in ("warmup_steps", "checkpoint_every", "seed"):
            require(getattr(self, name) >= 0, name, f"must be >= 0; got {getattr(self, name)}")
        require(self.lr > 0, "lr", f"must be > 0; got {self.lr}")
        require(0.0 <= self.min_lr_ratio <= 1.0, "min_lr_ratio", f"must be in [0, 1]; got {self.min_lr_ratio}")
        require(self.weight_decay >= 0, "weight_decay", f"must be >= 0; got {self.weight_decay}")
        require(0.0 <= self.beta1 < 1.0, "beta1", f"must be in [0, 1); got {self.beta1}")
        require(0.0 <= self.beta2 < 1.0, "beta2", f"must be in [0, 1); got {self.beta2}")
        require(self.grad_clip >= 0, "grad_clip", f"must be >= 0 (0 = off); got {self.grad_clip}")
        require(self.batch_size % self.accumulate == 0, "accumulate",
                f"must divide batch_size ({self.batch_size}) into equal micro-batches; got {self.accumulate}")


class TrainModule(Protocol):
    """What a phase supplies to :func:`train`."""

    model: torch.nn.Module
    """Holds every trainable parameter (frozen ones have requires_grad=False)."""

    def batch(self, step: int) -> Any:
        """The global batch of ``step`` (``batch_size`` rows, on CPU): a tensor, or a dict/tuple of
        tensors with rows first and other values. Each process keeps its own contiguous share of
        the rows, so any number of processes trains on the same data."""

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor | tuple[torch.Tensor, dict[str, float]]:
        """Scalar training loss of ``batch`` under ``model`` (the prepared, maybe wrapped, model);
        optionally with a dict of named parts (floats), recorded beside the loss in the curve."""

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """Periodic evaluation metrics (e.g. ``{"val_nll": ...}``)."""

    def tokens(self, batch: Any) -> int:
        """Tokens processed by one batch (for throughput)."""

    # Optional: ``place(device)``, called once before training, moves what the module holds
    # besides ``model`` (a frozen LM, lookup tables) to the training device;
    # ``lr_scale(name) -> float``, the learning rate of parameter ``name`` as a multiple of lr;
    # ``stop_reason(eval_curve) -> str | None``, asked after every evaluation: a reason ends
    # training there (early stopping; the result's ``stopped_at`` and ``stop_reason``).


@dataclasses.dataclass
class TrainResult:
    train_curve: list[dict[str, float]]
    """Rows of step, loss, lr, grad_norm."""
    eval_curve: list[dict[str, float]]
    """Rows of step and the module's evaluation metrics."""
    tokens_per_s: float
    """Training throughput over all processes, evaluation time excluded."""
    train_seconds: float
    """Time spent in training steps (evaluation and checkpoints excluded), resumed runs included."""
    wall_seconds: float
    """Wall time of this call, evaluations and checkpoints included (a resumed run: since resuming)."""
    resumed_from: int
    """Step the run resumed from (0 = fresh start)."""
    stopped_at: int | None = None
    """Step at which the module's ``stop_reason`` ended training early (None = ran every step)."""
    stop_reason: str | None = None


def lr_lambda(cfg: TrainConfig):
    """Multiplier of ``cfg.lr`` at a step: linear warmup, then cosine down to ``min_lr_ratio``."""

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        span = max(1, cfg.steps - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def _param_groups(module: TrainModule, weight_decay: float, lr: float) -> list[dict]:
    """Matrices with weight decay, vectors without; one such pair per learning-rate scale the
    module asks for (``lr_scale(name)``, optional: 1 for every parameter without it)."""
    scale_of = getattr(module, "lr_scale", lambda name: 1.0)
    groups: dict[tuple[float, bool], list] = {}
    for name, param in module.model.named_parameters():
        if param.requires_grad:
            scale = float(scale_of(name))
            groups.setdefault((scale, True), [])
            groups.setdefault((scale, False), [])
            groups[scale, param.ndim >= 2].append(param)
    if not groups:
        groups[1.0, True], groups[1.0, False] = [], []
    return [{"params": params, "weight_decay": weight_decay if decay else 0.0, "lr": lr * scale}
            for (scale, decay), params in groups.items()]


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


def logs_step(step: int, cfg: TrainConfig) -> bool:
    """Whether :func:`train` writes a training-curve row after step ``step`` (0-based): every
    ``log_every`` steps and the last. A module whose loss computes a figure only for the curve can
    skip it on the other steps (the row holds the logged step's figures alone)."""
    done = step + 1
    return done % cfg.log_every == 0 or done == cfg.steps


def rank_rows(batch: Any, rank: int, world: int, rows: int) -> Any:
    """Process ``rank``'s share of a global batch: rows ``[rank * rows / world, (rank + 1) * rows / world)``
    of every tensor or numpy array with ``rows`` rows; other values as they are."""
    if world == 1:
        return batch
    if isinstance(batch, (torch.Tensor, np.ndarray)):  # row indices (numpy) are rows too
        if batch.ndim == 0 or batch.shape[0] != rows:
            return batch
        share = rows // world
        return batch[rank * share : (rank + 1) * share]
    if isinstance(batch, dict):
        return {k: rank_rows(v, rank, world, rows) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(rank_rows(v, rank, world, rows) for v in batch)
    return batch


def step_gradients(accelerator, model, module: TrainModule, batch: Any, cfg: TrainConfig, stage: str, step: int,
                   lr: Callable[[], float]) -> tuple[float, dict[str, float]]:
    """The gradients of one optimizer step over this process's ``batch``, left in ``.grad`` (not
    clipped): ``cfg.accumulate`` micro-batches of equal rows, each forward and backward inside
    ``accelerator.accumulate`` (no gradient all-reduce before the last; each loss divided by their
    count), with layers checkpointed when ``cfg.checkpoint_activations``. Returns the step's loss
    (the mean over micro-batches and processes) and its named parts (means over micro-batches).

    Raises:
        NonFiniteLoss: a micro-batch's loss is NaN or infinite on some process.
    """
    world, k = accelerator.num_processes, cfg.accumulate
    rows = cfg.batch_size // world
    values: list[float] = []
    parts_sum: dict[str, float] = {}
    with activation_checkpointing(cfg.checkpoint_activations, module.model, getattr(module, "lm", None)):
        for i in range(k):
            micro = rank_rows(batch, i, k, rows)
            with accelerator.accumulate(model):
                with accelerator.autocast():
                    loss = module.loss(model, micro)
                loss, parts = loss if isinstance(loss, tuple) else (loss, {})
                # every process sees every process's loss, so a NaN on one stops all of them at this
                # step (one process raising alone would leave the others waiting in the all-reduce)
                losses = accelerator.gather(loss.detach().float().reshape(1)).tolist() if world > 1 else [loss.item()]
                value = sum(losses) / len(losses)
                if not math.isfinite(value):
                    where = next(r for r, v in enumerate(losses) if not math.isfinite(v))
                    on = f" on process {where} of {world}" if world > 1 else ""
                    micro_at = f" (micro-batch {i + 1} of {k})" if k > 1 else ""
                    raise NonFiniteLoss(f"{stage}: training loss is {losses[where]} at step {step}{micro_at}{on} "
                                        f"(lr {lr():.3g}); stopping")
                accelerator.backward(loss)  # divided by k: the micro-batches' mean
            values.append(value)
            for name, part in parts.items():
                parts_sum[name] = parts_sum.get(name, 0.0) + part
    if k == 1:
        return values[0], parts
    return sum(values) / k, {name: total / k for name, total in parts_sum.items()}


def train(
    module: TrainModule,
    cfg: TrainConfig,
    *,
    stage: str,
    checkpoint_dir: str | Path | None = None,
    tracker: Any = None,
    keep_checkpoint: bool = False,
) -> TrainResult:
    """Train ``module.model`` in place for ``cfg.steps`` steps.

    Args:
        stage: name used in progress bars and error messages.
        checkpoint_dir: where resumable state lives; an existing checkpoint there is resumed
            from. Give each distinct config its own directory. None disables checkpointing.
        tracker: a :class:`lookahead.core.tracking.StageRun` (or None) receiving step metrics.
        keep_checkpoint: keep the checkpoint after success (default: remove it).

    Under ``accelerate launch`` with N processes only the main process returns; the others exit
    (status 0) once training has ended, since what follows training is the main process's job —
    except inside a research stage's seed runs (:func:`lookahead.core.seeds.following`), where
    they return too and go on to the next seed's training.

    One function of ~160 lines on purpose: the order of its steps — RNG draws, batch split over
    processes, optimiser and schedule, NaN guard, evaluation, checkpoint save and resume — is the
    contract a resumed run must replay exactly (tests/test_trainer.py), and it reads top to bottom.
    Raises:
        NonFiniteLoss: with the stage, step and value, when loss or gradient norm is NaN/inf.
    """
    from accelerate import Accelerator, DistributedDataParallelKwargs

    wall_start = time.perf_counter()
    use_cpu = cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available())
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"{stage}: train.device is 'cuda' but no CUDA device is available")
    # a router trains only some of its parameters on a given step (e.g. phase 1 before its hard
    # gates start): DDP must not wait for gradients that do not come
    accelerator = Accelerator(cpu=use_cpu, mixed_precision="bf16" if cfg.precision == "bf16" else "no",
                              gradient_accumulation_steps=cfg.accumulate,
                              kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    world, rank = accelerator.num_processes, accelerator.process_index
    if cfg.batch_size % world:
        raise ConfigError("train.batch_size", f"must be divisible by the number of processes ({world}); "
                          f"got {cfg.batch_size} (stage {stage})")
    if cfg.batch_size % (world * cfg.accumulate):
        raise ConfigError("train.accumulate", f"must divide each process's {cfg.batch_size // world} windows "
                          f"({cfg.batch_size} over {world} processes) into equal micro-batches; got "
                          f"{cfg.accumulate} (stage {stage})")
    torch.manual_seed(cfg.seed)
    if hasattr(module, "place"):
        module.place(accelerator.device)

    optimizer = torch.optim.AdamW(
        _param_groups(module, cfg.weight_decay, cfg.lr), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=False
    )
    # The scheduler is stepped by hand once per optimizer step (accelerate's prepared scheduler
    # would step once per process), so the schedule is the same for any number of processes.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    model, optimizer = accelerator.prepare(module.model, optimizer)

    ckpt_path = Path(checkpoint_dir) / CHECKPOINT_FILE if checkpoint_dir else None
    start, train_curve, eval_curve, tokens_done, seconds_done = 0, [], [], 0, 0.0
    if ckpt_path and ckpt_path.is_file():
        try:
            state = torch.load(ckpt_path, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - truncated, garbled or foreign: all mean the same here
            raise CheckpointError(
                f"{stage}: checkpoint {ckpt_path} cannot be read ({type(err).__name__}: {str(err).splitlines()[0][:200]}); "
                f"delete it to train from step 0: rm -r {ckpt_path.parent}") from None
        if state["config"] != to_dict(cfg):
            raise CheckpointError(f"{stage}: checkpoint {ckpt_path} was written by another config; "
                                  f"delete it to train from step 0: rm -r {ckpt_path.parent}")
        accelerator.unwrap_model(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        start, train_curve, eval_curve = state["step"], state["train_curve"], state["eval_curve"]
        tokens_done, seconds_done = state["tokens"], state["seconds"]
        accelerator.print(f"{stage}: resuming from step {start} ({ckpt_path})")
    resumed_from = start

    def save(step: int) -> None:
        if ckpt_path and accelerator.is_main_process:
            save_checkpoint(ckpt_path, {
                "model": accelerator.unwrap_model(model).state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": rng_state(),
                "step": step,
                "train_curve": train_curve,
                "eval_curve": eval_curve,
                "tokens": tokens_done,
                "seconds": seconds_done,
                "config": to_dict(cfg),
            })
        accelerator.wait_for_everyone()

    def run_eval(step: int) -> None:
        # every process evaluates the unwrapped model (no collectives), so all hold the same curve
        model.eval()
        with torch.no_grad(), accelerator.autocast():
            metrics = module.evaluate(accelerator.unwrap_model(model))
        model.train()
        eval_curve.append({"step": step, **metrics})
        if tracker is not None and accelerator.is_main_process:
            tracker.log_metrics(metrics, step=step)

    model.train()
    stopped_at, stop_reason = None, None
    bar = tqdm(
        range(start, cfg.steps), desc=stage, initial=start, total=cfg.steps, unit="step",
        disable=not accelerator.is_local_main_process, mininterval=1.0,
    )
    tic = time.perf_counter()
    for step in bar:
        batch = _to_device(rank_rows(module.batch(step), rank, world, cfg.batch_size), accelerator.device)
        loss_value, parts = step_gradients(accelerator, model, module, batch, cfg, stage, step,
                                           lambda: scheduler.get_last_lr()[0])
        grad_norm = (
            accelerator.clip_grad_norm_(model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
        )
        grad_norm = float(grad_norm)
        if not math.isfinite(grad_norm):
            raise NonFiniteLoss(f"{stage}: gradient norm is {grad_norm} at step {step} (loss {loss_value:.4f}); stopping")
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        tokens_done += module.tokens(batch) * world

        done = step + 1
        if logs_step(step, cfg):
            seconds_now = seconds_done + time.perf_counter() - tic
            row = {"step": done, "loss": loss_value, "lr": lr, "grad_norm": grad_norm, **parts}
            train_curve.append(row)
            bar.set_postfix(loss=f"{loss_value:.3f}", lr=f"{lr:.2e}")
            if tracker is not None and accelerator.is_main_process:
                tracker.log_metrics({"train_loss": loss_value, "lr": lr, "grad_norm": grad_norm,
                                     "tokens_per_s": tokens_done / max(seconds_now, 1e-9),
                                     **{f"train_{k}": v for k, v in parts.items()}}, step=done)
        if done % cfg.eval_every == 0 or done == cfg.steps:
            seconds_done += time.perf_counter() - tic
            run_eval(done)
            tic = time.perf_counter()
            stop_reason = module.stop_reason(eval_curve) if hasattr(module, "stop_reason") else None
            if stop_reason is not None:
                stopped_at = done
                accelerator.print(f"{stage}: stopping early at step {done}: {stop_reason}")
                break
        if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < cfg.steps:
            seconds_done += time.perf_counter() - tic
            save(done)
            tic = time.perf_counter()
    seconds_done += time.perf_counter() - tic
    bar.close()

    if ckpt_path and not keep_checkpoint and accelerator.is_main_process:
        shutil.rmtree(ckpt_path.parent, ignore_errors=True)
    accelerator.wait_for_everyone()
    if not accelerator.is_main_process and not following():
        # Everything after training (final evaluation, writing outputs, tracking) is the main
        # process's: the others are done (unless a stage's other seeds will train with them).
        accelerator.end_training()
        raise SystemExit(0)
    module.model = accelerator.unwrap_model(model)
    return TrainResult(
        train_curve=train_curve,
        eval_curve=eval_curve,
        tokens_per_s=tokens_done / max(seconds_done, 1e-9),
        train_seconds=seconds_done,
        wall_seconds=time.perf_counter() - wall_start,
        resumed_from=resumed_from,
        stopped_at=stopped_at,
        stop_reason=stop_reason,
    )
