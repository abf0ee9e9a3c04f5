"""The base causal LM (DESIGN §2 base): pretrained from scratch as OLMo2, or snapshotted from a
hub id or a local directory. The output is always a ``save_pretrained`` directory (safetensors)
that embeds the resolved config it was built with (``lookahead_config.json``, STYLE 6).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lookahead import data
from lookahead.atomic import atomic_dir
from lookahead.config import require, to_dict
from lookahead.source import ModelSource
from lookahead.trainer import TrainConfig, TrainResult, train

CONFIG_FILE = "lookahead_config.json"


@dataclasses.dataclass
class ArchConfig:
    """Shape of a scratch OLMo2 model (``transformers.Olmo2Config``)."""

    n_layers: int = 4
    """Transformer blocks."""
    n_heads: int = 4
    """Attention heads per block (must divide hidden_size)."""
    hidden_size: int = 128
    """Residual stream width."""
    intermediate_size: int = 512
    """SwiGLU MLP width."""
    context_length: int = 128
    """Training sequence length, also max_position_embeddings."""
    rope_theta: float = 10000.0
    """RoPE base."""
    rms_norm_eps: float = 1.0e-6
    """Epsilon of every RMSNorm."""
    tie_word_embeddings: bool = False
    """Share the input embedding and the LM head (OLMo-2 does not)."""
    init_std: float = 0.02
    """Std of the normal initialisation of weight matrices."""

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_heads", "hidden_size", "intermediate_size", "context_length"):
            require(getattr(self, name) >= 1, name, f"must be >= 1; got {getattr(self, name)}")
        require(
            self.hidden_size % self.n_heads == 0,
            "n_heads",
            f"must divide hidden_size ({self.hidden_size}); got {self.n_heads}",
        )
        require((self.hidden_size // self.n_heads) % 2 == 0, "hidden_size",
                f"hidden_size / n_heads must be even for RoPE; got {self.hidden_size}/{self.n_heads}")
        require(self.rope_theta > 0, "rope_theta", f"must be > 0; got {self.rope_theta}")
        require(self.rms_norm_eps > 0, "rms_norm_eps", f"must be > 0; got {self.rms_norm_eps}")
        require(self.init_std > 0, "init_std", f"must be > 0; got {self.init_std}")


@dataclasses.dataclass
class BaseConfig(ModelSource):
    """Where the base model comes from (see :class:`ModelSource`), and how a scratch one is trained."""

    eval_tokens: int = 200_000
    """Val tokens scored for the final metrics (0 = the whole val stream)."""
    periodic_eval_tokens: int = 32_768
    """Val tokens scored at each periodic evaluation during training."""
    eval_batch_size: int = 16
    """Windows per forward pass when evaluating."""
    arch: ArchConfig = dataclasses.field(default_factory=ArchConfig)
    """Scratch architecture; with `path`/`hub`, context_length is the evaluation window."""
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    """Scratch pretraining."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.eval_tokens >= 0, "eval_tokens", f"must be >= 0 (0 = all); got {self.eval_tokens}")
        require(self.periodic_eval_tokens >= 1, "periodic_eval_tokens", f"must be >= 1; got {self.periodic_eval_tokens}")
        require(self.eval_batch_size >= 1, "eval_batch_size", f"must be >= 1; got {self.eval_batch_size}")


def olmo2_config(arch: ArchConfig, tokenizer):
    """The ``Olmo2Config`` of a scratch model for ``tokenizer``."""
    from transformers import Olmo2Config

    return Olmo2Config(
        vocab_size=len(tokenizer),
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.n_layers,
        num_attention_heads=arch.n_heads,
        num_key_value_heads=arch.n_heads,
        max_position_embeddings=arch.context_length,
        rope_parameters={"rope_type": "default", "rope_theta": arch.rope_theta},
        rms_norm_eps=arch.rms_norm_eps,
        initializer_range=arch.init_std,
        tie_word_embeddings=arch.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def causal_lm_nll(model, windows: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """NLL of tokens 1..T of each window given the ones before. windows: (B, T+1)."""
    logits = model(input_ids=windows[:, :-1]).logits  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1).float(), windows[:, 1:].flatten(), reduction=reduction)


@torch.no_grad()
def evaluate_nll(model, windows: torch.Tensor, batch_size: int, device: torch.device | None = None) -> float:
    """Mean NLL per target token over all ``windows`` (N, T+1)."""
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        chunk = windows[i : i + batch_size].to(device)
        total += causal_lm_nll(model, chunk, reduction="sum").item()
        count += chunk[:, 1:].numel()
    model.train(was_training)
    return total / count


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


def config_hash(cfg: BaseConfig) -> str:
    return hashlib.sha256(json.dumps(to_dict(cfg), sort_keys=True).encode()).hexdigest()[:16]


def pretrain(cfg: BaseConfig, tokenizer, tokens_dir: str | Path, checkpoint_root: str | Path | None, tracker=None):
    """Pretrain a scratch OLMo2 on the train stream. Returns (model, TrainResult)."""
    from transformers import Olmo2ForCausalLM

    train_stream = data.load_stream(tokens_dir, "train")
    val_stream = data.load_stream(tokens_dir, "val")
    t = cfg.arch.context_length
    periodic = data.eval_windows(val_stream, t, max_tokens=cfg.periodic_eval_tokens)
    torch.manual_seed(cfg.train.seed)
    model = Olmo2ForCausalLM(olmo2_config(cfg.arch, tokenizer))
    module = LMTrainModule(model, train_stream, periodic, cfg)
    ckpt = Path(checkpoint_root) / config_hash(cfg) if checkpoint_root else None
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


# metrics/base.json (lookahead.report); throughput stays in the report
HEADLINE = ("val_nll", "val_ppl", "val_unigram_nll", "parameters", "train_steps")

def build_base(cfg: BaseConfig, tokenizer, tokens_dir: str | Path, out_dir: str | Path,
               checkpoint_root: str | Path | None = None, tracker=None) -> tuple[dict, TrainResult | None]:
    """Produce the base model directory; return (metrics, training result or None)."""
    result = None
    if cfg.source == "scratch":
        model, result = pretrain(cfg, tokenizer, tokens_dir, checkpoint_root, tracker)
    else:
        model = cfg.load_model()
        if cfg.train.device != "cpu" and torch.cuda.is_available():
            model.to("cuda")  # evaluation of a hub-sized model wants the GPU
    model.eval()
    metrics = final_metrics(model, tokens_dir, cfg, vocab_size=max(len(tokenizer), model.config.vocab_size))
    cfg_model = model.config
    metrics.update({
        "n_layers": cfg_model.num_hidden_layers,
        "n_heads": cfg_model.num_attention_heads,
        "hidden_size": cfg_model.hidden_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_tokens_per_s": result.tokens_per_s if result else None,
        "train_seconds": result.train_seconds if result else None,
        "train_wall_s": result.wall_seconds if result else None,
        "train_steps": cfg.train.steps if result else 0,
    })
    save_model(model, tokenizer, cfg, out_dir)
    return metrics, result
