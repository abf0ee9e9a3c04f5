"""Phase 2 (DESIGN §2 phase2): continued pretraining of the base LM, unfrozen, with per-token
topologies; its two controls (the ``control`` and ``static_control`` stages) are
:mod:`lookahead.pipeline.phase2.control`.

``decoder: mlp`` — the phase-1 predictor routes: with ``predictor_lr_scale`` > 0 it keeps training
jointly with the LM under phase 1's loss (NLL(A) + lambda_head · mean gate + lambda_edge · mean edge
weight, τ annealed, straight-through hard from ``hard_from_step``); with 0 (the default) it stays the
router phase 1 distilled, and only the LM learns to run under it. ``shared_heads`` makes the S most
important heads run at every token (the router fills the rest of its budget). ``decoder:
diffusion`` — every position's topology is a sample of the frozen diffusion head (a new one each
step) and only the LM trains.

Data (``windows``): ``stream`` (default) — every step draws fresh windows of the whole train
stream, drawn like the base's batches, and the router computes its inputs online from the LM being
trained (``predictor.input: lm | embedding``: the LM's own states under the lookahead contract).
``cache`` — the context cache's train windows (the slow path, for routers that read the cache's
MiniLM / HF encodings and for decoder diffusion): the cache is small (128 windows at the default:
MiniLM encodes ~140 positions/s on 2 cores) and a few passes over it overfit the LM (the control's
val NLL rose from 4.39 to 5.50 in 12.5 passes), which ``replay`` offsets: each step also trains on
as many windows of the whole stream, dense, in every run. The loss is the windows' loss ((1 − w) NLL
+ w KL from the frozen dense base with ``distill`` = w), averaged with the replay windows' NLL, plus
the sparsity terms. The controls (:mod:`lookahead.pipeline.phase2.control`) draw the same windows.
Evaluation: the cache's val windows (the positions every stage reports on).

The predictor trains faster than the LM (phase 1 used lr 3e-2; continued pretraining wants ~1e-3):
its parameters are stored as θ = p / c with ``c = predictor_lr_scale`` (``torch.nn.utils.parametrize``)
so that one AdamW over both gives the predictor steps c times the LM's (Adam's step on θ is about lr
whatever the gradient's scale). The saved predictor holds the plain p.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parametrize

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.phase2 import CONFIG_FILE, LM_DIR, PREDICTOR_FILE
from lookahead.artifacts.probe_heads import head_importance
from lookahead.artifacts.val_scores import ScoringConfig
from lookahead.core.config import to_dict
from lookahead.core.devices import eval_mode
from lookahead.core.seeds import over_seeds, seeded_headline
from lookahead.core.windows import set_label
from lookahead.graph.connectivity import CONNECTIVITY_FILE, Connectivity, save_connectivity
from lookahead.graph.denoiser import draw_topology
from lookahead.graph.generate import Router, self_consistent
from lookahead.graph.plan import execute
from lookahead.graph.predictor import budget_terms
from lookahead.graph.router_inputs import check_context_dim, router_context
from lookahead.graph.runtime import forward_with_topology, recorded_skip
from lookahead.graph.sampling import executed_topology, stored_edges
from lookahead.graph.scoring import GeoLookup
from lookahead.lm.adapters import VALUE_RESIDUAL_FILE, OutputLoRA, ValueResidual, lora_rank_for, save_value_residual
from lookahead.lm.nll import PositionTotals, token_nll
from lookahead.pipeline.phase2.common import Phase2Error, base_lm, data_report, final_batches, final_label
from lookahead.pipeline.phase2.common import load_train_stream
from lookahead.pipeline.phase2.common import routed_loss, save_lm, save_seed_scores, step_tokens, step_windows, teacher_lm
from lookahead.pipeline.phase2.common import val_batches, val_rows, windows_loss
from lookahead.pipeline.phase2.config import Phase2Config
from lookahead.pipeline.phase2.plots import plot_connectivity
from lookahead.pipeline.phase2.refresh import Refresher
from lookahead.train.checkpoints import checkpoint_dir
from lookahead.train.loop import TrainResult, train


CONNECTIVITY_FIGURE = "connectivity.png"  # in the stage's output: the learned edge weights (connectivity on)


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


def running(gates: torch.Tensor) -> torch.Tensor:
    """Which heads run (…, L·H) under gates (…, N): gate > 0 — a gate-weighted head (``gate_weights:
    softmax``) runs at any weight, so the active-head fraction (and the static control's) counts it whole."""
    return (gates[..., 1:] > 0).to(gates.dtype)


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


class Phase2Module:
    """The step object of phase 2: the LM trains under the topologies of its decoder — the predictor,
    training with it (``mlp``), or a sample of the frozen denoiser per position (``diffusion``)."""

    def __init__(self, model: Phase2Model, cache: ContextCache, geo: GeoLookup, cfg: Phase2Config,
                 denoiser=None, stream: np.ndarray | None = None, gate_kind: str = "cascade", teacher=None):
        self.model = model
        self.gate_kind = gate_kind  # how a diffusion sample's bits execute (lookahead.graph.sampling)
        self.stream = stream  # the train token stream (stream windows, replay)
        self.teacher = teacher  # distill > 0: the frozen dense base
        self.cache, self.geo, self.cfg = cache, geo, cfg
        self.denoiser = denoiser  # decoder diffusion: frozen, samples a topology per position
        predictor = model.predictor
        self.geo_used = predictor is not None and predictor.geo_dim > 0
        self.device = torch.device("cpu")
        self.val_rows = val_rows(cfg, cache)
        self.last_eval: dict = {}
        self.refresher = None  # refresh_every > 0: made in place(), once the predictor is on its device
        self.last_refresh: dict = {}

    def place(self, device) -> None:
        self.device = torch.device(device)
        self.geo = self.geo.to(self.device)
        if self.cfg.refresh_every:
            self.model.predictor.to(self.device)
            self.refresher = Refresher(self.model.predictor, self.cfg.refresh_lr, self.cfg.refresh_steps,
                                       self.cfg.refresh_windows, self.cfg.refresh_oracle)
        for frozen in (self.denoiser, self.teacher, self.model.reference[0]):
            if frozen is not None:
                frozen.to(self.device)

    def lr_scale(self, name: str) -> float:
        """The weights phase 2 adds (connectivity, value residual, adapter) train at ``connectivity_lr_scale``
        times the LM's rate (the loop's parameter groups)."""
        added = name.startswith(("connectivity.", "value_residual.", "lora.")) or ".parametrizations.weight.0." in name
        return self.cfg.connectivity_lr_scale if added else 1.0

    def _sample(self, contexts: torch.Tensor | None, ids: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Allowed-edge bits (B, T, E) of one diffusion sample per position (its executed graph; the
        head reads its recorded inputs: the phase-2 LM's states, or the cache's)."""
        d = self.denoiser
        ids = ids.to(self.device)
        geo = self.geo(ids) if d.geo_dim else None
        cached = contexts.to(self.device) if contexts is not None else None
        adjacency, gates = draw_topology(d, self.model.lm, ids, cached, geo, self._steps, self._temperature,
                                         generator, self.gate_kind)
        return stored_edges(adjacency, gates, d.mask).to(torch.uint8).cpu()

    def _executed(self, bits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.denoiser
        return executed_topology(bits.to(self.device), d.mask, d.n_layers, d.n_heads, self.gate_kind)

    def set_sampling(self, steps: int, temperature: float) -> None:
        self._steps, self._temperature = steps, temperature

    def batch(self, step: int) -> dict:
        out, contexts = step_windows(self.cfg, self.cache, self.stream, step)
        if self.denoiser is not None:
            generator = torch.Generator(device=self.device).manual_seed(self.cfg.train.seed * 1_000_003 + step)
            with torch.no_grad():
                out["bits"] = self._sample(contexts, out["windows"][:, :-1], generator)
            return out
        if contexts is not None:
            out["contexts"] = contexts
        out.update(tau=self.cfg.tau(step), hard=0 <= self.cfg.hard_from_step <= step)
        if self.cfg.budget_warmup:
            out["keep"] = self.cfg.keep_at(step, self.model.predictor.cfg.keep)
        if self.cfg.refresh_every and (step + 1) % self.cfg.refresh_every == 0:
            out["refresh"] = True
        return out

    def loss(self, model, batch: dict):
        windows = batch["windows"]
        ids, targets = windows[:, :-1], windows[:, 1:]
        parts = {}
        if self.denoiser is not None:
            topology = self._executed(batch["bits"])
            logits, _ = model(ids, topology=topology)
            parts["head_gate"] = topology[1][..., 1:].mean().item()
        else:
            if batch.get("refresh"):  # before this step's forward: the router catches up with the LM as it is
                self.last_refresh = self.refresher.step(self.model.lm, self.model.predictor, self.model.skip, ids,
                                                        self.geo if self.geo_used else None)
            geo = self.geo(ids) if self.geo_used else None
            logits, topology = model(ids, batch.get("contexts"), geo, tau=batch["tau"], hard=batch["hard"],
                                     keep=batch.get("keep"))
            p = self.model.predictor
            if topology is None:  # the stock forward: every head, every edge
                head = edge = torch.ones(())
            else:
                head, edge = budget_terms(*topology, p.n_layers, p.n_heads)
            parts.update({"head_gate": head.item(), "edge_weight": edge.item(), "tau": batch["tau"]})
        loss = routed_loss(logits, targets, self.teacher, ids, self.cfg.distill, parts, self.cfg.distill_top_k)
        loss = windows_loss(loss, batch, lambda x: model(x, dense=True)[0], parts)
        if self.denoiser is not None:
            return loss, parts
        return loss + self.cfg.lambda_head * head + self.cfg.lambda_edge * edge, parts

    tokens = staticmethod(step_tokens)

    @torch.no_grad()
    def evaluate(self, model) -> dict[str, float]:
        """Val NLL of the LM dense and under its decoder's hard topologies (and soft for mlp)."""
        with eval_mode(model):
            totals = PositionTotals()
            generator = torch.Generator(device=self.device).manual_seed(self.cfg.train.seed)  # same draws every eval
            for windows, contexts in val_batches(self.cache, self.val_rows, self.cfg.eval_batch_size, self.device):
                ids, targets = windows[:, :-1], windows[:, 1:]
                totals.add(targets.numel(), dense=token_nll(model.dense_logits(ids), targets).sum().item())
                if self.denoiser is not None:
                    adjacency, gates = self._executed(self._sample(contexts, ids, generator).to(self.device))
                    hard = execute(model.lm, ids, adjacency, gates, model.skip)
                else:
                    geo = self.geo(ids) if self.geo_used else None
                    if model.stock:
                        soft = model.lm(input_ids=ids).logits
                    else:
                        adjacency, gates = model.route(ids, contexts, geo, tau=self.cfg.tau_end, hard=False)
                        soft = forward_with_topology(model.lm, ids, adjacency, gates, skip=model.skip)
                    totals.add(soft=token_nll(soft, targets).sum().item())
                    hard, gates = model.hard(ids, contexts, geo, self.cfg.tau_end)
                heads = 1.0 if gates is None else running(gates).mean(-1)
                totals.add(hard=token_nll(hard, targets).sum().item(),
                           heads=float(ids.numel()) if gates is None else heads.sum().item())
        metrics = {"dense_nll": totals.mean("dense"), "hard_nll": totals.mean("hard"),
                   "active_head_fraction": totals.mean("heads")}
        if self.denoiser is None:
            metrics["soft_nll"] = totals.mean("soft")
        self.last_eval = metrics
        return metrics


    def deployed_router(self, model) -> Router | None:
        """The router as generation runs it (its inputs from the routed model's own states), where it
        can run that way: a head-gate router of 0/1 gates reading the LM (``lm``, ``embedding``)."""
        p = model.predictor
        if (self.denoiser is not None or p is None or p.cfg.gate != "head" or p.cfg.edges == "learned"
                or p.cfg.input not in ("lm", "embedding") or p.cfg.weights != "binary" or model.connectivity is not None
                or model.stock):
            return None
        return Router(p, model.lm, self.geo if self.geo_used else None)

    @torch.no_grad()
    def score(self, model, batches: list) -> dict[str, np.ndarray]:
        """Per-position NLLs (P,) of the trained LM on the final val set ``batches``
        (:func:`lookahead.pipeline.phase2.common.final_batches`): dense, and under its decoder's hard
        topologies through the execution plan (the router reading a dense pass's states); where the
        router can run as deployed (:meth:`deployed_router`), ``deployed``: its inputs from the routed
        model's own states, position by position (:func:`lookahead.graph.generate.self_consistent`);
        and the mean active-head fraction."""
        dense, hard, heads, deployed = [], [], [], []
        router = self.deployed_router(model)
        with eval_mode(model):
            generator = torch.Generator(device=self.device).manual_seed(self.cfg.train.seed)
            for windows, contexts in batches:
                ids, targets = windows[:, :-1], windows[:, 1:]
                dense.append(token_nll(model.dense_logits(ids), targets).flatten())
                if self.denoiser is not None:
                    adjacency, gates = self._executed(self._sample(contexts, ids, generator).to(self.device))
                    logits = execute(model.lm, ids, adjacency, gates, model.skip)
                else:
                    logits, gates = model.hard(ids, contexts, self.geo(ids) if self.geo_used else None, self.cfg.tau_end)
                hard.append(token_nll(logits, targets).flatten())
                heads.append(ids.new_ones(ids.numel(), dtype=torch.float32) if gates is None
                             else running(gates).mean(-1).flatten())
            if router is not None:
                windows = torch.cat([w for w, _ in batches])
                for chunk in windows.split(DEPLOYED_WINDOWS):
                    logits, _ = self_consistent(model.lm, router, chunk[:, :-1], model.skip)
                    deployed.append(token_nll(logits, chunk[:, 1:]).flatten())
        out = {"dense": torch.cat(dense).cpu().numpy(), "hard": torch.cat(hard).cpu().numpy(),
               "active_head_fraction": torch.cat(heads).double().mean().item()}
        if deployed:
            out["deployed"] = torch.cat(deployed).cpu().numpy()
        return out


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


DEPLOYED_WINDOWS = 64
"""Windows decoded together when scoring the router as deployed (one cached step of each per forward)."""


# metrics/phase2.json (lookahead.core.report) and their spread over training seeds
# (lookahead.core.seeds); dense_nll and hard_nll score the
# final val set (scored_positions), the start_ figures and soft_nll (in the report) the cache's val windows
SEEDED = ("dense_nll", "hard_nll", "deployed_nll", "soft_nll", "active_head_fraction")
HEADLINE = seeded_headline(("base_val_nll", "start_hard_nll", "dense_nll", "hard_nll", "deployed_nll", "active_head_fraction",
                            "start_active_head_fraction", "scored_positions", "train_steps", "train_tokens",
                            "passes_over_cache", "passes_over_stream", "parameters_added"), SEEDED)


def build_phase2(cfg: Phase2Config, base_dir, tokens_dir, contexts_dir, init_file, predictor_file, diffusion_dir, out_dir,
                 checkpoint_root=None, tracker=None, heads_file=None, scoring: ScoringConfig | None = None
                 ) -> tuple[dict, TrainResult]:
    """Train the phase-2 LM with its decoder; write the LM (and the predictor) to ``out_dir``;
    return the report and the training result. ``heads_file``: the probe's head importance
    (``shared_heads`` picks the most important). ``scoring``: the final figures' val set
    (:func:`lookahead.pipeline.phase2.common.final_batches`; None: the default one); the report's
    ``token_nll`` holds its per-position NLLs."""
    from lookahead.core.atomic import atomic_dir
    from lookahead.graph.denoiser import load_denoiser, sampling_settings
    from lookahead.graph.predictor import load_init, load_predictor, save_predictor

    cache = ContextCache(contexts_dir)
    tensors, _ = load_init(init_file)
    geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float())
    predictor, meta = load_predictor(predictor_file)
    gate_kind = predictor.cfg.gate
    denoiser, diffusion_meta = None, {}
    if cfg.decoder == "diffusion":
        denoiser, diffusion_meta = load_denoiser(diffusion_dir)
        denoiser.requires_grad_(False)

    torch.manual_seed(cfg.train.seed)
    lm = base_lm(base_dir, meta["n_layers"], meta["n_heads"], f"predictor {predictor_file}")
    check_context_dim(predictor, meta, cache.dim, lm, Phase2Error, predictor_file)
    if cfg.windows == "stream" and predictor.cfg.input == "cache":
        raise Phase2Error(f"phase2.windows: stream needs a router that computes its inputs online, but {predictor_file} "
                          "reads the context cache (predictor.input: cache): set phase2.windows: cache, or "
                          "predictor.input: lm and rerun `dvc repro phase1`")
    if cfg.budget_warmup and (denoiser is not None or predictor.cfg.gate != "head" or predictor.cfg.budget == "none"):
        raise Phase2Error(f"phase2.budget_warmup anneals a top-K budget: {predictor_file} has gate "
                          f"{predictor.cfg.gate}, budget {predictor.cfg.budget} (decoder {cfg.decoder}): set budget_warmup: 0")
    if cfg.refresh_every and (denoiser is not None or predictor.cfg.gate != "head" or predictor.cfg.budget != "topk"
                              or predictor.cfg.input not in ("lm", "embedding")):
        raise Phase2Error(f"phase2.refresh_every distils the greedy oracle's global top-K into a router that reads "
                          f"the LM's states: {predictor_file} has gate {predictor.cfg.gate}, budget "
                          f"{predictor.cfg.budget}, input {predictor.cfg.input}: set refresh_every: 0")
    if cfg.shared_heads:
        share_heads(predictor, cfg.shared_heads, heads_file, predictor_file)
    if cfg.gate_weights != "binary":
        if denoiser is not None or predictor.cfg.gate != "head" or predictor.cfg.budget == "none":
            raise Phase2Error(f"phase2.gate_weights: {cfg.gate_weights} weighs a top-K router's kept heads: {predictor_file} "
                              f"has gate {predictor.cfg.gate}, budget {predictor.cfg.budget} (decoder {cfg.decoder})")
        predictor.cfg = dataclasses.replace(predictor.cfg, weights=cfg.gate_weights)
    if cfg.keep is not None:
        if denoiser is not None or predictor.cfg.gate != "head" or predictor.cfg.budget == "none":
            raise Phase2Error(f"phase2.keep sets a top-K router's budget: {predictor_file} has gate {predictor.cfg.gate}, "
                              f"budget {predictor.cfg.budget} (decoder {cfg.decoder}): set keep: null")
        predictor.cfg = dataclasses.replace(predictor.cfg, keep=cfg.keep)
    if denoiser is not None:
        predictor = None
    if predictor is not None:
        predictor.train()
        if cfg.predictor_lr_scale == 0:
            predictor.requires_grad_(False)  # the phase-1 router, frozen
        else:
            scale_learning_rate(predictor, cfg.predictor_lr_scale)
    stream = load_train_stream(cfg, tokens_dir)
    model = Phase2Model(lm, predictor, recorded_skip(meta), **additions(cfg, lm, predictor, meta, predictor_file, base_dir))
    module = Phase2Module(model, cache, geo, cfg, denoiser, stream=stream, gate_kind=gate_kind,
                          teacher=teacher_lm(cfg, base_dir))
    if denoiser is not None:
        module.set_sampling(*sampling_settings(diffusion_meta, diffusion_dir))
    files = [Path(init_file), Path(predictor_file), Path(base_dir) / "model.safetensors"]
    files += [Path(heads_file)] if cfg.shared_heads else []
    files += [Path(tokens_dir) / "train.npy"] if stream is not None else []
    files += [Path(diffusion_dir) / "model.safetensors"] if denoiser is not None else []
    ckpt = checkpoint_dir(checkpoint_root, "phase2", to_dict(cfg), files, [cache.fingerprint()])

    start = module.evaluate(module.model)  # the starting point: the base LM under the phase-1 decoder
    result = train(module, cfg.train, stage="phase2", checkpoint_dir=ckpt, tracker=tracker)
    result.eval_curve.insert(0, {"step": 0, **start})
    final = module.last_eval
    scoring_batches = final_batches(cfg, scoring or ScoringConfig(), tokens_dir, cache, module.device)
    window_set = final_label(cfg, scoring or ScoringConfig(), tokens_dir, cache)
    scored = module.score(module.model, scoring_batches)
    weights = connectivity_weights(module.model, scoring_batches) if module.model.connectivity is not None else None
    config = {"phase2": to_dict(cfg), "decoder": cfg.decoder, "n_layers": meta["n_layers"], "n_heads": meta["n_heads"],
              "encoder": cache.meta["encoder"], "skip": recorded_skip(meta),
              "active_head_fraction": final["active_head_fraction"]}  # what the static control prunes to
    config.update(keep=cfg.keep, connectivity=cfg.connectivity, value_residual=cfg.value_residual, adapter=cfg.adapter,
                  train_lm=cfg.train_lm, added_parameters=added_parameters(module.model))
    with atomic_dir(out_dir) as tmp:
        if module.model.lora is not None:
            OutputLoRA.merge(module.model.lm)  # the saved LM carries its adapter
        save_lm(module.model.lm.cpu(), base_dir, tmp / LM_DIR, config)
        if module.model.connectivity is not None:
            save_connectivity(module.model.connectivity.cpu(), tmp / CONNECTIVITY_FILE)
            plot_connectivity(*weights, meta["n_layers"], meta["n_heads"], tmp / CONNECTIVITY_FIGURE,
                              f"phase 2, connectivity {cfg.connectivity}, keep {predictor.cfg.keep}: learned edge weights "
                              f"(1 = the plain residual stream), seed {cfg.train.seed}")
        if module.model.value_residual is not None:
            save_value_residual(module.model.value_residual.cpu(), tmp / VALUE_RESIDUAL_FILE)
        if predictor is not None:
            trained = module.model.predictor.cpu()
            plain_parameters(trained)
            save_predictor(trained, tmp / PREDICTOR_FILE, extra={"phase2": to_dict(cfg), "encoder": cache.meta["encoder"],
                                                                 "runtime": {"skip": recorded_skip(meta)}})
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    report = {
        "decoder": cfg.decoder,
        "base_val_nll": start["dense_nll"],
        "start_hard_nll": start["hard_nll"],
        "start_active_head_fraction": start["active_head_fraction"],
        "dense_nll": float(scored["dense"].mean()),
        "hard_nll": float(scored["hard"].mean()),
        "deployed_nll": float(scored["deployed"].mean()) if "deployed" in scored else None,
        "soft_nll": final.get("soft_nll"),
        "active_head_fraction": final["active_head_fraction"],
        "scored_positions": len(scored["hard"]),
        "window_set": window_set,
        "router": str(predictor_file),
        "added_parameters": config["added_parameters"],
        "parameters_added": sum(config["added_parameters"][k] for k in ("connectivity", "value_residual", "adapter")),
        "hard_minus_dense": float((scored["hard"] - scored["dense"]).mean()),
        "connectivity_weights": (weight_summary(weights[0], module.model.connectivity.mask.cpu())
                                 if weights is not None else None),
        "scored_active_head_fraction": scored["active_head_fraction"],
        "cache_val": {"window_set": set_label("cache-val", cache.windows("val")[module.val_rows]),
                      **{k: final[k] for k in ("dense_nll", "hard_nll", "active_head_fraction")}},
        **data_report(cfg, cache, module.val_rows, result, len(stream) if stream is not None else 0),
        **(module.refresher.report() if module.refresher is not None else {}),
        "token_nll": {k: scored[k] for k in ("dense", "hard", "deployed") if k in scored},
    }
    return report, result


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
    from lookahead.graph.nodes import static_gates

    if predictor.cfg.gate != "head" or predictor.cfg.budget == "none" or heads_file is None:
        raise Phase2Error(f"phase2.shared_heads needs a head-gate router with a budget ({predictor_file}: gate "
                          f"{predictor.cfg.gate}, budget {predictor.cfg.budget}) and the probe's head statistics")
    importance = head_importance(heads_file)
    predictor.set_always_on(static_gates(importance, count)[1:].nonzero().flatten().tolist())


def build_phase2_seeds(cfg: Phase2Config, base_dir, tokens_dir, contexts_dir, init_file, predictor_file, diffusion_dir,
                       out_dir, checkpoint_root=None, tracker=None, heads_file=None,
                       scoring: ScoringConfig | None = None, scores_file=None, predictor_seeds=None
                       ) -> tuple[dict, TrainResult]:
    """:func:`build_phase2`, then ``cfg.seeds - 1`` more trainings on other seeds (their LMs
    discarded): the report carries the :data:`SEEDED` figures' mean and sd (lookahead.core.seeds);
    every seed's per-position NLLs on the final val set, ``dense`` and ``hard`` (seeds, P), go to
    ``scores_file``. ``predictor_seeds``: phase 1's other seeds' routers (a directory of
    ``predictor_seed<i>.safetensors``): seed i of phase 2 starts from seed i of phase 1, so that the
    claims' intervals cover the router's own seed variance (None: every seed from ``predictor_file``)."""
    files = seed_routers(cfg, predictor_file, predictor_seeds)
    return over_seeds(cfg, "phase2", SEEDED, lambda c, scratch: build_phase2(
        c, base_dir, tokens_dir, contexts_dir, init_file, files[c.train.seed - cfg.train.seed], diffusion_dir,
        scratch / "phase2" if scratch else out_dir, checkpoint_root, None if scratch else tracker, heads_file, scoring),
        lambda runs: save_seed_scores(scores_file, runs))


def seed_routers(cfg: Phase2Config, predictor_file, predictor_seeds) -> list[Path]:
    """Phase 1's router for each of phase 2's seeds (checked before any work): seed 0 the primary,
    seed i phase 1's seed i from ``predictor_seeds``."""
    from lookahead.graph.predictor import seed_router_name

    files = [Path(predictor_file)]
    for i in range(1, cfg.seeds):
        files.append(Path(predictor_file) if predictor_seeds is None else Path(predictor_seeds) / seed_router_name(i))
        if not files[-1].is_file() and (cfg.decoder == "mlp" or predictor_seeds is None):
            raise Phase2Error(f"phase2.seeds is {cfg.seeds}, but phase 1's router of seed {i} ({files[-1]}) is missing: "
                              "set phase1.seeds >= phase2.seeds and rerun `dvc repro phase1`")
    return files


