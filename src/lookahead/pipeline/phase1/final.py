"""Phase 1's final figures, every one on the same windows (docs/reproducibility.md): the scoring set of
``scoring.set`` (the test set at the committed run, the selection set in comparisons), or — for a
router that reads the context cache, whose encodings exist only for the cache's windows — the
cache's val windows, labelled so.

Per seed, on those windows: the frozen LM dense; the router's hard gates on a dense pass's states
and as deployed (its inputs from its own routed states); static pruning — the stronger static
baseline on the selection windows at each head count (:mod:`lookahead.artifacts.static_baselines`),
run as a pruned model runs (:data:`STATIC_SKIP`) — at the router's head count and at its deployed
MACs, and both static baselines at the router's count; random heads (exactly K per position); the leave-one-out and
the greedy label-free oracles at K; the router's and a static mask's recall of the greedy oracle's
heads (per position, so that their difference gets an interval); the routing statistics of the hard gates; and the router's inputs shuffled across positions.
What no seed changes (dense, static pruning, the oracles) is computed once, in :attr:`ScoringSet.shared`.

The claims with intervals (:mod:`lookahead.core.intervals`) pair these per-position NLLs seed by
seed: ``router_minus_static_pruning`` (the router on a dense pass's states: a dense forward *and*
the routed one, about twice dense MACs), ``deployed_minus_static_pruning`` (the router as deployed,
at the same head count) and ``deployed_minus_static_at_equal_macs`` (static pruning keeping as
many heads as the deployed router's MACs per token pay for, its own MACs counted as they run — a
pruned head costs nothing, a kept one attends every key — interpolated between whole head counts;
on a grouped model routed by query heads, where a static mask's MACs jump as a key/value group
empties, time-shared between the two whole masks whose MACs, counted from their gates, bracket the
router's: :func:`static_time_shared`); ``oracle_recall_minus_static_recall`` (claimed above 0);
``greedy_capture`` — the router as it runs (as deployed where it can be, else its hard gates), with
``dense_state_greedy_capture`` the router on a dense pass's states beside it — gets the interval of its ratio.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.static_baselines import METHODS, StaticBaselines
from lookahead.artifacts.val_scores import ScoringConfig, batches, paired
from lookahead.core.devices import eval_mode
from lookahead.core.intervals import claim_figures, claim_keys, paired_interval, ratio_interval
from lookahead.core.windows import set_label
from lookahead.graph.cost import attention_width, gate_macs, kv_width, macs_per_token
from lookahead.graph.deployed import Router, layer_routed, self_consistent
from lookahead.graph.nodes import static_gates, top_k_gates
from lookahead.graph.oracle import gates_nll, leave_one_out_kl, routing_stats
from lookahead.graph.plan import execute
from lookahead.graph.scoring import capture, random_heads_scores, shuffled, static_token_nll
from lookahead.lm.nll import token_nll
from lookahead.train.checkpoints import kept


STATIC_SKIP = "full"
"""The skip mode static pruning runs in: a pruned head has no query, key, value or output at any
token (what a pruned model computes, and what its MACs count: :data:`STATIC_MODE`), whatever
``runtime.skip`` the router runs in."""
STATIC_MODE = "static"
"""How static pruning's MACs are counted (:func:`lookahead.graph.cost.macs_per_token`)."""


@dataclasses.dataclass
class ScoringSet:
    """The val windows the final figures score (``scoring``), in batches with the router's cached
    contexts where it reads them (``predictor.input: cache`` scores the cache's val windows: the
    scoring windows have no encodings), and what does not depend on the seed, computed once."""

    cfg: ScoringConfig
    batches: list[tuple[torch.Tensor, torch.Tensor | None]]
    window: int
    """Positions per window (the bootstrap's block)."""
    label: str = ""
    """The windows' :func:`lookahead.artifacts.val_scores.set_label`."""
    shared: dict = dataclasses.field(default_factory=dict)
    """``dense``, (``static``, its gates), (``loo``, K), (``greedy``, K) → per-position NLLs or gates of the frozen LM."""
    static: StaticBaselines | None = None
    """The static baselines' masks (the stronger on selection at each head count); None: the probe's
    importance (train windows), as in tests that build no static_baselines directory."""
    store: Path | None = None
    """Where the oracles' per-batch results are kept as each batch finishes
    (:func:`lookahead.train.checkpoints.kept`), so that a cut-off scoring run resumes at the first
    batch not done; None: nothing kept."""

    def static_ranking(self, module, keep: int, method: str | None = None) -> torch.Tensor:
        """(L, H): the ranking whose top ``keep`` heads static pruning keeps (``method``: that static
        baseline's, of :data:`lookahead.artifacts.static_baselines.METHODS`; None: the stronger)."""
        if self.static is None:
            return module.importance
        return self.static.ranking(keep) if method is None else self.static.rankings[method]

    def static_source(self, keep: int) -> str:
        """Which mask static pruning keeps at ``keep`` heads."""
        return "probe importance (train windows)" if self.static is None else f"{self.static.method(keep)} (fit windows)"


def scoring_set(cfg: ScoringConfig, windows: torch.Tensor, cache: ContextCache, router_input: str, device,
                static: StaticBaselines | None = None) -> ScoringSet:
    """The scoring windows in batches (or, for a router that reads the cache, the cache's val windows);
    ``static``: the static baselines' masks (:attr:`ScoringSet.static`)."""
    if router_input == "cache":
        rows = np.arange(len(cache.windows("val")))
        out = [tuple(x.to(device) for x in cache.batch("val", rows[i : i + cfg.batch_size]))
               for i in range(0, len(rows), cfg.batch_size)]
        return ScoringSet(cfg, out, cache.context_length, set_label("cache-val", cache.windows("val")), static=static)
    return ScoringSet(cfg, [(w, None) for w in batches(windows, cfg.batch_size, device)], windows.shape[1] - 1,
                      set_label(cfg.set, windows), static=static)


def _cat(parts: list[torch.Tensor]) -> np.ndarray:
    return torch.cat([p.flatten().double().cpu() for p in parts]).numpy()


@torch.no_grad()
def routed(module, model, scoring: ScoringSet, shuffle: bool = False) -> tuple[np.ndarray, torch.Tensor]:
    """Per-position NLL (P,) under the router's hard gates on a dense pass's states, and the gates
    (P, L·H) bool. ``shuffle``: its inputs permuted across all the set's positions (a fixed draw)."""
    inputs = []
    with eval_mode(model):
        for windows, contexts in scoring.batches:
            inputs.append(module.inputs(windows[:, :-1], contexts))
        if shuffle:
            inputs = shuffled(inputs, module.cfg.train.seed)
        nll, on = [], []
        for (windows, _), (context, geo) in zip(scoring.batches, inputs):
            adjacency, gates = model(context, geo, tau=module.tau_now, hard=True)
            nll.append(token_nll(execute(module.lm, windows[:, :-1], adjacency, gates, module.skip), windows[:, 1:]))
            on.append(gates[..., 1:].reshape(-1, module.n_layers * module.n_heads) > 0)
    return _cat(nll), torch.cat(on).cpu()


def _over(module, scoring: ScoringSet, gates_of) -> np.ndarray:
    """Per-position NLL (P,) of the frozen LM under per-position gates ``gates_of(batch index, windows)`` (B, T, N)."""
    return _cat([gates_nll(module.lm, w, gates_of(i, w), module.n_layers, module.n_heads, module.skip)
                 for i, (w, _) in enumerate(scoring.batches)])


@torch.no_grad()
def static_scores(module, scoring: ScoringSet, keep: int, method: str | None = None) -> np.ndarray:
    """Per-position NLL (P,) of static pruning keeping ``keep`` heads: the stronger static mask at that
    count on the selection windows (:attr:`ScoringSet.static`), or ``method``'s."""
    ranking = scoring.static_ranking(module, keep, method)
    mask = tuple(static_gates(ranking, keep).tolist())
    if ("static", mask) not in scoring.shared:  # one forward per distinct mask
        scoring.shared["static", mask] = _cat([static_token_nll(module.lm, w, ranking, keep, STATIC_SKIP)
                                               for w, _ in scoring.batches])
    return scoring.shared["static", mask]


@torch.no_grad()
def greedy_scores(module, scoring: ScoringSet, keep: int) -> tuple[np.ndarray, torch.Tensor]:
    """The greedy label-free oracle keeping ``keep`` heads: per-position NLL (P,) and its heads (P, L·H) bool."""
    if ("greedy", keep) not in scoring.shared:  # the scoring stage's longest step: a bar over its batches
        found = [kept(scoring.store, f"greedy{keep}-{i:05d}", lambda w=w: module.greedy_targets(w[:, :-1], keep),
                      w.device)
                 for i, (w, _) in enumerate(tqdm(scoring.batches, desc=f"greedy oracle, {keep} heads", unit="batch",
                                                 leave=False))]
        gates = [f["gates"] for f in found]
        scoring.shared["greedy_first"] = [f["first"] for f in found]  # every head's leave-one-out KL (any keep)
        nll = _over(module, scoring, lambda i, w: gates[i])
        on = torch.cat([g[..., 1:].reshape(-1, module.n_layers * module.n_heads) > 0 for g in gates]).cpu()
        scoring.shared["greedy", keep] = (nll, on)
    return scoring.shared["greedy", keep]


@torch.no_grad()
def loo_scores(module, scoring: ScoringSet, keep: int) -> np.ndarray:
    """Per-position NLL (P,) of the leave-one-out KL oracle keeping its ``keep`` top heads."""
    if "loo_kl" not in scoring.shared and module.cfg.score_loo_from_greedy:  # the greedy search's first step
        greedy_scores(module, scoring, keep)
        scoring.shared["loo_kl"] = scoring.shared["greedy_first"]
    if "loo_kl" not in scoring.shared:
        scoring.shared["loo_kl"] = [
            kept(scoring.store, f"loo-{i:05d}", lambda w=w: {"kl": leave_one_out_kl(module.lm, w[:, :-1], module.n_layers,
                                                                                  module.n_heads, module.skip)},
                 w.device)["kl"]
            for i, (w, _) in enumerate(tqdm(scoring.batches, desc="leave-one-out KL", unit="batch", leave=False))]
    if ("loo", keep) not in scoring.shared:
        kl = scoring.shared["loo_kl"]
        scoring.shared["loo", keep] = _over(module, scoring, lambda i, w: top_k_gates(kl[i], keep))
    return scoring.shared["loo", keep]


def equal_macs_heads(lm_config, n_heads_total: int, context: float, macs_over_dense: float) -> float:
    """The head count (fractional) static pruning keeps at ``macs_over_dense`` of a dense forward's
    MACs per token, counted as it runs (:func:`lookahead.graph.cost.macs_per_token`, ``static``: a
    pruned head costs nothing, a kept one attends every key; monotone in the share kept: bisection);
    every head where the budget reaches dense."""
    if macs_over_dense >= 1.0:
        return float(n_heads_total)
    dense = macs_per_token(lm_config, context, 1.0, STATIC_MODE)
    lo, hi = 0.0, 1.0
    if macs_per_token(lm_config, context, 0.0, STATIC_MODE) / dense >= macs_over_dense:
        return 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        below = macs_per_token(lm_config, context, mid, STATIC_MODE) / dense < macs_over_dense
        lo, hi = (mid, hi) if below else (lo, mid)
    return (lo + hi) / 2 * n_heads_total


def static_macs_over_dense(module, scoring: ScoringSet, keep: int) -> float:
    """MACs per token of the static mask at ``keep`` heads over a dense forward's, counted from its
    gates as they run (:func:`lookahead.graph.cost.gate_macs`, ``static``: a key/value group's keys
    and values exist where any of its heads is kept), averaged over a window's positions."""
    ranking = scoring.static_ranking(module, keep)
    on = static_gates(ranking, keep)[1:].bool().view(1, 1, module.n_layers, module.n_heads)
    macs = gate_macs(module.lm.config, on.expand(1, scoring.window, -1, -1), STATIC_MODE)
    return float(macs.mean()) / dense_macs(module.lm.config, scoring.window)


def static_time_shared(module, scoring: ScoringSet, macs_over_dense: float) -> tuple[float, np.ndarray]:
    """Static pruning at ``macs_over_dense`` on a grouped model whose nodes are query heads, where a
    mask's MACs jump when a key/value group empties: time-shared between the two whole masks whose
    MACs (:func:`static_macs_over_dense`) bracket it — mask k on a share 1 − w of the tokens, k + 1 on
    the rest, w set by the MACs alone, so nothing is chosen on the scoring windows. (The head count
    it amounts to, (1 − w)·k + w·(k + 1); per-position NLL (P,), the mixture's expectation.)"""
    n = module.n_layers * module.n_heads
    if macs_over_dense >= 1.0:
        return float(n), static_scores(module, scoring, n)
    cost = {}

    def macs(k: int) -> float:
        if k not in cost:
            cost[k] = static_macs_over_dense(module, scoring, k)
        return cost[k]

    if macs(0) >= macs_over_dense:
        return 0.0, static_scores(module, scoring, 0)
    lo, hi = 0, n  # macs(lo) < target <= macs(hi): a kept head only adds MACs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if macs(mid) < macs_over_dense else (lo, mid)
    w = (macs_over_dense - macs(lo)) / (macs(hi) - macs(lo))
    return lo + w, (1 - w) * static_scores(module, scoring, lo) + w * static_scores(module, scoring, hi)


def static_at(module, scoring: ScoringSet, heads: float) -> np.ndarray:
    """Per-position NLL (P,) of static pruning at a fractional head count: linear between the two
    whole counts around it (as :func:`lookahead.graph.scoring.interpolate_curve`)."""
    lo = min(int(math.floor(heads)), module.n_layers * module.n_heads)
    w = heads - lo
    low = static_scores(module, scoring, lo)
    return low if w == 0 else (1 - w) * low + w * static_scores(module, scoring, lo + 1)


DEPLOYED_WINDOWS = 64
"""Windows decoded together by :func:`deployed_nll` (one cached step of each per forward)."""


@torch.no_grad()
def deployed_nll(module, model, scoring: ScoringSet) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-position NLLs (P,) on the scoring set with the router as deployed — its inputs from the
    routed model's own states (:func:`lookahead.graph.deployed.self_consistent`, position by
    position; ``layer``: :func:`lookahead.graph.deployed.layer_routed`, layer by layer), not from
    a dense pass — and the per-position MACs (P,) of the forward those gates run
    (:func:`lookahead.graph.cost.gate_macs`: under ``full`` skip a head's keys are the positions it
    ran at; the router not included). None for routers that read no LM state (the dense-state
    figure is already theirs: ``embedding``) or cannot run that way (``cache``, the cascade)."""
    cfg = model.cfg
    if cfg.input not in ("lm", "layer") or cfg.gate != "head" or cfg.edges == "learned" or module.zero_inputs:
        return None
    windows = torch.cat([w for w, _ in scoring.batches])
    out, macs = [], []
    router = None if cfg.input == "layer" else Router(model, module.lm, module.geo if model.geo_dim else None)
    with eval_mode(model):
        for chunk in windows.split(DEPLOYED_WINDOWS):
            ids = chunk[:, :-1]
            if router is None:
                logits, gates = layer_routed(module.lm, model, ids, module.geo(ids) if model.geo_dim else None, module.skip)
            else:
                logits, gates = self_consistent(module.lm, router, ids, module.skip)
            out.append(token_nll(logits, chunk[:, 1:]).flatten())
            on = gates[..., 1:].reshape(*ids.shape, module.n_layers, module.n_heads)  # (B, T, L, H)
            macs.append(gate_macs(module.lm.config, (on > 0).cpu(), module.skip).flatten())
    return torch.cat(out).numpy(), torch.cat(macs).numpy()


def dense_macs(lm_config, window: int) -> float:
    """A dense forward's MACs per token, averaged over a window's positions (prefill: (T + 1) / 2 keys)."""
    return macs_per_token(lm_config, (window + 1) / 2, 1.0, "query")


@torch.no_grad()
def score_final(module, model, scoring: ScoringSet, router_macs: float | None = None) -> dict:
    """One seed's per-position NLLs (P,) and figures on the scoring set (the module docstring).
    ``router_macs``: the router's MACs per token (None: no equal-MACs comparison); the deployed
    router's MACs per token over dense (``deployed_macs_over_dense``) are its forward's as they ran
    (``deployed_macs``, per position) plus the router's, over a dense forward's."""
    n = module.n_layers * module.n_heads
    if "dense" not in scoring.shared:
        scoring.shared["dense"] = _cat([token_nll(module.lm(input_ids=w[:, :-1]).logits, w[:, 1:])
                                        for w, _ in scoring.batches])
    hard, on = routed(module, model, scoring)
    fraction = on.double().mean().item()
    keep = round(fraction * n)
    out = {"dense": scoring.shared["dense"], "hard": hard, "static": static_scores(module, scoring, keep),
           "static_source": scoring.static_source(keep),
           "active_head_fraction": fraction, "keep": keep, "deployed": None,
           "random": random_heads_scores(module.lm, [w for w, _ in scoring.batches], keep / n, module.n_layers,
                                         module.n_heads, module.cfg.random_draws, module.cfg.train.seed, module.skip),
           **routing_stats(on, module.n_layers)}
    if not module.zero_inputs:
        out["shuffled"] = routed(module, model, scoring, shuffle=True)[0]
    deployed = deployed_nll(module, model, scoring)
    if deployed is not None:
        out["deployed"], out["deployed_macs"] = deployed
    if deployed is not None and router_macs is not None:
        dense = dense_macs(module.lm.config, scoring.window)
        out["deployed_macs_over_dense"] = (float(np.mean(out["deployed_macs"])) + router_macs) / dense
        cfg = module.lm.config
        if kv_width(cfg) < attention_width(cfg) and module.n_heads == cfg.num_attention_heads:  # grouped, query heads
            out["equal_macs_heads"], out["static_equal_macs"] = static_time_shared(
                module, scoring, out["deployed_macs_over_dense"])
        else:
            out["equal_macs_heads"] = equal_macs_heads(cfg, n, (scoring.window + 1) / 2, out["deployed_macs_over_dense"])
            out["static_equal_macs"] = static_at(module, scoring, out["equal_macs_heads"])
    if scoring.static is not None:  # both static baselines, the stronger on selection being "static"
        out.update({f"static_{m}": static_scores(module, scoring, keep, m) for m in METHODS})
    if module.cfg.oracle != "none" and 0 < keep < n:
        out["loo"] = loo_scores(module, scoring, keep)
    if module.cfg.oracle == "greedy" and 0 < keep < n:
        out["greedy"], greedy_on = greedy_scores(module, scoring, keep)
        static_on = static_gates(scoring.static_ranking(module, keep), keep)[1:].bool()
        out["recall"] = ((greedy_on & on).sum(-1).double() / keep).numpy()  # per position (P,)
        out["static_recall"] = ((greedy_on & static_on).sum(-1).double() / keep).numpy()
    return out


def seed_figures(scored: dict) -> dict:
    """One seed's headline figures from :func:`score_final`'s output (means over the positions)."""
    mean = lambda key: None if scored.get(key) is None else float(np.mean(scored[key]))  # noqa: E731
    dense, hard, static = mean("dense"), mean("hard"), mean("static")
    greedy, loo = mean("greedy"), mean("loo")
    increase, static_increase = hard - dense, static - dense
    deployed = mean("deployed")
    runs = hard if deployed is None else deployed  # the router as it runs: hard where it has no routed-state variant
    return {
        "dense_nll": dense, "hard_nll": hard, "deployed_nll": deployed, "static_pruning_nll": static,
        "random_heads_nll": mean("random"), "loo_oracle_nll": loo, "greedy_oracle_nll": greedy,
        "active_head_fraction": scored["active_head_fraction"], "oracle_heads_kept": scored["keep"],
        "hard_nll_increase": increase, "static_pruning_nll_increase": static_increase,
        "increase_over_static_increase": increase / static_increase if static_increase > 0 else None,
        "deployed_increase_over_static_increase": None if deployed is None or static_increase <= 0
        else (deployed - dense) / static_increase,
        "loo_oracle_capture": capture(static, runs, loo), "greedy_capture": capture(static, runs, greedy),
        "dense_state_greedy_capture": capture(static, hard, greedy),
        "oracle_recall_at_k": mean("recall"), "static_recall_at_k": mean("static_recall"),
        "dynamic_fraction": scored["dynamic_fraction"], "gate_entropy_bits": scored["gate_entropy_bits"],
        "context_shuffle_dnll": None if "shuffled" not in scored else mean("shuffled") - hard,
        "equal_macs_static_heads": scored.get("equal_macs_heads"),
        "static_pruning_at_equal_macs_nll": mean("static_equal_macs"),
        "static_pruning_mask": scored["static_source"],
        **{f"static_{m}_nll": mean(f"static_{m}") for m in METHODS},
    }


CLAIMS = (("router_minus_static_pruning", "hard", "static"),
          ("deployed_minus_static_pruning", "deployed", "static"),
          ("deployed_minus_static_at_equal_macs", "deployed", "static_equal_macs"))
"""Phase 1's paired claims: (name, A, B) of per-position NLLs, A − B claimed below 0."""
RECALL_CLAIM = ("oracle_recall_minus_static_recall", "recall", "static_recall")
"""The router's recall of the greedy oracle's heads minus the static mask's, per position: claimed above 0."""


def claims(scores: dict[str, np.ndarray], scoring: ScoringSet) -> dict:
    """The claims' figures (:func:`lookahead.core.intervals.claim_figures`) and intervals, and
    ``greedy_capture``'s interval (the ratio of sums (static − router) / (static − greedy), windows
    bootstrapped, seeds combined), from every seed's per-position NLLs ``scores`` ((seeds, P), or
    (P,) where no seed changes them); None where a figure was not measured (no deployed router, no
    greedy oracle, an oracle that gains nothing over static pruning)."""
    cfg = scoring.cfg
    out = {k: None for name, _, _ in CLAIMS for k in claim_keys(name)}  # null where not measured
    out.update(greedy_capture_ci_low=None, greedy_capture_ci_high=None)
    out.update({k: None for k in claim_keys(RECALL_CLAIM[0])})
    for name, a, b in (*CLAIMS, RECALL_CLAIM):
        if a in scores and b in scores:
            interval = paired_interval(paired(scores[a], scores[b], name), scoring.window, cfg.resamples,
                                       cfg.confidence, cfg.bootstrap_seed)
            out.update(claim_figures(name, interval))
            out[f"{name}_interval"] = interval
    gain = np.atleast_2d(scores["static"] - scores["greedy"]).mean(1) if "greedy" in scores else None
    runs = scores["deployed"] if "deployed" in scores else scores["hard"]  # as greedy_capture: the router as it runs
    if gain is not None and (gain > 0).all():  # as greedy_capture: no ratio where the oracle gains nothing
        ratio = ratio_interval(scores["static"] - runs, scores["static"] - scores["greedy"], scoring.window,
                               cfg.resamples, cfg.confidence, cfg.bootstrap_seed)
        out.update({"greedy_capture_ci_low": ratio["ci_low"], "greedy_capture_ci_high": ratio["ci_high"],
                    "greedy_capture_interval": ratio})
    return out
