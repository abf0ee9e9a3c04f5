"""Next-token negative log-likelihood: one cross-entropy for every stage that scores an LM."""

from __future__ import annotations

import torch
import torch.nn.functional as F


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


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-position NLL (B, T) of targets (B, T) under logits (B, T, V)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none").view(targets.shape)
