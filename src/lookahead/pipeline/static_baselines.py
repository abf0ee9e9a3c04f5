"""The static_baselines stage (docs/pipeline.md): the strongest static head masks one can find on
held-out text, fitted on the val stream's **fit** windows and compared on its **selection** windows
(:mod:`lookahead.artifacts.val_scores`: never on test). Its layout and what reads it:
:mod:`lookahead.artifacts.static_baselines`.

- importance ranked on the fit windows: E|dL/dmask_h| (Michel et al. 2019; the probe measures the
  same on train windows, and the probe's ranking keeps its other jobs: the router's initial bias
  and phase 2's shared heads);
- a greedy static mask on the fit windows: from every head on, drop one at a time the head whose
  removal raises the NLL over the fit windows' positions least (the first on a tie), down to
  ``min_keep`` heads. One nested pass gives every count's mask: N(N+1)/2 − K(K+1)/2 evaluations
  (136 at 16 heads). ``candidates`` c > 0 is the lazy search the greedy oracle validated: after the
  first step, a step tries only the c heads still on whose latest measured cost is lowest;
  ``fit_windows`` caps the windows the search reads (the first in stream order): both for 64+ heads.

Static masks run in ``full`` skip (a head off for every token has no query, key, value or output),
the mode their MACs are counted in. Deterministic: the same inputs give the same bytes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from pathlib import Path
from typing import Literal

import torch

from lookahead.artifacts.static_baselines import META_FILE, METHODS, TENSORS_FILE
from lookahead.artifacts.val_scores import ScoringConfig, WindowsConfig, batches, scoring_spans, scoring_windows
from lookahead.core.atomic import atomic_dir, atomic_file
from lookahead.core.config import OMIT_DEFAULT, to_dict
from lookahead.core.devices import resolve_device
from lookahead.core.errors import require
from lookahead.core.windows import set_label
from lookahead.graph.nodes import baseline_graph, static_gates
from lookahead.graph.plan import execute, gated_forward
from lookahead.graph.runtime import unit_shape
from lookahead.lm.nll import causal_lm_nll, token_nll
from lookahead.train.checkpoints import checkpoint_dir

SKIP = "full"
"""The skip mode static masks run in (and their MACs are counted in)."""


@dataclasses.dataclass
class StaticBaselinesConfig:
    """How the static masks are searched (the windows: params.yaml's ``windows`` section)."""

    min_keep: int = 0
    """The greedy search stops at this many heads (every count from it to L·H gets a greedy mask;
    below it the greedy ranking keeps its last heads in node order)."""
    candidates: int = 0
    """Heads tried per greedy step after the first, those of lowest latest cost (a lazy search; 0: every head still on)."""
    fit_windows: int = 0
    """Fit windows the greedy search reads, the first in stream order (0: all; importance reads all)."""
    batch_size: int = 16
    """Windows per forward pass."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """`auto` = CUDA when available."""
    selection_shares: list[float] = dataclasses.field(default_factory=list, metadata=OMIT_DEFAULT)
    """Shares of the units kept at which the selection windows compare the two masks, each at
    round(share · L·U) units (empty: every count). At a count not compared the importance mask is the
    stronger one (as on a tie): where a run declares its counts, scoring all L·U + 1 of them twice is
    most of the stage (542 masks on SmolLM2)."""

    def __post_init__(self) -> None:
        for name in ("min_keep", "candidates", "fit_windows"):
            require(getattr(self, name) >= 0, name, f"must be >= 0; got {getattr(self, name)}")
        require(self.batch_size >= 1, "batch_size", f"must be >= 1; got {self.batch_size}")
        require(all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= 1
                    for x in self.selection_shares), "selection_shares",
                f"must be shares in [0, 1]; got {self.selection_shares!r}")


def gradient_importance(lm, windows: list[torch.Tensor], unit: str = "head") -> torch.Tensor:
    """E|dL/dmask_u| (L, U) over batches of windows (B, T+1): the mean over batches of each unit
    mask's gradient magnitude at mask = 1 (as :func:`lookahead.semantics.heads.probe_heads`); a
    key/value group's mask scales its query heads together (``runtime.unit: group``)."""
    from lookahead.semantics.heads import HeadMasks

    n_layers, n_units = unit_shape(lm, unit)
    grads = torch.zeros(n_layers, n_units)
    for batch in windows:
        mask = torch.ones(n_layers, n_units, requires_grad=True, device=batch.device)
        with HeadMasks(lm, lm.config.num_attention_heads, mask):
            loss = causal_lm_nll(lm, batch)
        (grad,) = torch.autograd.grad(loss, mask)
        grads += grad.abs().cpu()
    return grads / len(windows)


@torch.no_grad()
def mask_nll(lm, windows: list[torch.Tensor], on: torch.Tensor,
             resume: tuple[int, list[torch.Tensor]] | None = None) -> float:
    """Mean NLL over every position of batches of windows (B, T+1) with only the units ``on``
    (L·U,) bool running — query heads, or key/value groups (L·G,) — for every token (:data:`SKIP`).
    ``resume``: ``(l, streams)``, each batch's residual stream entering layer ``l`` under a mask that
    agrees with ``on`` below ``l`` (:func:`layer_streams`): the same floats, the layers under ``l``
    not run again."""
    n_layers = lm.config.num_hidden_layers
    gates = torch.cat([torch.ones(1), on.float().cpu()])
    adjacency = baseline_graph(gates, n_layers, len(on) // n_layers, SKIP) if resume is None else None
    total, count = 0.0, 0
    for i, batch in enumerate(windows):
        ids = batch[:, :-1]
        if adjacency is not None:
            logits = execute(lm, ids, adjacency.to(ids.device), gates.to(ids.device), SKIP)
        else:
            logits = gated_forward(lm, ids, gates.to(ids.device), SKIP, resume=(resume[0], resume[1][i])).logits
        nll = token_nll(logits, batch[:, 1:])
        total, count = total + nll.double().sum().item(), count + nll.numel()
    return total / count


@torch.no_grad()
def layer_streams(lm, windows: list[torch.Tensor], on: torch.Tensor) -> list[list[torch.Tensor]]:
    """Under the mask ``on`` (as :func:`mask_nll`), the residual stream entering each layer: per layer,
    one (B, T, d) per batch of ``windows`` — where a trial mask that differs from ``on`` only in layer
    l resumes (:func:`mask_nll`)."""
    n_layers = lm.config.num_hidden_layers
    gates = torch.cat([torch.ones(1), on.float().cpu()])
    per_batch = [gated_forward(lm, b[:, :-1], gates.to(b.device), SKIP, layer_inputs=True).layer_inputs.chunk(n_layers, -1)
                 for b in windows]
    return [[streams[layer].contiguous() for streams in per_batch] for layer in range(n_layers)]  # as the forward holds it


def greedy_ranking(lm, windows: list[torch.Tensor], min_keep: int = 0, candidates: int = 0,
                   progress: bool = True, unit: str = "head", checkpoint: Path | None = None
                   ) -> tuple[torch.Tensor, list[float]]:
    """The greedy static mask search (module docstring) as a ranking (L, U) of the routing unit's
    nodes: a unit's value is the step at which it was dropped (L·U for the ``min_keep`` never
    dropped), so that the top k of the ranking is the search's mask at k units. Also the fit NLL
    after each drop. ``checkpoint``: a file the search's state is written to after each step and
    resumed from (the same ranking and path as a straight run)."""
    from safetensors.torch import load_file, save_file
    from tqdm.auto import tqdm

    n_layers, n_heads = unit_shape(lm, unit)
    total = n_layers * n_heads
    require(min_keep <= total, "min_keep", f"must be <= the model's {total} {unit}s; got {min_keep}")
    on = torch.ones(total, dtype=torch.bool)
    cost = torch.full((total,), float("inf"), dtype=torch.float64)
    rank = torch.full((total,), float(total))
    path = []
    steps, start = total - min_keep, 0
    if checkpoint is not None and checkpoint.is_file():  # the steps an earlier, killed run made
        state = load_file(str(checkpoint))
        on, cost, rank, path = state["on"], state["cost"], state["rank"], state["path"].tolist()
        start = len(path)
    with tqdm(total=steps, initial=start, desc="static_baselines: greedy mask (heads dropped)", unit="head",
              disable=not progress) as bar:
        for step in range(start, steps):
            alive = on.nonzero().flatten()
            if candidates and step > 0:  # the lazy search: the cheapest by their latest cost, in node order on a tie
                alive = alive[torch.argsort(cost[alive], stable=True)[:candidates]]
            streams = layer_streams(lm, windows, on)  # each trial's layers under its head: the current mask's
            for head in alive.tolist():
                trial = on.clone()
                trial[head] = False
                layer = head // n_heads
                cost[head] = mask_nll(lm, windows, trial, resume=(layer, streams[layer]))
            drop = int(alive[torch.argmin(cost[alive])])  # argmin returns the first of equal minima
            on[drop] = False
            rank[drop] = float(step)
            path.append(float(cost[drop]))
            cost[drop] = float("inf")
            if checkpoint is not None:
                checkpoint.parent.mkdir(parents=True, exist_ok=True)
                with atomic_file(checkpoint) as tmp:
                    save_file({"on": on, "cost": cost, "rank": rank, "path": torch.tensor(path, dtype=torch.float64)},
                              str(tmp))
            bar.update(1)
    return rank.view(n_layers, n_heads), path


def selection_curve(lm, windows: list[torch.Tensor], ranking: torch.Tensor, progress: bool = True,
                    seen: dict | None = None, counts: list[int] | None = None) -> torch.Tensor:
    """(L·H + 1,) float64: the mean NLL on ``windows`` keeping each count k = 0 … L·H of ``ranking``'s
    top heads (only ``counts`` where given; NaN at the others). ``seen``: {mask: NLL} shared between
    calls, so that a mask two rankings share (every head, none, and any other they agree on) is
    scored once."""
    from tqdm.auto import tqdm

    seen = {} if seen is None else seen
    out = [math.nan] * (ranking.numel() + 1)
    for k in tqdm(range(ranking.numel() + 1) if counts is None else counts, desc="static_baselines: selection",
                  unit="mask", disable=not progress):
        on = static_gates(ranking, k)[1:].bool()
        key = tuple(on.tolist())
        if key not in seen:
            seen[key] = mask_nll(lm, windows, on)
        out[k] = seen[key]
    return torch.tensor(out, dtype=torch.float64)


# metrics/static_baselines.json (lookahead.core.report); every count's figures stay in the report
HEADLINE = ("heads", "stronger_at_half", "selection_nll_importance_at_half", "selection_nll_greedy_at_half",
            "greedy_stronger_counts", "fit_set", "selection_set")


def build_static_baselines(cfg: StaticBaselinesConfig, roles: WindowsConfig, context_length: int, base_dir, tokens_dir,
                           out_dir, unit: str = "head", checkpoint_root=None) -> dict:
    """Fit both static masks on the fit windows, compare them on the selection windows and write
    the stage's directory atomically; return its report. ``unit``: the routing unit whose nodes the
    masks keep (``runtime.unit``; counts are of units). ``checkpoint_root``: the greedy search's state
    is kept there after each step (under a digest of the config and inputs), so that a killed run
    resumes at its next step; removed once the output is written."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    device = resolve_device(cfg.device, "static_baselines.device")
    lm = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval().to(device)
    n_layers, n_units = unit_shape(lm, unit)
    total = n_layers * n_units
    require(cfg.min_keep <= total, "min_keep", f"must be <= the model's {total} {unit}s; got {cfg.min_keep}")
    scoring = ScoringConfig(roles=roles, batch_size=cfg.batch_size)
    fit = scoring_windows(tokens_dir, scoring, context_length, "fit")
    selection = scoring_windows(tokens_dir, scoring, context_length, "selection")
    fit_batches = batches(fit, cfg.batch_size, device)
    search = fit[: cfg.fit_windows] if cfg.fit_windows else fit
    timings = {}
    tic = time.perf_counter()
    rankings = {"importance": gradient_importance(lm, fit_batches, unit)}
    timings["importance_seconds"] = time.perf_counter() - tic
    tic = time.perf_counter()
    ckpt = checkpoint_dir(checkpoint_root, "static_baselines", {"config": to_dict(cfg), "windows": to_dict(roles),
                                                                "unit": unit, "context_length": context_length},
                          [Path(base_dir) / "model.safetensors", Path(tokens_dir) / "val.npy"])
    rankings["greedy"], path = greedy_ranking(lm, batches(search, cfg.batch_size, device), cfg.min_keep, cfg.candidates,
                                              unit=unit, checkpoint=None if ckpt is None else ckpt / "greedy.safetensors")
    timings["greedy_seconds"] = time.perf_counter() - tic
    tic = time.perf_counter()
    selection_batches = batches(selection, cfg.batch_size, device)
    seen: dict = {}
    counts = sorted({round(share * total) for share in cfg.selection_shares}) or None  # None: every count
    curves = {m: selection_curve(lm, selection_batches, rankings[m], seen=seen, counts=counts) for m in METHODS}
    timings["selection_seconds"] = time.perf_counter() - tic
    scored = list(range(total + 1)) if counts is None else counts
    stronger = torch.zeros(total + 1, dtype=torch.long)  # importance where the selection did not compare
    stronger[scored] = torch.stack([curves[m][scored] for m in METHODS]).argmin(0)  # the first (importance) on a tie
    spans = {"static_baselines (fit windows)": scoring_spans(tokens_dir, scoring, context_length, "fit"),
             "static_baselines (selection windows)": scoring_spans(tokens_dir, scoring, context_length, "selection")}
    labels = {"fit_set": set_label("fit", fit), "search_set": set_label("fit", search),
              "selection_set": set_label("selection", selection)}
    with atomic_dir(out_dir) as tmp:
        save_file({**{m: rankings[m].float().contiguous() for m in METHODS},
                   **{f"selection_nll_{m}": curves[m].contiguous() for m in METHODS},
                   "stronger": stronger.to(torch.uint8).contiguous()}, str(Path(tmp) / TENSORS_FILE))
        meta = {"config": to_dict(cfg), "windows": to_dict(roles), "skip": SKIP, **labels,
                "n_layers": n_layers, "n_heads": n_units, **({"unit": unit} if unit != "head" else {}),
                "spans": {k: [list(s) for s in v] for k, v in spans.items()}}
        (Path(tmp) / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if ckpt is not None:
        shutil.rmtree(ckpt, ignore_errors=True)
    half = total // 2
    at_half = (lambda x: x) if half in scored else (lambda x: None)  # noqa: E731 - a count not compared: no figure
    return {"heads": total, "stronger_at_half": at_half(METHODS[int(stronger[half])]),
            "selection_nll_importance_at_half": at_half(float(curves["importance"][half])),
            "selection_nll_greedy_at_half": at_half(float(curves["greedy"][half])),
            "greedy_stronger_counts": int((stronger == METHODS.index("greedy")).sum()), **labels,
            "greedy_fit_nll_path": path,
            "by_heads_kept": [{"heads_kept": k, "stronger": METHODS[int(stronger[k])],
                               **{f"selection_nll_{m}": float(curves[m][k]) for m in METHODS}}
                              for k in scored],
            "greedy_search": {"min_keep": cfg.min_keep, "candidates": cfg.candidates,
                              "windows": len(search), "exact": cfg.candidates == 0},
            "selection_masks_scored": len(seen),
            **timings}
