"""Two small additions to an OLMo2 LM that start as the plain model, the controls of learned
connectivity (:mod:`lookahead.graph.connectivity`):

- :class:`ValueResidual` — value residual learning (ResFormer, Zhou et al. 2024): layer l ≥ 1 uses
  values λ₁ₗ · v_l + λ₂ₗ · v_0, v_0 the first layer's values of the same position, with λ₁ = 1,
  λ₂ = 0 at the start. Cross-layer connectivity that is not a head DAG: it acts through the stock
  forward (hooks on the value projections), not through the head-graph runtime.
- :class:`OutputLoRA` — a low-rank adapter on every layer's attention output projection,
  W_O + B A (B = 0 at the start), as a reparametrisation of the weight, so every execution path
  (stock forward, head-graph runtime, execution plan) sees it. The parameter-matched baseline of
  dynamic connectivity trained with the LM frozen.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.utils import parametrize


class ValueResidual(nn.Module):
    """λ (L − 1, 2) of the layers after the first: [λ₁, λ₂] = [1, 0] at the start. :meth:`attach`
    hooks it into an LM's value projections (the stock forward only)."""

    def __init__(self, n_layers: int):
        super().__init__()
        self.mix = nn.Parameter(torch.tensor([[1.0, 0.0]]).repeat(n_layers - 1, 1))
        self._first: torch.Tensor | None = None
        self._handles: list = []

    def attach(self, lm) -> ValueResidual:
        layers = lm.model.layers
        if len(layers) != self.mix.shape[0] + 1:
            raise ValueError(f"value residual for {self.mix.shape[0] + 1} layers; the LM has {len(layers)}")
        self.detach()
        self._handles.append(layers[0].self_attn.v_proj.register_forward_hook(self._keep_first))
        for idx, layer in enumerate(layers[1:]):
            self._handles.append(layer.self_attn.v_proj.register_forward_hook(self._mixer(idx)))
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _keep_first(self, module, inputs, output):
        self._first = output

    def _mixer(self, idx: int):
        def hook(module, inputs, output):
            if self._first is None or self._first.shape != output.shape:
                raise RuntimeError("value residual: the first layer's values of this forward are missing")
            return self.mix[idx, 0] * output + self.mix[idx, 1] * self._first
        return hook


class _LowRank(nn.Module):
    """W + B A (a parametrisation of a weight (out, in))."""

    def __init__(self, out_features: int, in_features: int, rank: int):
        super().__init__()
        self.a = nn.Parameter(torch.empty(rank, in_features))
        nn.init.kaiming_uniform_(self.a, a=math.sqrt(5))  # nn.Linear's initialisation
        self.b = nn.Parameter(torch.zeros(out_features, rank))  # the plain weight at the start

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight + self.b @ self.a


class OutputLoRA(nn.Module):
    """Rank-r adapters (B A) on every layer's ``o_proj.weight``, B = 0 at the start: :meth:`attach`
    registers them as parametrisations (the LM's own weights stay as they are)."""

    def __init__(self, n_layers: int, hidden: int, rank: int):
        super().__init__()
        self.adapters = nn.ModuleList([_LowRank(hidden, hidden, rank) for _ in range(n_layers)])

    def attach(self, lm) -> OutputLoRA:
        for layer, adapter in zip(lm.model.layers, self.adapters, strict=True):
            parametrize.register_parametrization(layer.self_attn.o_proj, "weight", adapter)
        return self

    @staticmethod
    def merge(lm) -> None:
        """Fold the adapters into the plain weights (for saving)."""
        for layer in lm.model.layers:
            if parametrize.is_parametrized(layer.self_attn.o_proj, "weight"):
                parametrize.remove_parametrizations(layer.self_attn.o_proj, "weight", leave_parametrized=True)


def lora_rank_for(n_parameters: int, n_layers: int, hidden: int) -> int:
    """The rank of :class:`OutputLoRA` whose parameter count (2 · hidden · r per layer) is closest to
    ``n_parameters`` (at least 1)."""
    return max(1, round(n_parameters / (2 * hidden * n_layers)))


VALUE_RESIDUAL_FILE = "value_residual.safetensors"


def save_value_residual(module: ValueResidual, path) -> None:
    """λ (safetensors), atomically."""
    from safetensors.torch import save_file

    from lookahead.core.atomic import atomic_file

    with atomic_file(path) as tmp:
        save_file({"mix": module.mix.detach().cpu().contiguous()}, str(tmp))


def load_value_residual(path) -> ValueResidual:
    """A :func:`save_value_residual` file (not attached: :meth:`ValueResidual.attach`)."""
    from safetensors.torch import load_file

    mix = load_file(str(path))["mix"]
    module = ValueResidual(mix.shape[0] + 1)
    module.load_state_dict({"mix": mix})
    return module.eval()
