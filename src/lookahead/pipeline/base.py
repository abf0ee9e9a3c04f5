"""The base causal LM (docs/pipeline.md): pretrained from scratch as OLMo2, or snapshotted from a
hub id, a local directory or a GGUF file (dequantized). The output is always a ``save_pretrained`` directory (safetensors)
that embeds the resolved config it was built with (``lookahead_config.json``, STYLE 6).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import torch

from lookahead.core.atomic import atomic_dir
from lookahead.core.config import to_dict
from lookahead.core.environment import environment
from lookahead.core.errors import require
from lookahead.lm.nll import causal_lm_nll, evaluate_nll
from lookahead.lm.olmo2 import ArchConfig, head_dim_of, olmo2_config
from lookahead.lm.source import ModelSource
from lookahead.train import data
from lookahead.train.checkpoints import checkpoint_dir
from lookahead.train.loop import TrainConfig, TrainResult, train

CONFIG_FILE = "lookahead_config.json"


@dataclasses.dataclass
class BaseConfig(ModelSource):
    """Where the base model comes from (see :class:`ModelSource`), and how a scratch one is trained."""

    eval_tokens: int = 200_000
    """Val tokens scored for the final metrics (0 = the whole val stream)."""
    periodic_eval_tokens: int = 32_768
    """Val tokens scored at each periodic evaluation during training."""
    eval_batch_size: int = 16
    """Windows per forward pass when evaluating."""
    init_perturbation: float = 0.0
    """Share of a scratch model's initial weights moved by one float32 ulp (seeded, away from or
    towards zero at random) before training: 0 leaves the initialisation untouched; ``make
    replicate`` sets 1e-4 to emulate the bits another machine's base LM differs in (docs/reproducibility.md).
    A loaded base (`path`/`hub`/`gguf`) is the same bytes on every machine: there the share of its
    loaded weights is moved, standing in for the last bits another CPU's arithmetic changes downstream
    (the oracles' searches, the trained routers and LMs), not for another base LM."""
    arch: ArchConfig = dataclasses.field(default_factory=ArchConfig)
    """Scratch architecture; a loaded base (`path`/`hub`/`gguf`) reads only context_length, its evaluation window."""
    train: TrainConfig = dataclasses.field(default_factory=lambda: TrainConfig(steps=800, lr=3e-3))
    """Scratch pretraining; a loaded base ignores it."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.eval_tokens >= 0, "eval_tokens", f"must be >= 0 (0 = all); got {self.eval_tokens}")
        require(self.periodic_eval_tokens >= 1, "periodic_eval_tokens", f"must be >= 1; got {self.periodic_eval_tokens}")
        require(self.eval_batch_size >= 1, "eval_batch_size", f"must be >= 1; got {self.eval_batch_size}")
        require(0.0 <= self.init_perturbation < 1.0, "init_perturbation",
                f"must be in [0, 1) (a share of the weights); got {self.init_perturbation}")


class LMTrainModule:
    """Next-token pretraining on a token stream: the base stage's step object for :func:`train`."""

    def __init__(self, model, train_stream: np.ndarray, val_windows: torch.Tensor, cfg: BaseConfig):
        self.model = model
        self.train_stream = train_stream
        self.val_windows = val_windows  # (n_eval, T+1): a fixed subset for periodic evaluation
        self.cfg = cfg

    def batch(self, step: int) -> torch.Tensor:
        t = self.cfg.train
        return data.train_batch(self.train_stream, step, t.batch_size, self.cfg.arch.context_length, t.seed)

    def loss(self, model, batch: torch.Tensor) -> torch.Tensor:
        return causal_lm_nll(model, batch)

    def evaluate(self, model) -> dict[str, float]:
        nll = evaluate_nll(model, self.val_windows, self.cfg.eval_batch_size)
        return {"val_nll": nll}

    def tokens(self, batch: torch.Tensor) -> int:
        return batch[:, 1:].numel()


PERTURB_SALT = 7_919  # the perturbation's own generator: the init's global RNG stream is left as it was


def perturb_ulp(model: torch.nn.Module, fraction: float, seed: int) -> int:
    """Move a seeded ``fraction`` of ``model``'s float32 parameter entries by exactly one ulp, each
    towards +inf or -inf at random; returns how many moved. ``fraction == 0`` touches nothing
    (not even an RNG), so a default run stays byte-identical."""
    if fraction == 0.0:
        return 0
    gen = torch.Generator().manual_seed(seed * 1_000_003 + PERTURB_SALT)
    moved = 0
    with torch.no_grad():
        for _, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            require(param.dtype == torch.float32, "init_perturbation",
                    f"a one-ulp move is defined here for float32 weights; got {param.dtype}")
            flat = param.view(-1)
            picked = torch.rand(flat.numel(), generator=gen) < fraction
            up = torch.rand(flat.numel(), generator=gen) < 0.5
            towards = torch.where(up, torch.tensor(math.inf), torch.tensor(-math.inf))
            flat[picked] = torch.nextafter(flat[picked], towards[picked])
            moved += int(picked.sum())
    return moved


def pretrain(cfg: BaseConfig, tokenizer, tokens_dir: str | Path, checkpoint_root: str | Path | None, tracker=None):
    """Pretrain a scratch OLMo2 on the train stream. Returns (model, TrainResult)."""
    from transformers import Olmo2ForCausalLM

    train_stream = data.load_stream(tokens_dir, "train")
    val_stream = data.load_stream(tokens_dir, "val")
    t = cfg.arch.context_length
    periodic = data.eval_windows(val_stream, t, max_tokens=cfg.periodic_eval_tokens)
    torch.manual_seed(cfg.train.seed)
    model = Olmo2ForCausalLM(olmo2_config(cfg.arch, tokenizer))
    perturb_ulp(model, cfg.init_perturbation, cfg.train.seed)
    module = LMTrainModule(model, train_stream, periodic, cfg)
    ckpt = checkpoint_dir(checkpoint_root, "base", to_dict(cfg),
                          [Path(tokens_dir) / f"{split}.npy" for split in ("train", "val")])
    result = train(module, cfg.train, stage="base", checkpoint_dir=ckpt, tracker=tracker)
    return module.model, result


def final_metrics(model, tokens_dir: str | Path, cfg: BaseConfig, vocab_size: int) -> dict:
    """Held-out NLL and perplexity of ``model``, and the unigram NLL of the same targets."""
    val_stream = data.load_stream(tokens_dir, "val")
    windows = data.eval_windows(val_stream, cfg.arch.context_length, cfg.eval_tokens)
    nll = evaluate_nll(model, windows, cfg.eval_batch_size)
    unigram = data.unigram_nll(data.load_stream(tokens_dir, "train"), windows[:, 1:].numpy(), vocab_size)
    return {
        "val_nll": nll,
        "val_ppl": math.exp(nll),
        "val_unigram_nll": unigram,
        "val_nll_below_unigram": unigram - nll,
        "val_tokens_scored": int(windows[:, 1:].numel()),
    }


def save_model(model, tokenizer, cfg: BaseConfig, out_dir: str | Path) -> None:
    """``save_pretrained`` (safetensors) + the tokenizer + the resolved config, atomically."""
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / CONFIG_FILE).write_text(json.dumps(to_dict(cfg), indent=2) + "\n", encoding="utf-8")


# metrics/base.json (lookahead.core.report); throughput stays in the report
HEADLINE = ("val_nll", "val_ppl", "val_unigram_nll", "parameters", "train_steps")

def build_base(cfg: BaseConfig, tokenizer, tokens_dir: str | Path, out_dir: str | Path,
               checkpoint_root: str | Path | None = None, tracker=None) -> tuple[dict, TrainResult | None]:
    """Produce the base model directory; return (metrics, training result or None)."""
    result = None
    if cfg.source == "scratch":
        model, result = pretrain(cfg, tokenizer, tokens_dir, checkpoint_root, tracker)
    else:
        model = cfg.load_model()
        perturb_ulp(model, cfg.init_perturbation, cfg.train.seed)  # the replicate's (0: the file's bytes as loaded)
        if cfg.train.device != "cpu" and torch.cuda.is_available():
            model.to("cuda")  # evaluation of a hub-sized model wants the GPU
    model.eval()
    metrics = final_metrics(model, tokens_dir, cfg, vocab_size=max(len(tokenizer), model.config.vocab_size))
    cfg_model = model.config
    metrics.update({
        "n_layers": cfg_model.num_hidden_layers,
        "n_heads": cfg_model.num_attention_heads,
        "head_dim": head_dim_of(cfg_model),  # the attention's width over n_heads (base.arch.head_dim)
        "hidden_size": cfg_model.hidden_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_tokens_per_s": result.tokens_per_s if result else None,
        "train_seconds": result.train_seconds if result else None,
        "train_wall_s": result.wall_seconds if result else None,
        "train_steps": cfg.train.steps if result else 0,
        # what the base LM's floats depend on besides its inputs: another CPU or library trains another LM
        "environment": environment(),
    })
    save_model(model, tokenizer, cfg, out_dir)
    return metrics, result
