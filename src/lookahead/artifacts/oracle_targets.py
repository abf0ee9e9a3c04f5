"""Read side of the oracle stage's targets (written by :mod:`lookahead.pipeline.oracle`): train
windows drawn from the token stream, with each position's greedy label-free oracle removal order
and leave-one-out KL of every head under the frozen base LM (:mod:`lookahead.graph.oracle`), for
phase 1 to distil from.

Layout (a few big files)::

    <dir>/targets.safetensors   windows (W, T+1) int64, greedy_order (W, T, L·H) int16 (the step a
                                head was dropped, L·H for the heads kept), loo_kl (W, T, L·H) float32
    <dir>/meta.json             skip mode, heads kept, shape, the stage's params (its greedy search:
                                ``per_round`` and ``candidates``, the exact oracle when absent)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lookahead.core.errors import LookaheadError

TARGETS_FILE = "targets.safetensors"
META_FILE = "meta.json"


class OracleTargetsError(LookaheadError, ValueError):
    """Oracle targets that are missing or do not fit the run reading them."""


class OracleTargets:
    """The oracle stage's windows and targets, in memory (a few MB at the default)."""

    def __init__(self, directory: str | Path):
        from safetensors.torch import load_file

        self.dir = Path(directory)
        meta, tensors = self.dir / META_FILE, self.dir / TARGETS_FILE
        if not meta.is_file() or not tensors.is_file():
            raise OracleTargetsError(f"oracle targets {self.dir} not found or incomplete: run `dvc repro oracle`")
        self.meta = json.loads(meta.read_text(encoding="utf-8"))
        loaded = load_file(str(tensors))
        self.windows = loaded["windows"]
        self.greedy_order = loaded["greedy_order"].long()
        self.loo_kl = loaded["loo_kl"]
        self.skip, self.keep = self.meta["skip"], int(self.meta["keep"])
        config = self.meta.get("config", {})  # the greedy search (lookahead.graph.oracle.greedy_targets); exact if absent
        self.search = {"per_round": int(config.get("per_round", 1)), "candidates": int(config.get("candidates", 0))}
        n = len(self.windows)
        if self.greedy_order.shape[:2] != (n, self.windows.shape[1] - 1) or self.loo_kl.shape != self.greedy_order.shape:
            raise OracleTargetsError(f"oracle targets {self.dir}: arrays of different shapes "
                                     "(run `dvc checkout oracle` or `dvc repro -f oracle`)")

    def __len__(self) -> int:
        return len(self.windows)

    def check(self, skip: str, keep: int, n_heads_total: int, context_length: int) -> None:
        """Refuse targets made for another skip mode, head count or window length, or a search that
        stopped above the budget ``keep`` (one that went deeper holds its keep sets: ``oracle.keep``)."""
        found = (self.skip, self.keep, self.greedy_order.shape[-1], self.windows.shape[1] - 1)
        want = (skip, keep, n_heads_total, context_length)
        if (found[0], *found[2:]) != (want[0], *want[2:]) or self.keep > keep:
            raise OracleTargetsError(
                f"oracle targets {self.dir} were made for (skip, heads kept, heads, context length) = {found}, "
                f"this run needs {want} (or fewer heads kept): rerun `dvc repro oracle` (runtime.skip, "
                "predictor.keep, oracle.keep and the base LM are its parameters)")

    def scores(self, target: str, rows) -> torch.Tensor:
        """(B, T, L·H) scores whose top-K per position is the target's keep set: the greedy
        oracle's removal order (``greedy``, its kept heads highest) or the leave-one-out KL (``loo``)."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        return (self.greedy_order if target == "greedy" else self.loo_kl)[rows].float()
