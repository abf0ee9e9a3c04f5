"""The oracle stage (issue: a router that gets most of the greedy oracle): label-free per-position
targets for phase 1, computed once per base LM, budget and skip mode.

For ``windows`` train windows drawn from the train token stream (a seeded draw of its own, not only
the context cache's), the frozen base LM gives, at every position, the greedy oracle's removal
order down to the configured budget (:func:`lookahead.graph.oracle.greedy_order`: its keep set at
that budget and at any larger one) and every head's leave-one-out KL (the cost of the greedy
oracle's first step: no extra forward). The layout is
:mod:`lookahead.artifacts.oracle_targets`'s. Deterministic: the same inputs give the same bytes.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Literal

import torch

from lookahead.artifacts.oracle_targets import META_FILE, TARGETS_FILE
from lookahead.core.atomic import atomic_dir, atomic_file
from lookahead.core.config import OMIT_DEFAULT, to_dict
from lookahead.core.devices import resolve_device
from lookahead.core.errors import require
from lookahead.graph.nodes import keep_count, top_k_gates
from lookahead.graph.oracle import GREEDY_ROWS, greedy_targets
from lookahead.graph.runtime import unit_shape
from lookahead.train import data
from lookahead.train.checkpoints import checkpoint_dir


@dataclasses.dataclass
class OracleConfig:
    """Train windows of the oracle's targets (issue: a router that gets most of the greedy oracle)."""

    windows: int = 256
    """Train windows of ``base.arch.context_length`` tokens drawn from the train stream (seeded)."""
    seed: int = 0
    """Seed of the draw."""
    rows: int = GREEDY_ROWS
    """Sequences per forward of the greedy oracle (one window × candidate removals)."""
    per_round: int = 1
    """Heads each position drops per greedy step (1: the exact greedy oracle; more: fewer steps)."""
    candidates: int = 0
    """Heads each position tries per greedy step after the first, those of lowest latest cost (a lazy
    greedy; 0: every head still on, the exact oracle). Phase 1's report uses the same search."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """`auto` = CUDA when available."""
    keep: float | None = dataclasses.field(default=None, metadata=OMIT_DEFAULT)
    """Share of the heads the search goes down to (null: ``predictor.keep``, the router's budget).
    The removal order down to a deeper budget holds the keep set of every budget at or above it (the
    same sets a search stopped there finds), so one deeper oracle serves routers at several shares."""

    def __post_init__(self) -> None:
        require(self.windows >= 1, "windows", f"must be >= 1; got {self.windows}")
        require(self.keep is None or 0 < self.keep <= 1, "keep", f"must be in (0, 1] or null; got {self.keep}")
        require(self.rows >= 1, "rows", f"must be >= 1; got {self.rows}")
        require(self.seed >= 0, "seed", f"must be >= 0; got {self.seed}")
        require(self.per_round >= 1, "per_round", f"must be >= 1; got {self.per_round}")
        require(self.candidates == 0 or self.candidates >= self.per_round, "candidates",
                f"must be 0 (every head still on) or >= per_round ({self.per_round}); got {self.candidates}")


def read_keep(params_path: str | Path) -> float:
    """``predictor.keep`` of a params file, the share of heads the oracle keeps (validated here, as the
    predictor's section does, so that the oracle stage does not import the predictor)."""
    from lookahead.core.config import read_params
    from lookahead.core.errors import ConfigError

    value = (read_params(params_path).get("predictor") or {}).get("keep", 0.5)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ConfigError("predictor.keep", f"must be in (0, 1]; got {value!r}")
    return float(value)


# metrics/oracle.json (lookahead.core.report); timings stay in the report
HEADLINE = ("windows", "positions", "heads_kept", "skip", "loo_greedy_agreement")


def build_oracle(cfg: OracleConfig, keep_fraction: float, skip: str, context_length: int, base_dir, tokens_dir,
                 out_dir, unit: str = "head", checkpoint_root=None) -> dict:
    """Compute the targets and write them atomically to ``out_dir``; return the stage's metrics.
    ``unit``: the routing unit whose nodes the oracle removes (``runtime.unit``). ``checkpoint_root``:
    each window's targets are kept there as they finish (under a digest of the config and inputs),
    so that a killed run resumes at the first window not done; the targets are the same bytes (each
    window's are its own). The checkpoints go once the output is written."""
    from safetensors.torch import load_file, save_file
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM

    require(cfg.keep is None or cfg.keep <= keep_fraction, "keep",
            f"the search must reach the router's budget (predictor.keep {keep_fraction}); got {cfg.keep}")
    device = resolve_device(cfg.device, "oracle.device")
    lm = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval().to(device)
    n_layers, n_heads = unit_shape(lm, unit)
    total = n_layers * n_heads
    k = keep_count(total, n_layers, keep_fraction if cfg.keep is None else cfg.keep, per_layer=False)
    windows = data.train_batch(data.load_stream(tokens_dir, "train"), step=0, batch_size=cfg.windows,
                               seq_len=context_length, seed=cfg.seed, salt=43)
    ckpt = checkpoint_dir(checkpoint_root, "oracle", {"config": to_dict(cfg), "keep": k, "skip": skip, "unit": unit,
                                                      "context_length": context_length},
                          [Path(base_dir) / "model.safetensors", Path(tokens_dir) / "train.npy"])
    order, loo, computed = [], [], 0
    tic = time.perf_counter()
    for i, window in enumerate(tqdm(windows, desc="oracle (greedy; its first step: leave-one-out)", unit="window",
                                    mininterval=5)):
        done = None if ckpt is None else ckpt / f"window{i:05d}.safetensors"
        if done is not None and done.is_file():  # a window an earlier, killed run finished
            kept = load_file(str(done))
            order.append(kept["greedy_order"])
            loo.append(kept["loo_kl"])
            continue
        steps, first = greedy_targets(lm, window[None, :-1].to(device), n_layers, n_heads, k, skip, cfg.rows,
                                      per_round=cfg.per_round, candidates=cfg.candidates)
        order.append(steps[0].to(torch.int16).cpu())
        loo.append(first[0].float().cpu())
        computed += 1
        if done is not None:
            done.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(done) as tmp:
                save_file({"greedy_order": order[-1].contiguous(), "loo_kl": loo[-1].contiguous()}, str(tmp))
    seconds = time.perf_counter() - tic
    if computed < len(windows):
        print(f"oracle: {len(windows) - computed} of {len(windows)} windows read back from {ckpt}", file=sys.stderr)
    order_t, loo_t = torch.stack(order), torch.stack(loo)
    # how often the two oracles keep the same heads: |loo top-K ∩ greedy keep set| / K
    agreement = (top_k_gates(loo_t, k)[..., 1:] * (order_t.long() == total)).sum(-1).double().mean().item() / k
    with atomic_dir(out_dir) as tmp:
        save_file({"windows": windows.contiguous(), "greedy_order": order_t.contiguous(), "loo_kl": loo_t.contiguous()},
                  str(tmp / TARGETS_FILE))
        meta = {"skip": skip, "keep": k, "keep_fraction": keep_fraction, "n_layers": n_layers, "n_heads": n_heads,
                **({"unit": unit} if unit != "head" else {}),
                "windows": cfg.windows, "context_length": context_length, "config": to_dict(cfg)}
        (Path(tmp) / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if ckpt is not None:
        shutil.rmtree(ckpt, ignore_errors=True)
    positions = cfg.windows * context_length
    return {"windows": cfg.windows, "positions": positions, "heads_kept": k, "skip": skip,
            "loo_greedy_agreement": agreement,
            "positions_per_s": computed * context_length / max(seconds, 1e-9), "oracle_seconds": seconds}
