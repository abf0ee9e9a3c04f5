"""What phase 2 trains: the LM and (decoder mlp) the router as one module (:class:`Phase2Model`),
and what phase 2 may add to them (free connectivity, value residual, an output adapter, shared heads)
and how the router's learning rate is scaled."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize

from lookahead.artifacts.probe_heads import head_importance
from lookahead.core.devices import eval_mode
from lookahead.graph.connectivity import Connectivity
from lookahead.graph.plan import execute
from lookahead.graph.router_inputs import router_context
from lookahead.graph.runtime import forward_with_topology
from lookahead.lm.adapters import OutputLoRA, ValueResidual, lora_rank_for
from lookahead.pipeline.phase2.common import Phase2Error, base_lm
from lookahead.pipeline.phase2.config import Phase2Config


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
    """The LM and (decoder mlp) the predictor, as one module so DDP sees every trained parameter, and
    what phase 2 may add to them: free connectivity on the router's graph, value residual, an
    output adapter (each None when off; the adapter lives inside the LM's weights, ``lora`` holds its
    parameters). ``reference``: the frozen LM without the additions, where the dense figures need it."""

    def __init__(self, lm, predictor: nn.Module | None = None, skip: str = "full", connectivity: nn.Module | None = None,
                 value_residual: nn.Module | None = None, lora: nn.Module | None = None, reference=None):
        super().__init__()
        self.lm = lm
        self.predictor = predictor
        self.skip = skip  # the runtime's skip mode phase 1 trained under (its predictor's metadata)
        self.connectivity = connectivity
        self.value_residual = value_residual
        self.lora = lora
        self.reference = [reference]  # a list: not a submodule (not trained, not saved, not in DDP)

    @property
    def stock(self) -> bool:
        """Every head runs on the plain residual stream: the stock forward is the phase-2 model (value
        residual's hooks need it)."""
        p = self.predictor
        return (p is not None and self.connectivity is None and p.cfg.gate == "head" and p.cfg.keep >= 1
                and p.cfg.edges == "all" and p.cfg.weights == "binary")

    def route(self, ids: torch.Tensor, contexts: torch.Tensor, geo: torch.Tensor | None, tau: float | None = None,
              hard: bool = False, keep: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The predictor's topology for windows ``ids``, times the connectivity's weights: it reads the
        cache's contexts or, per ``predictor.input``, this LM's own states (no gradient through them);
        ``keep``: the budget now."""
        router = router_context(self.predictor.cfg.input, self.lm, ids, contexts)
        adjacency, gates = self.predictor(router, geo, tau=tau, hard=hard, keep=keep)
        if self.connectivity is not None:
            adjacency = self.connectivity.connect(adjacency, router if self.connectivity.dynamic else None)
        return adjacency, gates

    def forward(self, ids: torch.Tensor, contexts: torch.Tensor | None = None, geo: torch.Tensor | None = None,
                tau: float | None = None, hard: bool = False, topology: tuple | None = None, dense: bool = False,
                keep: float | None = None):
        """Logits (B, T, V) and the executed topology (A, g): the given one, else the predictor's;
        ``dense`` (or neither, or a :attr:`stock` model) the stock forward and None."""
        if not dense and topology is None and self.predictor is not None and not self.stock:
            topology = self.route(ids, contexts, geo, tau, hard, keep)
        if dense or topology is None:
            return self.lm(input_ids=ids).logits, None
        adjacency, gates = topology
        if torch.is_grad_enabled() and (adjacency.requires_grad or gates.requires_grad):  # the router or the weights train
            return forward_with_topology(self.lm, ids, adjacency, gates, skip=self.skip), (adjacency, gates)
        # fixed gates: the execution plan's code, differentiable in the LM's weights (0/1 gates; else the runtime)
        return execute(self.lm, ids, adjacency, gates, self.skip), (adjacency, gates)

    def hard(self, ids: torch.Tensor, contexts: torch.Tensor | None, geo: torch.Tensor | None,
             tau: float | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits, gates or None for the stock forward) of the hard topology, as evaluated."""
        if self.stock:
            return self.lm(input_ids=ids).logits, None
        adjacency, gates = self.route(ids, contexts, geo, tau=tau, hard=True)
        return execute(self.lm, ids, adjacency, gates, self.skip), gates

    def dense_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """The dense figures' logits: the frozen LM without the additions where there is one, else this LM."""
        lm = self.reference[0] if self.reference[0] is not None else self.lm
        return lm(input_ids=ids).logits


@torch.no_grad()
def connectivity_weights(model: Phase2Model, batches: list, n_batches: int = 4) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The connectivity's weights W (N, N): the static ones, or for dynamic weights their mean and sd
    over the positions of the first ``n_batches`` of ``batches`` (router inputs from the trained LM)."""
    conn = model.connectivity
    if not conn.dynamic:
        return conn().cpu(), None
    with eval_mode(model):
        ws = [conn(router_context(model.predictor.cfg.input, model.lm, w[:, :-1], c)).flatten(0, -3)
              for w, c in batches[:n_batches]]
    w = torch.cat(ws).double()
    return w.mean(0).float().cpu(), w.std(0).float().cpu()


def weight_summary(mean: torch.Tensor, mask: torch.Tensor) -> dict:
    """How far the learned weights moved from the plain stream (1) on the allowed edges."""
    w = mean[mask].double()
    return {"mean_abs_change": float((w - 1).abs().mean()), "min": float(w.min()), "max": float(w.max()),
            "negative_edges": int((w < 0).sum()), "edges": int(mask.sum())}


def additions(cfg: Phase2Config, lm, predictor, meta: dict, predictor_file, base_dir) -> dict:
    """Phase2Model's keyword arguments for what phase 2 adds to the LM and its router (connectivity,
    value residual, adapter, and the frozen reference the dense figures read when the LM is frozen
    and changed by them); freezes the LM when ``train_lm`` is off."""
    out = {}
    n_layers, n_heads = meta["n_layers"], meta["n_heads"]
    if not cfg.train_lm:
        lm.requires_grad_(False)
        if cfg.adapter != "none" or cfg.value_residual:
            out["reference"] = base_lm(base_dir).eval().requires_grad_(False)
    if cfg.connectivity != "none":
        if predictor is None or predictor.cfg.gate != "head" or predictor.cfg.input not in ("lm", "embedding"):
            raise Phase2Error(f"phase2.connectivity weighs a head-gate router's graph and reads its input from the LM: "
                              f"{predictor_file} has gate {getattr(predictor, 'cfg', None) and predictor.cfg.gate}, input "
                              f"{getattr(predictor, 'cfg', None) and predictor.cfg.input}: set connectivity: none")
        out["connectivity"] = Connectivity(cfg.connectivity, n_layers, n_heads, meta["context_dim"], cfg.connectivity_rank,
                                           cfg.connectivity_hidden, predictor.cfg.input)
    if cfg.value_residual:
        out["value_residual"] = ValueResidual(n_layers).attach(lm)
    if cfg.adapter == "lora":
        matched = Connectivity("dynamic", n_layers, n_heads, meta["context_dim"], cfg.connectivity_rank,
                               cfg.connectivity_hidden).n_parameters()
        out["lora"] = OutputLoRA(n_layers, lm.config.hidden_size, lora_rank_for(matched, n_layers, lm.config.hidden_size)).attach(lm)
    return out


def added_parameters(model: Phase2Model) -> dict:
    """Parameter counts of what phase 2 added (0 where off) and of the LM."""
    count = lambda m: 0 if m is None else sum(p.numel() for p in m.parameters())  # noqa: E731
    return {"connectivity": count(model.connectivity), "value_residual": count(model.value_residual),
            "adapter": count(model.lora),
            "adapter_rank": 0 if model.lora is None else int(model.lora.adapters[0].a.shape[0]),
            "lm": sum(p.numel() for name, p in model.lm.named_parameters() if ".parametrizations.weight.0." not in name)}


def share_heads(predictor, count: int, heads_file, predictor_file) -> None:
    """Make the ``count`` most important heads (the probe's ``heads_file``) run at every token."""
    from lookahead.graph.nodes import pool, static_gates

    if predictor.cfg.gate != "head" or predictor.cfg.budget == "none" or heads_file is None:
        raise Phase2Error(f"phase2.shared_heads needs a head-gate router with a budget ({predictor_file}: gate "
                          f"{predictor.cfg.gate}, budget {predictor.cfg.budget}) and the probe's head statistics")
    importance = head_importance(heads_file)
    importance = pool(importance, importance.shape[-1] // predictor.n_heads)  # over the router's units
    predictor.set_always_on(static_gates(importance, count)[1:].nonzero().flatten().tolist())
