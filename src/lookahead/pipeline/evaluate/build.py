"""The evaluate stage (DESIGN §2 evaluate): one table that answers the research question — at what
fraction of heads switched off, per token, does the LM keep the NLL of the same LM trained densely on
the same tokens — and the causality check (§4.5) of every decoder.

Rows, all on the context cache's val windows (the positions phase 1, diffusion and phase 2 report on):

    dense_base            the base LM, stock forward
    phase1_soft/_hard     base + the phase-1 predictor (soft execution; hard = thresholded, skipped work)
    diffusion_sample      base + one diffusion sample per position (K samples, their mean NLL)
    diffusion_best_of_k   base + the best of those K per position (an oracle choice: it reads the target)
    phase2_soft/_hard     the phase-2 LM + its predictor (decoder mlp) — or + diffusion samples (`hard` only)
    dense_control         the control LM (same tokens, no topology), stock forward
    static_pruning        the control LM with only its most important heads (probe importance), at the
                          phase-2 hard row's active-head fraction (linear between whole head counts)
    random_heads          the control LM with random per-position heads at that fraction
    static_pruning_phase2, random_heads_phase2   the same two baselines on the phase-2 LM

Each row: NLL and perplexity; active-head and active-edge fraction, mean and per layer (soft rows:
the mean gate value and edge weight — every head is computed there); estimated attention FLOPs per
token relative to dense; measured forward tokens/s relative to the stock dense forward of the same
batch (topologies computed beforehand, hard rows skip the work of off heads).

Attention FLOPs of a (head, position) pair that runs: 2·d·D per projection for q, k, v and the
output (8·d·D) plus 4·D·n_keys for scores and the weighted sum, where n_keys counts the positions
≤ t at which that head runs (off positions have no key). Dense: every pair, n_keys = t + 1. The
head-graph mixing (2·d per edge into a head that runs: building that head's input stream) is not
in the stock model; it is reported beside, as ``mixing_flops_over_dense``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from pathlib import Path
from typing import Callable, Literal

import numpy as np
import torch
from tqdm import tqdm

from lookahead.artifacts.contexts import ContextCache
from lookahead.core.errors import LookaheadError, require
from lookahead.core.seeds import seed_summary, seeded_headline
from lookahead.graph.nodes import allowed_mask
from lookahead.graph.runtime import forward_with_topology
from lookahead.graph.scoring import GeoLookup, interpolate_curve, static_pruning_curve
from lookahead.lm.nll import token_nll


class EvaluateError(LookaheadError, ValueError):
    """Inputs that do not fit together, or a failed causality check."""


@dataclasses.dataclass
class EvaluateConfig:
    """The final table, the causality check and the explainer figure (DESIGN §2 evaluate)."""

    seeds: int = 3
    """Runs over seeds of the diffusion samples and random heads, for each headline figure's mean and `_sd`
    (lookahead.core.seeds); the first, with the configured seeds, writes the outputs."""
    eval_sequences: int = 0
    """Val windows of the context cache scored (0 = all of them)."""
    eval_batch_size: int = 8
    """Windows per forward pass."""
    diffusion_samples: int = 8
    """K: diffusion samples per position (one-sample NLL is their mean; best-of-K their per-position minimum)."""
    random_draws: int = 3
    """Draws of the random per-position heads baseline (its NLL is their mean)."""
    timing_rounds: int = 5
    """Timed forwards per row (interleaved with the dense forward; the median is reported)."""
    causality_windows: int = 2
    """Val windows the causality check perturbs."""
    causality_cuts: int = 3
    """Cut points t per window: the tokens after t are replaced, positions <= t must not change."""
    causality_tolerance: float = 1.0e-5
    """Largest change of a logit or topology entry at <= t that passes (float noise of batched encoders)."""
    explainer_window: int = 0
    """Val window whose tokens the explainer figure shows."""
    explainer_tokens: int = 24
    """Tokens of that window shown (from its start)."""
    seed: int = 0
    """Seed of the diffusion samples, the random heads and the causality perturbations."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """`auto` = CUDA when available."""

    def __post_init__(self) -> None:
        require(self.seeds >= 1, "seeds", f"must be >= 1; got {self.seeds}")
        for name in ("eval_batch_size", "diffusion_samples", "random_draws", "timing_rounds", "causality_windows",
                     "causality_cuts", "explainer_tokens"):
            require(getattr(self, name) >= 1, name, f"must be >= 1; got {getattr(self, name)}")
        for name in ("eval_sequences", "explainer_window", "seed"):
            require(getattr(self, name) >= 0, name, f"must be >= 0; got {getattr(self, name)}")
        require(math.isfinite(self.causality_tolerance) and self.causality_tolerance >= 0, "causality_tolerance",
                f"must be a finite number >= 0; got {self.causality_tolerance}")


# ------------------------------------------------------------------------------ topology figures


@dataclasses.dataclass
class Shapes:
    """What the figures of a topology need to know about the model."""

    n_layers: int
    n_heads: int
    d_model: int
    d_head: int

    @classmethod
    def of(cls, lm) -> Shapes:
        c = lm.config
        return cls(c.num_hidden_layers, c.num_attention_heads, c.hidden_size, c.hidden_size // c.num_attention_heads)


def position_figures(adjacency: torch.Tensor, gates: torch.Tensor, s: Shapes) -> dict[str, torch.Tensor]:
    """Per-position figures of per-position topologies A (B, T, N, N), g (B, T, N):

    heads (B, T, L): summed gates of each layer's heads; edges (B, T, L): summed edge weights into
    each layer's heads; attn_flops, dense_flops, mixing_flops (B, T): see the module docstring.
    """
    b, t = gates.shape[:2]
    L, H, d, D = s.n_layers, s.n_heads, s.d_model, s.d_head
    g = gates[..., 1:].reshape(b, t, L, H)
    into = adjacency[..., 1:].reshape(b, t, -1, L, H).sum(2)  # (B, T, L, H): weight into each head
    on = (g > 0).to(adjacency.dtype)  # a pair that runs (soft gates: every pair with any weight)
    keys = on.cumsum(1)  # (B, T, L, H): positions <= t at which the head runs
    attn = (on * (8 * d * D + 4 * D * keys)).sum((-2, -1))
    positions = torch.arange(1, t + 1, device=gates.device, dtype=adjacency.dtype)
    dense = L * H * (8 * d * D + 4 * D * positions).expand(b, t)
    edges_into_running = ((adjacency[..., 1:] > 0).to(adjacency.dtype).reshape(b, t, -1, L, H) * on[:, :, None]).sum((2, 3, 4))
    return {"heads": g.sum(-1), "edges": into.sum(-1), "attn_flops": attn, "dense_flops": dense,
            "mixing_flops": 2 * d * edges_into_running}


class RowTotals:
    """Running sums of one table row."""

    def __init__(self, s: Shapes):
        self.s = s
        self.nll = self.flops = self.dense_flops = self.mixing = 0.0
        self.positions = 0
        self.heads = torch.zeros(s.n_layers, dtype=torch.float64)
        self.edges = torch.zeros(s.n_layers, dtype=torch.float64)
        self.has_topology = False

    def add(self, nll: torch.Tensor, figures: dict[str, torch.Tensor] | None) -> None:
        """nll (B, T); figures of :func:`position_figures` (None: dense)."""
        self.nll += nll.double().sum().item()
        self.positions += nll.numel()
        if figures is None:
            return
        self.has_topology = True
        self.heads += figures["heads"].double().sum((0, 1)).cpu()
        self.edges += figures["edges"].double().sum((0, 1)).cpu()
        self.flops += figures["attn_flops"].double().sum().item()
        self.dense_flops += figures["dense_flops"].double().sum().item()
        self.mixing += figures["mixing_flops"].double().sum().item()

    def row(self) -> dict:
        s, n = self.s, max(self.positions, 1)
        nll = self.nll / n
        out = {"nll": nll, "ppl": math.exp(min(nll, 700.0))}
        if not self.has_topology:
            ones = [1.0] * s.n_layers
            return {**out, "active_head_fraction": 1.0, "active_head_fraction_per_layer": ones,
                    "active_edge_fraction": 1.0, "active_edge_fraction_per_layer": ones,
                    "attention_flops_over_dense": 1.0, "mixing_flops_over_dense": 0.0}
        allowed = torch.tensor([s.n_heads * (1 + layer * s.n_heads) for layer in range(s.n_layers)], dtype=torch.float64)
        heads = (self.heads / (n * s.n_heads)).tolist()
        edges = (self.edges / (n * allowed)).tolist()
        return {**out, "active_head_fraction": float(np.mean(heads)), "active_head_fraction_per_layer": heads,
                "active_edge_fraction": float(self.edges.sum() / (n * allowed.sum())), "active_edge_fraction_per_layer": edges,
                "attention_flops_over_dense": self.flops / self.dense_flops,
                "mixing_flops_over_dense": self.mixing / self.dense_flops}


# A row's topology source: (ids (B, T), contexts (B, T, C), geo (B, T, G)) → K samples [(A, g)], each
# (B, T, N, N) and (B, T, N), or shared (N, N) and (N,); None: dense.
Topologies = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], list | None]


@dataclasses.dataclass
class RowSpec:
    name: str
    lm: object
    topologies: Topologies | None
    hard: bool = True
    best_of: str | None = None  # also a row of this name: per position, the sample with the lowest NLL


def shared_topology(importance: torch.Tensor, fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Static pruning's topology: the round(fraction · L·H) most important heads, all edges among them."""
    n_layers, n_heads = importance.shape
    k = round(fraction * n_layers * n_heads)
    order = torch.argsort(importance.flatten(), descending=True, stable=True)
    gates = torch.zeros(1 + n_layers * n_heads)
    gates[0] = 1.0
    gates[1 + order[:k]] = 1.0
    return allowed_mask(n_layers, n_heads).float() * gates[:, None] * gates[None, :], gates


def random_topology(n_layers: int, n_heads: int, fraction: float, shape: tuple[int, int],
                    generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random per-position heads (each on with probability ``fraction``), all edges among them."""
    gates = (torch.rand(*shape, 1 + n_layers * n_heads, generator=generator) < fraction).float()
    gates[..., 0] = 1.0
    return allowed_mask(n_layers, n_heads).float() * gates[..., :, None] * gates[..., None, :], gates


@torch.no_grad()
def score_rows(specs: list[RowSpec], cache: ContextCache, geo: GeoLookup, rows: np.ndarray, batch_size: int,
               device) -> dict[str, dict]:
    """Every row's figures over the val windows ``rows``."""
    totals = {spec.name: RowTotals(Shapes.of(spec.lm)) for spec in specs}
    totals.update({spec.best_of: RowTotals(Shapes.of(spec.lm)) for spec in specs if spec.best_of})
    for start in range(0, len(rows), batch_size):
        windows, contexts = (x.to(device) for x in cache.batch("val", rows[start : start + batch_size]))
        ids, targets = windows[:, :-1], windows[:, 1:]
        features = geo(ids)
        b, t = ids.shape
        for spec in specs:
            s = totals[spec.name].s
            samples = spec.topologies(ids, contexts, features) if spec.topologies else None
            if samples is None:
                totals[spec.name].add(token_nll(spec.lm(input_ids=ids).logits, targets), None)
                continue
            nlls, figures = [], []
            for adjacency, gates in samples:
                nlls.append(token_nll(forward_with_topology(spec.lm, ids, adjacency, gates, hard=spec.hard), targets))
                if adjacency.dim() == 2:  # shared: the same figures at every position
                    adjacency, gates = adjacency.expand(b, t, *adjacency.shape), gates.expand(b, t, -1)
                figures.append(position_figures(adjacency, gates, s))
            for nll, fig in zip(nlls, figures):
                totals[spec.name].add(nll, fig)
            if spec.best_of:  # per position, the sample with the lowest NLL (and its figures)
                nll = torch.stack(nlls)  # (K, B, T)
                pick = nll.argmin(0)
                chosen = {k: torch.stack([f[k] for f in figures]) for k in figures[0]}
                gathered = {k: v.gather(0, pick.view(1, b, t, *([1] * (v.dim() - 3))).expand(1, *v.shape[1:]))[0]
                            for k, v in chosen.items()}
                totals[spec.best_of].add(nll.min(0).values, gathered)
    return {name: tot.row() for name, tot in totals.items()}


def _seconds(call: Callable[[], object], device: torch.device) -> float:
    tic = time.perf_counter()
    call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - tic


@torch.no_grad()
def time_rows(specs: list[RowSpec], ids: torch.Tensor, topologies: dict[str, tuple], rounds: int,
              device: torch.device) -> dict[str, float]:
    """Forward tokens/s of each row's LM with its topology (``topologies[name]``, drawn beforehand for the
    batch ``ids``), over the stock dense forward of the same LM and batch (rounds interleaved; medians).
    Models, ids and topologies are moved to ``device`` (and the models back where they were)."""
    ids = ids.to(device)
    out = {}
    for spec in specs:
        home = next(spec.lm.parameters()).device
        lm = spec.lm.to(device)
        adjacency, gates = (x.to(device) for x in topologies[spec.name])
        lm(input_ids=ids)  # warm-up
        forward_with_topology(lm, ids, adjacency, gates, hard=spec.hard)
        dense, graph = [], []
        for _ in range(rounds):
            dense.append(_seconds(lambda: lm(input_ids=ids), device))
            graph.append(_seconds(lambda: forward_with_topology(lm, ids, adjacency, gates, hard=spec.hard), device))
        out[spec.name] = statistics.median(dense) / statistics.median(graph)  # (tokens/s) / (dense tokens/s)
        spec.lm.to(home)
    return out


# ------------------------------------------------------------------------------------ causality


@torch.no_grad()
def causality_check(decoders: dict[str, tuple[object, Topologies]], encoder, cache: ContextCache, geo: GeoLookup,
                    cfg: EvaluateConfig, vocab_size: int, device) -> dict:
    """§4.5 on real val text with the real encoder: for each of ``causality_windows`` val windows and
    ``causality_cuts`` cut points t, the tokens after t are replaced by random ones, the contexts are
    encoded again, and every decoder's topology (A, g) and its LM's logits at positions <= t are
    compared with those of the original window. Each decoder is called once per window with its
    generator seeded the same, so a sampler draws the same numbers at the same positions.

    Returns the largest change at <= t per decoder (and overall), and the share of positions > t whose
    logits did change (evidence that the perturbation reached the model)."""
    windows = torch.from_numpy(cache.windows("val")[: cfg.causality_windows, :-1].astype(np.int64))
    t_len = windows.shape[1]
    cuts = sorted({int(c) for c in np.linspace(t_len // 4, 3 * t_len // 4, cfg.causality_cuts)})
    gen = torch.Generator().manual_seed(cfg.seed)
    variants, cut_of = [], []
    for w in windows:
        variants.append(w)
        cut_of.append(None)
        for cut in cuts:
            changed = w.clone()
            tail = torch.randint(0, vocab_size, (t_len - cut - 1,), generator=gen)
            changed[cut + 1 :] = torch.where(tail == w[cut + 1 :], (tail + 1) % vocab_size, tail)  # every later token differs
            variants.append(changed)
            cut_of.append(cut)
    ids = torch.stack(variants)
    contexts = encoder.encode(ids).to(device)  # (V, T, C)
    ids = ids.to(device)
    features = geo(ids)
    per_decoder, after_changed = {}, []
    for name, (lm, topologies) in decoders.items():
        outs = []
        for i in range(len(ids)):  # one call per window: the same generator state for each
            (adjacency, gates), = topologies(ids[i : i + 1], contexts[i : i + 1], features[i : i + 1])
            logits = forward_with_topology(lm, ids[i : i + 1], adjacency, gates, hard=True)
            outs.append((adjacency[0], gates[0], logits[0]))
        worst = 0.0
        for i, cut in enumerate(cut_of):
            if cut is None:
                original = outs[i]
                continue
            upto = slice(0, cut + 1)
            a, g, logit = outs[i]
            worst = max(worst, (a[upto] - original[0][upto]).abs().max().item(),
                        (g[upto] - original[1][upto]).abs().max().item(),
                        (logit[upto] - original[2][upto]).abs().max().item())
            after_changed.append(((logit[cut + 1 :] - original[2][cut + 1 :]).abs().amax(-1) > 0).float().mean().item())
        per_decoder[name] = worst
    return {"max_change": max(per_decoder.values()), "per_decoder": per_decoder, "cuts": cuts,
            "windows": int(len(windows)), "after_cut_changed_fraction": float(np.mean(after_changed)),
            "tolerance": cfg.causality_tolerance, "passed": max(per_decoder.values()) <= cfg.causality_tolerance}


# ------------------------------------------------------------------------------------ the stage


def predictor_topologies(predictor, hard: bool) -> Topologies:
    """The predictor's deterministic topology (eval mode: no noise), soft or hard."""
    def draw(ids, contexts, geo):
        return [predictor(contexts, geo if predictor.geo_dim else None, hard=hard)]

    return draw


def diffusion_topologies(denoiser, k: int, steps: int, temperature: float, seed: int, device,
                         reseed: bool = False) -> Topologies:
    """K diffusion samples per position, executed by the hard cascade. ``reseed``: the generator
    starts again from ``seed`` at every call (the causality check needs the same draws per call)."""
    generator = torch.Generator(device=device).manual_seed(seed)

    def draw(ids, contexts, geo):
        if reseed:
            generator.manual_seed(seed)
        b, t = ids.shape
        flat_geo = geo.flatten(0, 1) if denoiser.geo_dim else None
        out = []
        for _ in range(k):
            adjacency, gates = denoiser.executed(denoiser.sample(contexts.flatten(0, 1), flat_geo, steps, generator,
                                                                 temperature))
            out.append((adjacency.view(b, t, *adjacency.shape[1:]), gates.view(b, t, -1)))
        return out

    return draw


def static_topologies(importance: torch.Tensor, fraction: float, device) -> Topologies:
    adjacency, gates = shared_topology(importance, fraction)
    return lambda ids, contexts, geo: [(adjacency.to(device), gates.to(device))]


def random_topologies(n_layers: int, n_heads: int, fraction: float, draws: int, seed: int, device) -> Topologies:
    generator = torch.Generator().manual_seed(seed)  # batches come in a fixed order: a fixed draw per batch

    def draw(ids, contexts, geo):
        return [tuple(x.to(device) for x in random_topology(n_layers, n_heads, fraction, tuple(ids.shape), generator))
                for _ in range(draws)]

    return draw


# metrics/evaluate.json (lookahead.core.report): the headline keys
# Rows drawn at random, scored over `seeds` seeds: their NLLs are the mean over seeds (`<row>_nll`,
# with `<row>_nll_sd`); the table keeps the first seed's rows
SEEDED_ROWS = ("diffusion_sample", "diffusion_best_of_k", "random_heads")
HEADLINE = seeded_headline(("dense_base_nll", "dense_control_nll", "phase1_hard_nll", "phase2_soft_nll",
                            "phase2_hard_nll", "phase2_active_head_fraction", "phase2_active_edge_fraction",
                            "static_pruning_nll", "random_heads_nll", "diffusion_sample_nll", "diffusion_best_of_k_nll",
                            "attention_flops_over_dense", "causality_max_change"),
                           [f"{name}_nll" for name in SEEDED_ROWS])

ROW_ORDER = ("dense_base", "phase1_soft", "phase1_hard", "diffusion_sample", "diffusion_best_of_k", "phase2_soft",
             "phase2_hard", "dense_control", "static_pruning", "random_heads", "static_pruning_phase2",
             "random_heads_phase2")


@dataclasses.dataclass
class Evaluation:
    """The report and what the plots and the explainer figure are drawn from."""

    report: dict
    static_curve: list[dict]
    explainer: dict
    info: dict
    """Shapes and names the explainer's data-flow panel shows."""


def _load_lm(path, device):
    from transformers import AutoModelForCausalLM

    if not (Path(path) / "config.json").is_file():
        raise EvaluateError(f"model directory {path} not found or incomplete (run `dvc repro` up to its stage)")
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().requires_grad_(False).to(device)


def build_evaluate(cfg: EvaluateConfig, base_dir, contexts_dir, init_file, heads_file, predictor_file, diffusion_dir,
                   phase2_dir, control_dir) -> Evaluation:
    """Score every row, time the hard ones, check causality; raise :class:`EvaluateError` if it fails."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from lookahead.artifacts.phase2 import LM_DIR, PREDICTOR_FILE, load_phase2
    from lookahead.core.devices import resolve_device
    from lookahead.graph.denoiser import load_denoiser
    from lookahead.graph.predictor import load_init, load_predictor
    from lookahead.lm.encoders import load_context_encoder

    device = torch.device(resolve_device(cfg.device, "evaluate.device"))
    cache = ContextCache(contexts_dir)
    n_val = len(cache.windows("val"))
    if cfg.explainer_window >= n_val:
        raise EvaluateError(f"evaluate.explainer_window: must be < {n_val} (the cache's val windows); "
                            f"got {cfg.explainer_window}")
    rows = np.arange(n_val if cfg.eval_sequences == 0 else min(cfg.eval_sequences, n_val))
    tensors, _ = load_init(init_file)
    geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float()).to(device)
    importance = load_file(str(heads_file))["importance"].float()
    phase2 = load_phase2(phase2_dir)
    base, lm2, control = (_load_lm(p, device) for p in (base_dir, Path(phase2_dir) / LM_DIR, control_dir))
    s = Shapes.of(base)
    if tuple(importance.shape) != (s.n_layers, s.n_heads) or (phase2["n_layers"], phase2["n_heads"]) != (s.n_layers, s.n_heads):
        raise EvaluateError(f"base model ({s.n_layers} x {s.n_heads} heads), head statistics {heads_file} "
                            f"{tuple(importance.shape)} and phase 2 ({phase2['n_layers']} x {phase2['n_heads']}) disagree: "
                            "rerun `dvc repro`")
    predictor1, meta = load_predictor(predictor_file)
    denoiser, dmeta = load_denoiser(diffusion_dir)
    for name, dim in (("phase-1 predictor", meta["context_dim"]), ("diffusion head", dmeta["context_dim"])):
        if dim != cache.dim:
            raise EvaluateError(f"the {name} takes {dim}-dim contexts but the cache holds {cache.dim}-dim ones: "
                                "rerun `dvc repro`")
    predictor1.to(device).eval()
    denoiser.to(device).eval()
    sampling = dmeta.get("diffusion", {})
    steps, temperature = int(sampling.get("sample_steps", 10)), float(sampling.get("sample_temperature", 1.0))

    decoder = phase2["decoder"]
    predictor2 = None
    if decoder == "mlp":
        predictor2, _ = load_predictor(Path(phase2_dir) / PREDICTOR_FILE)
        predictor2.to(device).eval()
        phase2_hard = predictor_topologies(predictor2, hard=True)
    else:
        phase2_hard = diffusion_topologies(denoiser, 1, steps, temperature, cfg.seed + 1, device)

    # causality (§4.5) first — a failure fails the stage before the long scoring: the real encoder on
    # perturbed val text, every decoder
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    enc_cfg = cache.meta.get("config", {})
    encoder = load_context_encoder(cache.meta["encoder"], base_dir, tokenizer, int(enc_cfg.get("window", 16)),
                                   bool(enc_cfg.get("trust_remote_code", False)), device=device)
    decoders = {"phase1 predictor": (base, predictor_topologies(predictor1, hard=True)),
                "diffusion head": (base, diffusion_topologies(denoiser, 1, steps, temperature, cfg.seed, device, reseed=True))}
    if predictor2 is not None:
        decoders["phase-2 predictor"] = (lm2, predictor_topologies(predictor2, hard=True))
    else:
        decoders["phase-2 diffusion"] = (lm2, diffusion_topologies(denoiser, 1, steps, temperature, cfg.seed + 1, device,
                                                                   reseed=True))
    causality = causality_check(decoders, encoder, cache, geo, cfg, base.config.vocab_size, device)
    if not causality["passed"]:
        worst = max(causality["per_decoder"], key=causality["per_decoder"].get)
        raise EvaluateError(f"causality check failed (DESIGN §4.5): changing tokens after t changed the {worst}'s "
                            f"topology or logits at <= t by {causality['per_decoder'][worst]:.3g} "
                            f"(tolerance {cfg.causality_tolerance}); per decoder: {causality['per_decoder']}")

    specs = [
        RowSpec("dense_base", base, None),
        RowSpec("phase1_soft", base, predictor_topologies(predictor1, hard=False), hard=False),
        RowSpec("phase1_hard", base, predictor_topologies(predictor1, hard=True)),
        RowSpec("diffusion_sample", base, diffusion_topologies(denoiser, cfg.diffusion_samples, steps, temperature,
                                                                cfg.seed, device), best_of="diffusion_best_of_k"),
        RowSpec("phase2_hard", lm2, phase2_hard),
        RowSpec("dense_control", control, None),
    ]
    if predictor2 is not None:
        specs.insert(4, RowSpec("phase2_soft", lm2, predictor_topologies(predictor2, hard=False), hard=False))
    results = score_rows(specs, cache, geo, rows, cfg.eval_batch_size, device)

    fraction = results["phase2_hard"]["active_head_fraction"]
    baselines = []
    for suffix, lm in (("", control), ("_phase2", lm2)):
        baselines += [RowSpec(f"static_pruning{suffix}", lm, static_topologies(importance, fraction, device)),
                      RowSpec(f"random_heads{suffix}", lm, random_topologies(s.n_layers, s.n_heads, fraction,
                                                                              cfg.random_draws, cfg.seed, device))]
    results.update(score_rows(baselines, cache, geo, rows, cfg.eval_batch_size, device))

    # the rows the stage's own randomness draws (diffusion samples, random heads), again on other
    # seeds (lookahead.core.seeds); every other row is a deterministic function of its inputs
    def seeded_rows(seed: int) -> list[RowSpec]:
        return [RowSpec("diffusion_sample", base, diffusion_topologies(denoiser, cfg.diffusion_samples, steps,
                                                                       temperature, seed, device),
                        best_of="diffusion_best_of_k"),
                RowSpec("random_heads", control, random_topologies(s.n_layers, s.n_heads, fraction, cfg.random_draws,
                                                                   seed, device))]

    def seeded_figures(scored: dict) -> dict[str, float]:
        return {f"{name}_nll": scored[name]["nll"] for name in SEEDED_ROWS}

    per_seed = [seeded_figures(results)]
    for offset in tqdm(range(1, cfg.seeds), desc="evaluate seeds", unit="seed", disable=cfg.seeds <= 1):
        per_seed.append(seeded_figures(score_rows(seeded_rows(cfg.seed + offset), cache, geo, rows,
                                                  cfg.eval_batch_size, device)))
    windows = [torch.from_numpy(cache.windows("val")[rows[i : i + cfg.eval_batch_size]].astype(np.int64)).to(device)
               for i in range(0, len(rows), cfg.eval_batch_size)]
    static_curve = static_pruning_curve(control, windows, importance)

    # timing: the first val batch, each row's first topology drawn once and timed on every device
    timed = [spec for spec in specs + baselines if spec.topologies is not None]
    windows, contexts = (x.to(device) for x in cache.batch("val", rows[: cfg.eval_batch_size]))
    ids = windows[:, :-1]
    first = {spec.name: spec.topologies(ids, contexts, geo(ids))[0] for spec in timed}
    speed = {device.type: time_rows(timed, ids, first, cfg.timing_rounds, device)}
    if device.type == "cpu" and torch.cuda.is_available():  # a GPU is present: time there too
        speed["cuda"] = time_rows(timed, ids, first, cfg.timing_rounds, torch.device("cuda"))
    for name, row in results.items():
        row["tokens_per_s_over_dense"] = speed[device.type].get(name, 1.0 if name.startswith("dense") else None)
        if "cuda" in speed and device.type != "cuda":
            row["cuda_tokens_per_s_over_dense"] = speed["cuda"].get(name)

    explainer = explainer_data(cfg, cache, geo, tokenizer, lm2, predictor2, phase2_hard, device)
    table = {name: results[name] for name in ROW_ORDER if name in results}
    p2 = table["phase2_hard"]
    report = {
        "dense_base_nll": table["dense_base"]["nll"],
        "dense_control_nll": table["dense_control"]["nll"],
        "phase1_hard_nll": table["phase1_hard"]["nll"],
        "phase2_soft_nll": table["phase2_soft"]["nll"] if "phase2_soft" in table else None,
        "phase2_hard_nll": p2["nll"],
        "phase2_active_head_fraction": p2["active_head_fraction"],
        "phase2_active_edge_fraction": p2["active_edge_fraction"],
        "static_pruning_nll": table["static_pruning"]["nll"],
        "random_heads_nll": table["random_heads"]["nll"],
        **seed_summary(per_seed, [f"{name}_nll" for name in SEEDED_ROWS]),
        "per_seed": per_seed,
        "attention_flops_over_dense": p2["attention_flops_over_dense"],
        "hard_tokens_per_s_over_dense": p2["tokens_per_s_over_dense"],  # a timing: metrics/evaluate_timing.json
        "causality_max_change": causality["max_change"],
        "phase2_hard_minus_control": p2["nll"] - table["dense_control"]["nll"],
        "static_pruning_interpolated_nll": interpolate_curve(static_curve, fraction),
        "decoder": decoder,
        "val_positions": int(len(rows) * cache.context_length),
        "diffusion_samples": cfg.diffusion_samples,
        "timing_device": device.type,
        "table": table,
        "causality": causality,
    }
    rank = (predictor2 or predictor1).cfg.rank
    info = {"context_length": cache.context_length, "encoder": cache.meta["encoder"], "context_dim": cache.dim,
            "nodes": 1 + s.n_layers * s.n_heads, "rank": rank, "n_layers": s.n_layers, "n_heads": s.n_heads}
    return Evaluation(report, static_curve, explainer, info)


@torch.no_grad()
def explainer_data(cfg: EvaluateConfig, cache: ContextCache, geo: GeoLookup, tokenizer, lm, predictor,
                   phase2_hard: Topologies, device) -> dict:
    """One val window under the phase-2 decoder: its tokens, each token's hard gates, and the soft
    graph (A, g) of the token whose active fraction is nearest the window's median."""
    windows, contexts = (x.to(device) for x in cache.batch("val", [cfg.explainer_window]))
    ids = windows[:, :-1]
    features = geo(ids)
    (adjacency, gates), = phase2_hard(ids, contexts, features)
    shown = min(cfg.explainer_tokens, ids.shape[1])
    hard_gates = gates[0, :shown].cpu()  # (T', N)
    fractions = hard_gates[:, 1:].mean(-1)
    token = int((fractions - fractions.median()).abs().argmin())
    if predictor is not None:  # the soft graph: edge widths from A
        soft_a, soft_g = predictor(contexts, features if predictor.geo_dim else None, hard=False)
        graph_a, graph_g = soft_a[0, token].cpu(), soft_g[0, token].cpu()
    else:
        graph_a, graph_g = adjacency[0, token].cpu(), gates[0, token].cpu()
    pieces = [tokenizer.decode([i]) for i in ids[0, :shown].tolist()]
    return {"tokens": pieces, "gates": hard_gates, "token": token, "adjacency": graph_a, "graph_gates": graph_g,
            "hard_gates_of_token": hard_gates[token], "window": cfg.explainer_window}
