"""Free head-to-head connectivity (docs/design.md; the seed's weighted DAG, trained): weights on the
head graph's edges that can do more than attenuate.

The runtime (:mod:`lookahead.graph.runtime`) gives head j the input

    x_j = A[0, j] · e + Σ_{l' < layer(j)} m_{l'} + Σ_{i a head of an earlier layer} A[i, j] · o_i,

and A = the allowed mask (every weight 1) is the plain residual stream. A router's head-gate graph
is 0/1 (``nodes.head_graph``); the seed's ``edges: learned`` multiplies it by σ-weights in [0, 1],
which can only scale a head's inputs down. Here the weights are unconstrained and start at exactly 1,
so step 0 is the stock forward:

- ``static``: W = 1 + Δ, one learned Δ per allowed edge (the DenseFormer case: learned
  depth-weighted averages initialised to the plain transformer);
- ``dynamic``: W_t = 1 + U_t V_tᵀ / √r per position, U_t and V_t (N × r) from the router's input
  at t through a small MLP whose V half starts at zero (the MUDDFormer case, low rank like the
  seed's predictor);
- ``both``: W_t = 1 + Δ + U_t V_tᵀ / √r.

The executed adjacency is the router's graph times W (an edge the router leaves out stays out). The
dynamic weights read only the router's input at t — the token embedding at t and the LM's state at
t − 1 under ``predictor.input: lm`` — so they are causal as the router is.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lookahead.core.errors import LookaheadError
from lookahead.graph.nodes import allowed_mask, n_edges, n_nodes

KINDS = ("none", "static", "dynamic", "both")


class ConnectivityError(LookaheadError, ValueError):
    """A connectivity that does not fit its inputs."""


class Connectivity(nn.Module):
    """Free edge weights W (N, N) or (…, N, N) over the allowed edges, 1 at initialisation.

    Args:
        kind: ``static``, ``dynamic`` or ``both`` (``none`` has no module: use None).
        context_dim: width of the router input the dynamic weights read (``input`` tells how it
            is normalised: ``lm`` = [embedding ; previous state], each half to unit RMS; anything
            else as one block).
        rank, hidden: the dynamic weights' rank r and MLP width.
    """

    def __init__(self, kind: str, n_layers: int, n_heads: int, context_dim: int = 0, rank: int = 4, hidden: int = 64,
                 input: str = "lm"):
        super().__init__()
        if kind not in KINDS or kind == "none":
            raise ConnectivityError(f"connectivity kind must be one of static, dynamic, both; got {kind!r}")
        self.kind, self.n_layers, self.n_heads = kind, n_layers, n_heads
        self.rank, self.hidden, self.context_dim, self.input = rank, hidden, context_dim, input
        n = n_nodes(n_layers, n_heads)
        self.register_buffer("mask", allowed_mask(n_layers, n_heads), persistent=False)
        if kind in ("static", "both"):
            self.delta = nn.Parameter(torch.zeros(n_edges(n_layers, n_heads)))  # W = 1 + Δ on the allowed edges
        if self.dynamic:
            if context_dim < 1:
                raise ConnectivityError(f"dynamic connectivity reads the router's input: context_dim must be >= 1; got {context_dim}")
            self.mlp = nn.Sequential(nn.Linear(context_dim, hidden), nn.GELU())
            self.to_u = nn.Linear(hidden, n * rank)
            self.to_v = nn.Linear(hidden, n * rank)
            nn.init.zeros_(self.to_v.weight)  # W_t = 1 at the start; U still moves V through the gradient
            nn.init.zeros_(self.to_v.bias)

    @property
    def dynamic(self) -> bool:
        return self.kind in ("dynamic", "both")

    def static_weights(self) -> torch.Tensor:
        """1 + Δ on the allowed edges (1 without static weights), 0 elsewhere. (N, N)"""
        w = self.mask.float()
        if self.kind in ("static", "both"):
            w = w.masked_scatter(self.mask, 1.0 + self.delta)
        return w

    def _features(self, context: torch.Tensor) -> torch.Tensor:
        if context.shape[-1] != self.context_dim:
            raise ConnectivityError(f"the dynamic connectivity reads {self.context_dim}-dim router inputs; got {context.shape[-1]}")
        blocks = context.chunk(2, dim=-1) if self.input == "lm" else (context,)
        return self.mlp(torch.cat([F.rms_norm(x, (x.shape[-1],), eps=1e-6) for x in blocks], dim=-1))

    def forward(self, context: torch.Tensor | None = None) -> torch.Tensor:
        """W: (N, N) for static weights alone, else (…, N, N) for router inputs ``context`` (…, C)."""
        w = self.static_weights()
        if not self.dynamic:
            return w
        if context is None:
            raise ConnectivityError("dynamic connectivity needs the router's input at every position")
        h = self._features(context)
        n, r = w.shape[0], self.rank
        u = self.to_u(h).unflatten(-1, (n, r)) / math.sqrt(r)
        v = self.to_v(h).unflatten(-1, (n, r))
        return w + (u @ v.transpose(-1, -2)) * self.mask

    def connect(self, adjacency: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """The router's graph ``adjacency`` (N, N) or (…, N, N) times W: the executed weights."""
        return adjacency * self(context)

    def n_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def config(self) -> dict:
        return {"kind": self.kind, "n_layers": self.n_layers, "n_heads": self.n_heads, "context_dim": self.context_dim,
                "rank": self.rank, "hidden": self.hidden, "input": self.input}


CONNECTIVITY_FILE = "connectivity.safetensors"


def save_connectivity(module: Connectivity, path) -> None:
    """Weights (safetensors) with the config in the metadata, atomically."""
    import json

    from safetensors.torch import save_file

    from lookahead.core.atomic import atomic_file

    tensors = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    with atomic_file(path) as tmp:
        save_file(tensors, str(tmp), metadata={"config": json.dumps(module.config(), sort_keys=True)})


def load_connectivity(path) -> Connectivity:
    """A :func:`save_connectivity` file, in eval mode."""
    from lookahead.core.inputs import read_safetensors

    meta, tensors = read_safetensors(path, "pt", "config", ConnectivityError, "run `dvc repro phase2`")
    module = Connectivity(**meta)
    module.load_state_dict(tensors)
    return module.eval()
