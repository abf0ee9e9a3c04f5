"""Phase 2 (DESIGN §2 phase2): continued pretraining of the base LM, unfrozen, with per-token
topologies — and the **dense control** (its own stage, ``control``): the same LM trained on the same
windows in the same order for the same steps with the same optimiser and no topology, so every
comparison is at equal tokens. (Two stages rather than one: under ``accelerate launch`` the shared
loop's worker processes exit when a training run ends, so one stage runs one training.)

``decoder: mlp`` — the phase-1 predictor keeps training jointly with the LM under phase 1's loss
(NLL(A) + lambda_head · mean gate + lambda_edge · mean edge weight, τ annealed, straight-through hard
from ``hard_from_step``), with its own params. ``decoder: diffusion`` — every position's topology is
a sample of the frozen diffusion head (a new one each step) and only the LM trains, on NLL.

Data: the context cache's train windows (the predictor needs the context encoder's embedding of
every trained position, and the cache is where those exist), drawn at random per step; the report
says how many passes over the cached windows that is. The cache is small (128 windows at the
default: MiniLM encodes ~140 positions/s on 2 cores), and a few passes over it overfit the LM — the
control's val NLL rose from 4.39 to 5.50 in 12.5 passes. With ``replay`` each step also trains on as
many windows of the whole train stream (the base's pretraining data, drawn like its batches), run
dense in both runs: the LM keeps its general text while it learns to run under the topologies.
The loss is the mean NLL over both halves (plus the sparsity terms). Evaluation: the cache's val windows.

The predictor trains faster than the LM (phase 1 used lr 3e-2; continued pretraining wants ~1e-3):
its parameters are stored as θ = p / c with ``c = predictor_lr_scale`` (``torch.nn.utils.parametrize``)
so that one AdamW over both gives the predictor steps c times the LM's (Adam's step on θ is about lr
whatever the gradient's scale). The saved predictor holds the plain p.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parametrize

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.phase2 import CONFIG_FILE, LM_DIR, PREDICTOR_FILE
from lookahead.core.config import to_dict
from lookahead.core.errors import LookaheadError, require
from lookahead.core.seeds import other_seeds, seeded_headline, with_spread
from lookahead.graph.nodes import n_edges
from lookahead.graph.runtime import forward_with_topology
from lookahead.graph.scoring import GeoLookup
from lookahead.lm.nll import token_nll
from lookahead.train import data
from lookahead.train.loop import TrainConfig, TrainResult, train

DECODERS = ("mlp", "diffusion")


class Phase2Error(LookaheadError, ValueError):
    """Inputs that do not fit phase 2."""


@dataclasses.dataclass
class Phase2Config:
    """Joint continued pretraining; the dense control reads `train`, `replay` and the eval keys (DESIGN §2 phase2)."""

    seeds: int = 3
    """Runs over seeds of training (phase 2 and the dense control each), for each headline figure's mean and `_sd`
    (lookahead.core.seeds); the first, with the configured seeds, writes the outputs."""
    decoder: Literal["mlp", "diffusion"] = "mlp"
    """Topologies from the phase-1 predictor, trained on (`mlp`), or sampled from the frozen diffusion head."""
    lambda_head: float = 0.5
    """mlp: weight of the mean head gate (pushes heads off)."""
    lambda_edge: float = 1.0
    """mlp: weight of the mean active edge weight."""
    tau_start: float = 1.0
    """mlp: edge-sigmoid temperature at step 0."""
    tau_end: float = 1.0
    """mlp: temperature at the last step (geometric annealing in between)."""
    hard_from_step: int = -1
    """mlp: straight-through hard edges and gates from this step on (-1 = never: soft training)."""
    predictor_lr_scale: float = 30.0
    """mlp: the predictor's learning rate as a multiple of train.lr."""
    replay: bool = True
    """Each step also trains on train.batch_size windows of the whole train stream, dense, in both runs."""
    eval_sequences: int = 0
    """Val windows of the context cache used for evaluation (0 = all of them)."""
    eval_batch_size: int = 8
    """Windows per forward pass when evaluating."""
    train: TrainConfig = dataclasses.field(default_factory=lambda: TrainConfig(
        steps=200, batch_size=8, lr=1e-3, warmup_steps=20, eval_every=50, checkpoint_every=50))
    """Optimisation of the LM (and the predictor) — the dense control uses the same (batch_size = windows per step)."""

    def __post_init__(self) -> None:
        require(self.seeds >= 1, "seeds", f"must be >= 1; got {self.seeds}")
        require(self.decoder in DECODERS, "decoder", f"must be one of {', '.join(DECODERS)}; got {self.decoder!r}")
        for name in ("lambda_head", "lambda_edge"):
            value = getattr(self, name)
            require(math.isfinite(value) and value >= 0, name, f"must be a finite number >= 0; got {value}")
        require(math.isfinite(self.tau_start) and self.tau_start > 0, "tau_start", f"must be > 0; got {self.tau_start}")
        require(math.isfinite(self.tau_end) and 0 < self.tau_end <= self.tau_start, "tau_end",
                f"must be in (0, tau_start = {self.tau_start}]; got {self.tau_end}")
        require(-1 <= self.hard_from_step < self.train.steps, "hard_from_step",
                f"must be -1 (never) or a step in [0, train.steps = {self.train.steps}); got {self.hard_from_step}")
        require(math.isfinite(self.predictor_lr_scale) and self.predictor_lr_scale > 0, "predictor_lr_scale",
                f"must be a finite number > 0; got {self.predictor_lr_scale}")
        require(self.eval_sequences >= 0, "eval_sequences", f"must be >= 0 (0 = all); got {self.eval_sequences}")
        require(self.eval_batch_size >= 1, "eval_batch_size", f"must be >= 1; got {self.eval_batch_size}")

    def tau(self, step: int) -> float:
        """τ at ``step``: tau_start · (tau_end / tau_start)^(step / (steps − 1))."""
        progress = min(1.0, step / max(1, self.train.steps - 1))
        return self.tau_start * (self.tau_end / self.tau_start) ** progress


class _Scale(nn.Module):
    """p = c · θ (a parametrisation): AdamW's steps on θ become steps c times larger on p."""

    def __init__(self, c: float):
        super().__init__()
        self.c = c

    def forward(self, theta: torch.Tensor) -> torch.Tensor:
        return theta * self.c

    def right_inverse(self, p: torch.Tensor) -> torch.Tensor:
        return p / self.c


def scale_learning_rate(module: nn.Module, c: float) -> None:
    """Store every parameter of ``module`` as θ = p / c (see :class:`_Scale`)."""
    if c == 1.0:
        return
    for sub in list(module.modules()):
        for name, _ in list(sub.named_parameters(recurse=False)):
            parametrize.register_parametrization(sub, name, _Scale(c))


def plain_parameters(module: nn.Module) -> None:
    """Undo :func:`scale_learning_rate`: plain parameters holding p (for saving)."""
    for sub in list(module.modules()):
        if parametrize.is_parametrized(sub):
            for name in list(sub.parametrizations):
                parametrize.remove_parametrizations(sub, name, leave_parametrized=True)


class Phase2Model(nn.Module):
    """The LM and (decoder mlp) the predictor, as one module so DDP sees every trained parameter."""

    def __init__(self, lm, predictor: nn.Module | None = None):
        super().__init__()
        self.lm = lm
        self.predictor = predictor

    def forward(self, ids: torch.Tensor, contexts: torch.Tensor | None = None, geo: torch.Tensor | None = None,
                tau: float | None = None, hard: bool = False, topology: tuple | None = None):
        """Logits (B, T, V) and the executed topology (A, g); without contexts or a topology the dense forward and None."""
        if self.predictor is not None and contexts is not None:
            topology = self.predictor(contexts, geo, tau=tau, hard=hard)
        if topology is None:
            return self.lm(input_ids=ids).logits, None
        adjacency, gates = topology
        return forward_with_topology(self.lm, ids, adjacency, gates), (adjacency, gates)


def window_rows(seed: int, step: int, n_windows: int, batch_size: int) -> np.ndarray:
    """The cache's train windows of ``step``: the same for phase 2 and the control (equal tokens, same order)."""
    return np.random.default_rng([seed, step, 0, 52]).integers(0, n_windows, batch_size)


class Phase2Module:
    """The step object of phase 2 (``topologies`` given) and of the dense control (``dense=True``)."""

    def __init__(self, model: Phase2Model, cache: ContextCache, geo: GeoLookup, cfg: Phase2Config,
                 denoiser=None, dense: bool = False, stream: np.ndarray | None = None):
        self.model = model
        self.stream = stream if cfg.replay else None  # the train token stream (replay windows)
        self.cache, self.geo, self.cfg = cache, geo, cfg
        self.denoiser = None if dense else denoiser  # decoder diffusion: frozen, samples a topology per position
        self.dense = dense
        predictor = model.predictor
        self.geo_used = predictor is not None and predictor.geo_dim > 0
        self.device = torch.device("cpu")
        n_val = len(cache.windows("val"))
        self.val_rows = np.arange(n_val if cfg.eval_sequences == 0 else min(cfg.eval_sequences, n_val))
        self.last_eval: dict = {}

    def place(self, device) -> None:
        self.device = torch.device(device)
        self.geo = self.geo.to(self.device)
        if self.denoiser is not None:
            self.denoiser.to(self.device)

    def _sample(self, contexts: torch.Tensor, ids: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Raw allowed-edge bits (B, T, E) of one diffusion sample per position."""
        d = self.denoiser
        b, t = ids.shape
        geo = self.geo(ids.to(self.device)).flatten(0, 1) if d.geo_dim else None
        bits = d.sample(contexts.to(self.device).flatten(0, 1), geo, self._steps, generator, self._temperature)
        return bits.view(b, t, -1).to(torch.uint8).cpu()

    def set_sampling(self, steps: int, temperature: float) -> None:
        self._steps, self._temperature = steps, temperature

    def batch(self, step: int) -> dict:
        t = self.cfg.train
        rows = window_rows(t.seed, step, len(self.cache.windows("train")), t.batch_size)
        windows, contexts = self.cache.batch("train", rows)
        out = {"windows": windows}
        if self.stream is not None:  # the same replay windows in both runs
            out["replay"] = data.train_batch(self.stream, step, t.batch_size, self.cache.context_length, t.seed, salt=52)
        if self.dense:
            return out
        if self.denoiser is not None:
            generator = torch.Generator(device=self.device).manual_seed(t.seed * 1_000_003 + step)
            with torch.no_grad():
                out["bits"] = self._sample(contexts, windows[:, :-1], generator)
            return out
        return {**out, "contexts": contexts, "tau": self.cfg.tau(step), "hard": 0 <= self.cfg.hard_from_step <= step}

    def loss(self, model, batch: dict):
        windows = batch["windows"]
        ids, targets = windows[:, :-1], windows[:, 1:]
        parts = {}
        if self.dense:
            logits, _ = model(ids)
        elif self.denoiser is not None:
            topology = self.denoiser.executed(batch["bits"])
            logits, _ = model(ids, topology=topology)
            parts["head_gate"] = topology[1][..., 1:].mean().item()
        else:
            geo = self.geo(ids) if self.geo_used else None
            logits, (adjacency, gates) = model(ids, batch["contexts"], geo, tau=batch["tau"], hard=batch["hard"])
            head = gates[..., 1:].mean()
            edge = adjacency.sum((-2, -1)).mean() / self._n_edges()
            parts.update({"head_gate": head.item(), "edge_weight": edge.item(), "tau": batch["tau"]})
        nll = token_nll(logits, targets).mean()
        parts["nll"] = nll.item()
        if "replay" in batch:  # the stream windows, dense: half of the NLL
            replay = batch["replay"]
            replay_nll = token_nll(model(replay[:, :-1])[0], replay[:, 1:]).mean()
            parts["replay_nll"] = replay_nll.item()
            nll = (nll + replay_nll) / 2
        if self.dense or self.denoiser is not None:
            return nll, parts
        return nll + self.cfg.lambda_head * head + self.cfg.lambda_edge * edge, parts

    def _n_edges(self) -> int:
        p = self.model.predictor
        return n_edges(p.n_layers, p.n_heads)

    def tokens(self, batch: dict) -> int:
        return batch["windows"][:, 1:].numel() + (batch["replay"][:, 1:].numel() if "replay" in batch else 0)

    @torch.no_grad()
    def evaluate(self, model) -> dict[str, float]:
        """Val NLL of the LM dense; with a decoder also under its hard topologies (and soft for mlp)."""
        was_training = model.training
        model.eval()
        sums = {"dense": 0.0, "hard": 0.0, "soft": 0.0, "heads": 0.0}
        positions = 0
        generator = torch.Generator(device=self.device).manual_seed(self.cfg.train.seed)  # same draws every eval
        for i in range(0, len(self.val_rows), self.cfg.eval_batch_size):
            windows, contexts = (x.to(self.device) for x in self.cache.batch("val", self.val_rows[i : i + self.cfg.eval_batch_size]))
            ids, targets = windows[:, :-1], windows[:, 1:]
            sums["dense"] += token_nll(model.lm(input_ids=ids).logits, targets).sum().item()
            positions += targets.numel()
            if self.dense:
                continue
            if self.denoiser is not None:
                adjacency, gates = self.denoiser.executed(self._sample(contexts, ids, generator).to(self.device))
            else:
                geo = self.geo(ids) if self.geo_used else None
                adjacency, gates = model.predictor(contexts, geo, tau=self.cfg.tau_end, hard=False)
                sums["soft"] += token_nll(forward_with_topology(model.lm, ids, adjacency, gates), targets).sum().item()
                adjacency, gates = model.predictor(contexts, geo, tau=self.cfg.tau_end, hard=True)
            hard = forward_with_topology(model.lm, ids, adjacency, gates, hard=True)
            sums["hard"] += token_nll(hard, targets).sum().item()
            sums["heads"] += gates[..., 1:].mean(-1).sum().item()
        model.train(was_training)
        metrics = {"dense_nll": sums["dense"] / positions}
        if not self.dense:
            metrics.update({"hard_nll": sums["hard"] / positions, "active_head_fraction": sums["heads"] / positions})
            if self.denoiser is None:
                metrics["soft_nll"] = sums["soft"] / positions
        self.last_eval = metrics
        return metrics


def checkpoint_dir(root, kind: str, config: dict, cache: ContextCache, files: list[Path]) -> Path | None:
    """A checkpoint directory keyed by ``kind``, the config and the inputs' content (resume only what fits)."""
    import hashlib

    if not root:
        return None
    digest = hashlib.sha256(json.dumps({kind: config}, sort_keys=True).encode())
    digest.update(cache.fingerprint().encode())
    for path in files:
        digest.update(Path(path).read_bytes())
    return Path(root) / digest.hexdigest()[:16]


def save_lm(lm, tokenizer_dir, out_dir: Path, config: dict) -> None:
    """``save_pretrained`` (safetensors) with the base's tokenizer and the resolved config (STYLE 6)."""
    from transformers import AutoTokenizer

    lm.save_pretrained(out_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out_dir)
    (out_dir / "lookahead_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _base_lm(base_dir, n_layers: int | None = None, n_heads: int | None = None, source: str = ""):
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    if n_layers is not None and (lm.config.num_hidden_layers, lm.config.num_attention_heads) != (n_layers, n_heads):
        raise Phase2Error(f"base model ({lm.config.num_hidden_layers} x {lm.config.num_attention_heads} heads) and "
                          f"{source} ({n_layers} x {n_heads}) disagree: rerun `dvc repro phase1`")
    return lm.train()


def _data_report(cfg: Phase2Config, cache: ContextCache, module: Phase2Module, result: TrainResult) -> dict:
    return {
        "train_steps": cfg.train.steps,
        "train_tokens": cfg.train.steps * cfg.train.batch_size * cache.context_length * (2 if cfg.replay else 1),
        "passes_over_cache": cfg.train.steps * cfg.train.batch_size / len(cache.windows("train")),
        "val_positions": int(len(module.val_rows) * cache.context_length),
        "train_tokens_per_s": result.tokens_per_s,
        "train_seconds": result.train_seconds,
    }


# metrics/phase2.json (lookahead.core.report)
# and their spread over training seeds (lookahead.core.seeds)
SEEDED = ("dense_nll", "hard_nll", "soft_nll", "active_head_fraction")
HEADLINE = seeded_headline(("base_val_nll", "start_hard_nll", "dense_nll", "hard_nll", "soft_nll", "active_head_fraction",
                            "start_active_head_fraction", "train_steps", "train_tokens", "passes_over_cache"), SEEDED)


def build_phase2(cfg: Phase2Config, base_dir, tokens_dir, contexts_dir, init_file, predictor_file, diffusion_dir, out_dir,
                 checkpoint_root=None, tracker=None) -> tuple[dict, TrainResult]:
    """Train the phase-2 LM with its decoder; write the LM (and the predictor) to ``out_dir``;
    return the report and the training result."""
    from lookahead.core.atomic import atomic_dir
    from lookahead.graph.denoiser import load_denoiser
    from lookahead.graph.predictor import load_init, load_predictor, save_predictor

    cache = ContextCache(contexts_dir)
    tensors, _ = load_init(init_file)
    geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float())
    predictor, meta = load_predictor(predictor_file)
    if meta["context_dim"] != cache.dim:
        raise Phase2Error(f"predictor {predictor_file} takes {meta['context_dim']}-dim contexts but the cache "
                          f"holds {cache.dim}-dim ones: rerun `dvc repro phase1`")
    denoiser, diffusion_meta = None, {}
    if cfg.decoder == "diffusion":
        denoiser, diffusion_meta = load_denoiser(diffusion_dir)
        denoiser.requires_grad_(False)
        predictor = None

    torch.manual_seed(cfg.train.seed)
    lm = _base_lm(base_dir, meta["n_layers"], meta["n_heads"], f"predictor {predictor_file}")
    if predictor is not None:
        predictor.train()
        scale_learning_rate(predictor, cfg.predictor_lr_scale)
    stream = data.load_stream(tokens_dir, "train") if cfg.replay else None
    module = Phase2Module(Phase2Model(lm, predictor), cache, geo, cfg, denoiser, stream=stream)
    if denoiser is not None:
        settings = diffusion_meta.get("diffusion", {})
        module.set_sampling(int(settings.get("sample_steps", 10)), float(settings.get("sample_temperature", 1.0)))
    files = [Path(init_file), Path(predictor_file), Path(base_dir) / "model.safetensors"]
    files += [Path(tokens_dir) / "train.npy"] if cfg.replay else []
    files += [Path(diffusion_dir) / "model.safetensors"] if denoiser is not None else []
    ckpt = checkpoint_dir(checkpoint_root, "phase2", to_dict(cfg), cache, files)

    start = module.evaluate(module.model)  # the starting point: the base LM under the phase-1 decoder
    result = train(module, cfg.train, stage="phase2", checkpoint_dir=ckpt, tracker=tracker)
    result.eval_curve.insert(0, {"step": 0, **start})
    final = module.last_eval
    config = {"phase2": to_dict(cfg), "decoder": cfg.decoder, "n_layers": meta["n_layers"], "n_heads": meta["n_heads"],
              "encoder": cache.meta["encoder"]}
    with atomic_dir(out_dir) as tmp:
        save_lm(module.model.lm.cpu(), base_dir, tmp / LM_DIR, config)
        if predictor is not None:
            trained = module.model.predictor.cpu()
            plain_parameters(trained)
            save_predictor(trained, tmp / PREDICTOR_FILE, extra={"phase2": to_dict(cfg), "encoder": cache.meta["encoder"]})
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    report = {
        "decoder": cfg.decoder,
        "base_val_nll": start["dense_nll"],
        "start_hard_nll": start["hard_nll"],
        "start_active_head_fraction": start["active_head_fraction"],
        "dense_nll": final["dense_nll"],
        "hard_nll": final["hard_nll"],
        "soft_nll": final.get("soft_nll"),
        "active_head_fraction": final["active_head_fraction"],
        **_data_report(cfg, cache, module, result),
    }
    return report, result


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
    geo = GeoLookup(torch.zeros(1, 1), torch.zeros(1))  # a dense run reads no geometric features
    module = Phase2Module(Phase2Model(_base_lm(base_dir)), cache, geo, cfg, dense=True, stream=stream)
    files = [Path(base_dir) / "model.safetensors"] + ([Path(tokens_dir) / "train.npy"] if cfg.replay else [])
    ckpt = checkpoint_dir(checkpoint_root, "control", control_config(cfg), cache, files)
    start = module.evaluate(module.model)
    result = train(module, cfg.train, stage="control", checkpoint_dir=ckpt, tracker=tracker)
    result.eval_curve.insert(0, {"step": 0, **start})
    with atomic_dir(out_dir) as tmp:
        save_lm(module.model.lm.cpu(), base_dir, tmp, {"control": control_config(cfg)})
    report = {"base_val_nll": start["dense_nll"], "val_nll": module.last_eval["dense_nll"],
              **_data_report(cfg, cache, module, result)}
    return report, result


def build_phase2_seeds(cfg: Phase2Config, base_dir, tokens_dir, contexts_dir, init_file, predictor_file, diffusion_dir,
                       out_dir, checkpoint_root=None, tracker=None) -> tuple[dict, TrainResult]:
    """:func:`build_phase2`, then ``cfg.seeds - 1`` more trainings on other seeds (their LMs
    discarded): the report carries the :data:`SEEDED` figures' mean and sd (lookahead.core.seeds)."""
    report, result = build_phase2(cfg, base_dir, tokens_dir, contexts_dir, init_file, predictor_file, diffusion_dir,
                                  out_dir, checkpoint_root, tracker)
    others = other_seeds(cfg, cfg.seeds, lambda c, scratch: build_phase2(
        c, base_dir, tokens_dir, contexts_dir, init_file, predictor_file, diffusion_dir, scratch / "phase2",
        checkpoint_root)[0], "phase2")
    return with_spread(report, others, SEEDED), result


def build_control_seeds(cfg: Phase2Config, base_dir, tokens_dir, contexts_dir, out_dir, checkpoint_root=None,
                        tracker=None) -> tuple[dict, TrainResult]:
    """:func:`build_control` over ``cfg.seeds`` training seeds, as :func:`build_phase2_seeds`."""
    report, result = build_control(cfg, base_dir, tokens_dir, contexts_dir, out_dir, checkpoint_root, tracker)
    others = other_seeds(cfg, cfg.seeds, lambda c, scratch: build_control(
        c, base_dir, tokens_dir, contexts_dir, scratch / "control", checkpoint_root)[0], "control")
    return with_spread(report, others, CONTROL_SEEDED), result
