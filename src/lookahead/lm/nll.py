"""Next-token negative log-likelihood: one cross-entropy for every stage that scores an LM."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lookahead.core.devices import eval_mode


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "none") -> torch.Tensor:
    """The one next-token cross-entropy: logits (B, T, V) in float32 against targets (B, T);
    ``reduction`` as torch's ("none": flat (B·T,))."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction=reduction)


def causal_lm_nll(model, windows: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """NLL of tokens 1..T of each window given the ones before. windows: (B, T+1)."""
    return cross_entropy(model(input_ids=windows[:, :-1]).logits, windows[:, 1:], reduction)


@torch.no_grad()
def evaluate_nll(model, windows: torch.Tensor, batch_size: int, device: torch.device | None = None) -> float:
    """Mean NLL per target token over all ``windows`` (N, T+1)."""
    device = device or next(model.parameters()).device
    with eval_mode(model):
        total, count = 0.0, 0
        for i in range(0, len(windows), batch_size):
            chunk = windows[i : i + batch_size].to(device)
            total += causal_lm_nll(model, chunk, reduction="sum").item()
            count += chunk[:, 1:].numel()
    return total / count


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-position NLL (B, T) of targets (B, T) under logits (B, T, V)."""
    return cross_entropy(logits, targets).view(targets.shape)


class PositionTotals:
    """Running sums of per-position figures (NLLs, active fractions) over evaluation batches, and
    their means per position: how every stage that scores an LM on val windows accumulates."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.positions = 0

    def add(self, positions: int = 0, **sums: float) -> None:
        """Count ``positions`` more positions; add each figure's sum over a batch."""
        self.positions += positions
        for name, value in sums.items():
            self.sums[name] = self.sums.get(name, 0.0) + value

    def mean(self, name: str) -> float:
        """The figure's sum divided by the positions counted."""
        return self.sums[name] / self.positions
