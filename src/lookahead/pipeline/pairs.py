"""The pairs stage (docs/pipeline.md): (context, topology) pairs for the structure decoders.

``pairs.target: eps_good`` (the default; issue: a structure decoder that captures several good
topologies) writes a label-free ground truth of good keep sets: for the first ``sequences`` train and
``val_sequences`` val windows of the context cache, :func:`lookahead.graph.keepsets.search_keep_sets`
scores the greedy oracle's keep set and ``rounds`` rounds of single swaps at every position by
KL(dense ‖ routed), and every distinct set within ``eps`` of a position's best is a pair (the
ε-good sets; how many a position has is its multi-modality). It needs head gates under an exact
budget (``predictor.gate: head``, ``budget: topk``) and is deterministic: one run, no seeds.

``pairs.target: beats_dense`` (the earlier definition, for comparison): for the first ``pairs.sequences`` train windows of the context cache, ``pairs.samples`` hard
topologies are drawn per position from the trained predictor (its logistic noise on, then each
allowed edge flipped with probability ``pairs.flip_prob``: see :func:`sample_topologies`), each sample
scored by the frozen LM in one hard forward pass of the whole window, and up to ``pairs.keep``
distinct topologies per position that beat that position's dense NLL are kept (lowest NLL first).
"Beats dense" is a minimum over noisy draws chosen with the target, so the same statistics are
reported for a null: as many random head sets per position at the samples' active-head fraction
(``*_null``).

One forward scores every position of a sample although a position's NLL also depends on the
topologies of the positions before it (through their keys and values). That approximation is
measured: on ``approx_positions`` kept pairs, position t is re-scored with its kept topology at t
and the predictor's deterministic topology everywhere else, and the Spearman correlation between
the two NLL gains over dense is reported.

Output: one safetensors file (a few big arrays) holding, per pair, the context row (window index ·
T + position, into the cache's contexts of the pair's ``split``: 0 train, 1 val), the packed
allowed-edge bits (``lookahead.graph.nodes``), the NLL, the dense NLL, the active head and edge
fractions and, for ``eps_good``, the KL to dense and the set's rank at its position (0 = the best).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
import time
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from tqdm import tqdm

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.pairs import PAIRS_FILE
from lookahead.core.config import OMIT_DEFAULT, to_dict
from lookahead.core.devices import resolve_device
from lookahead.core.errors import LookaheadError, require
from lookahead.core.seeds import over_seeds, seeded_headline
from lookahead.core.windows import set_label
from lookahead.graph.keepsets import as_gates, eps_good, search_keep_sets
from lookahead.graph.nodes import (allowed_mask, head_graph, keep_count, n_edges, pack_bits, random_topology,
                                   unpack_bits)
from lookahead.graph.plan import execute
from lookahead.graph.predictor import load_init, load_predictor
from lookahead.graph.router_inputs import check_context_dim, router_context
from lookahead.graph.runtime import recorded_skip, recorded_unit, unit_shape
from lookahead.graph.sampling import executed_topology, sample_topologies, stored_edges
from lookahead.graph.scoring import GeoLookup
from lookahead.lm.nll import token_nll
from lookahead.train.checkpoints import checkpoint_dir, kept


class PairsError(LookaheadError, ValueError):
    """Inputs of the pairs stage that do not fit its params."""


@dataclasses.dataclass
class PairsConfig:
    """Sampling and scoring (context, topology) pairs."""

    target: Literal["eps_good", "beats_dense"] = "eps_good"
    """What a good topology is: ``eps_good`` (within ``eps`` of the best keep set found, by KL to
    dense; no labels) or ``beats_dense`` (a sample whose NLL beats dense: the earlier definition)."""
    eps: float = 0.01
    """eps_good: a keep set is good at a position when its KL to dense is within this many nats of
    the best one found there."""
    rounds: int = 2
    """eps_good: rounds of single swaps around the best set so far (the first around the greedy
    oracle's), K·(L·H − K) candidates each (or ``swaps``)."""
    swaps: int = dataclasses.field(default=0, metadata=OMIT_DEFAULT)
    """eps_good: single swaps tried per round, a seeded draw (``seed``) of that many of the K·(L·H − K)
    (0: every one; on SmolLM2 18 225, each a forward of the window)."""
    per_round: int = dataclasses.field(default=1, metadata=OMIT_DEFAULT)
    """eps_good: the greedy set's search, heads dropped per step (1: the exact greedy oracle)."""
    candidates: int = dataclasses.field(default=0, metadata=OMIT_DEFAULT)
    """eps_good: ... and heads tried per step after the first (0: every head still on; a lazy greedy
    otherwise, as ``oracle.candidates``)."""
    val_sequences: int = 8
    """eps_good: val windows of the context cache with a ground truth too (the first ones): the
    decoders are judged there."""
    seeds: int = 3
    """beats_dense: runs over seeds of the sampling noise, for each headline figure's mean and `_sd`
    (lookahead.core.seeds); the first, with the configured seeds, writes the outputs. eps_good has no
    randomness and runs once."""
    sequences: int = 32
    """Train windows of the context cache whose positions get pairs (the first ones)."""
    samples: int = 8
    """Topologies sampled per position (predictor noise on)."""
    keep: int = 4
    """Distinct topologies kept per position at most, among those that beat its dense NLL."""
    batch_size: int = 8
    """Windows per forward pass."""
    approx_positions: int = 256
    """Kept pairs re-scored in isolation to measure the one-forward approximation (0 = skip)."""
    flip_prob: float = 0.02
    """Exploration: each allowed edge of a predictor sample flips with this probability before the
    cascade (0 = the predictor's own sampler, which is near-deterministic once its logits are large)."""
    seed: int = 0
    """Seed of the sampling noise and of the re-scored subset."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """`auto` = CUDA when available."""

    def __post_init__(self) -> None:
        require(self.seeds >= 1, "seeds", f"must be >= 1; got {self.seeds}")
        require(self.target in ("eps_good", "beats_dense"), "target",
                f"must be eps_good or beats_dense; got {self.target!r}")
        require(math.isfinite(self.eps) and self.eps >= 0, "eps", f"must be a finite number >= 0; got {self.eps}")
        require(self.rounds >= 1, "rounds", f"must be >= 1; got {self.rounds}")
        require(self.swaps >= 0, "swaps", f"must be >= 0 (0: every single swap); got {self.swaps}")
        require(self.per_round >= 1, "per_round", f"must be >= 1; got {self.per_round}")
        require(self.candidates == 0 or self.candidates >= self.per_round, "candidates",
                f"must be 0 (every head still on) or >= per_round ({self.per_round}); got {self.candidates}")
        require(self.val_sequences >= 1, "val_sequences", f"must be >= 1; got {self.val_sequences}")
        for name in ("sequences", "samples", "keep", "batch_size"):
            require(getattr(self, name) >= 1, name, f"must be >= 1; got {getattr(self, name)}")
        require(self.keep <= self.samples, "keep", f"must be <= samples ({self.samples}); got {self.keep}")
        require(self.approx_positions >= 0, "approx_positions", f"must be >= 0; got {self.approx_positions}")
        require(0.0 <= self.flip_prob <= 0.5, "flip_prob", f"must be in [0, 0.5]; got {self.flip_prob}")
        require(self.seed >= 0, "seed", f"must be >= 0; got {self.seed}")


def select_pairs(bits: np.ndarray, nll: np.ndarray, dense: np.ndarray, keep: int) -> list[list[int]]:
    """Per position, the samples to keep: distinct topologies that beat dense, lowest NLL first.

    bits (S, P, nbytes) packed topologies, nll (S, P), dense (P,). Returns a list over positions of
    sample indices.
    """
    chosen = []
    for p in range(nll.shape[1]):
        seen, picked = set(), []
        for s in np.argsort(nll[:, p], kind="stable"):
            if nll[s, p] >= dense[p] or len(picked) == keep:
                break
            key = bits[s, p].tobytes()
            if key not in seen:
                seen.add(key)
                picked.append(int(s))
        chosen.append(picked)
    return chosen


# metrics/pairs.json (lookahead.core.report); throughput stays in the report
# and their spread over the sampling seed (lookahead.core.seeds)
SEEDED = ("pairs", "pairs_per_position", "mean_gain", "multi_topology_share", "multi_topology_share_null",
          "positions_with_pair_share", "positions_with_pair_share_null", "distinct_sampled_per_position",
          "kept_active_head_fraction", "approximation_spearman")
HEADLINE = seeded_headline(SEEDED, SEEDED)
# pairs.target eps_good: deterministic, so no spread
EPS_HEADLINE = ("pairs", "eps_good_per_position", "eps_good_multi_share", "val_eps_good_per_position",
                "val_eps_good_multi_share", "greedy_kl", "best_kl", "greedy_best_share")


def headline(cfg: PairsConfig) -> tuple[str, ...]:
    """The headline keys of ``metrics/pairs.json`` for the configured target."""
    return EPS_HEADLINE if cfg.target == "eps_good" else HEADLINE

def draw_pairs(cfg: PairsConfig, lm, predictor, cache: ContextCache, geo: GeoLookup, mask: torch.Tensor,
               device, skip: str = "full") -> tuple[dict[str, np.ndarray], list[int], list[int], float]:
    """Sample ``cfg.samples`` topologies per position of the first ``cfg.sequences`` train windows,
    score them with the LM and keep the pairs :func:`select_pairs` picks. Returns (the pairs file's
    arrays, distinct topologies sampled per position, pairs kept per position, seconds)."""
    n_e = n_edges(predictor.n_layers, predictor.n_heads)
    t_len = cache.context_length
    gen = torch.Generator(device=device).manual_seed(cfg.seed)

    rows, bits_out, nll_out, dense_out, heads_out, edges_out = [], [], [], [], [], []
    distinct, kept_counts, null_counts = [], [], []
    null_gen = torch.Generator(device=device).manual_seed(cfg.seed * 1000 + 7)  # apart from the samples' stream
    tic = time.perf_counter()
    with torch.no_grad():
        for start in tqdm(range(0, cfg.sequences, cfg.batch_size), desc="pairs", unit="batch", mininterval=2.0):
            idx = np.arange(start, min(start + cfg.batch_size, cfg.sequences))
            windows, contexts = (x.to(device) for x in cache.batch("train", idx))
            ids, targets = windows[:, :-1], windows[:, 1:]
            dense = token_nll(lm(input_ids=ids).logits, targets)  # (B, T)
            features = geo(ids)
            router = router_context(predictor.cfg.input, lm, ids, contexts)
            sample_bits, sample_nll, sample_heads = [], [], []
            for _ in range(cfg.samples):
                adjacency, gates = sample_topologies(predictor, router, features, cfg.flip_prob, gen)
                sample_nll.append(token_nll(execute(lm, ids, adjacency, gates, skip),
                                            targets))
                sample_bits.append(stored_edges(adjacency, gates, mask))  # (B, T, E)
                sample_heads.append(gates[..., 1:].mean(-1))  # (B, T)
            edges = torch.stack(sample_bits).flatten(1, 2)  # (S, P, E)
            packed = pack_bits(edges)  # (S, P, nbytes)
            nll = torch.stack(sample_nll).flatten(1).cpu().numpy()  # (S, P)
            heads = torch.stack(sample_heads).flatten(1).cpu().numpy()
            edge_share = (edges.sum(-1) / n_e).cpu().numpy()
            dense_flat = dense.flatten().cpu().numpy()
            chosen = select_pairs(packed, nll, dense_flat, cfg.keep)
            # the null: as many random topologies at the samples' active-head fraction, kept the same way
            fraction = float(heads.mean())
            null_bits, null_nll = [], []
            for _ in range(cfg.samples):
                adjacency, gates = random_topology(predictor.n_layers, predictor.n_heads, fraction, tuple(ids.shape),
                                                   null_gen, skip, device)
                null_nll.append(token_nll(execute(lm, ids, adjacency, gates, skip),
                                          targets).flatten())
                null_bits.append(stored_edges(adjacency, gates, mask).flatten(0, 1))
            null_counts += [len(c) for c in select_pairs(pack_bits(torch.stack(null_bits)),
                                                         torch.stack(null_nll).cpu().numpy(), dense_flat, cfg.keep)]
            distinct += [len({packed[s, p].tobytes() for s in range(cfg.samples)}) for p in range(packed.shape[1])]
            for p, picked in enumerate(chosen):
                kept_counts.append(len(picked))
                for s in picked:
                    rows.append(int(idx[p // t_len]) * t_len + p % t_len)
                    bits_out.append(packed[s, p])
                    nll_out.append(nll[s, p])
                    dense_out.append(dense_flat[p])
                    heads_out.append(heads[s, p])
                    edges_out.append(edge_share[s, p])
    seconds = time.perf_counter() - tic

    pairs = len(rows)
    arrays = {
        "rows": np.asarray(rows, dtype=np.int64), "bits": np.asarray(bits_out, dtype=np.uint8).reshape(pairs, -1),
        "nll": np.asarray(nll_out, dtype=np.float32), "dense_nll": np.asarray(dense_out, dtype=np.float32),
        "head_fraction": np.asarray(heads_out, dtype=np.float32), "edge_fraction": np.asarray(edges_out, dtype=np.float32),
    }
    return arrays, distinct, kept_counts, null_counts, seconds


def budget_of(predictor, error: type[Exception] = ValueError) -> int:
    """K, the heads a predictor keeps per token, for keep-set decoders: head gates under the exact
    ``topk`` budget only."""
    cfg = predictor.cfg
    if cfg.gate != "head" or cfg.budget != "topk":
        raise error(f"keep sets need a router with head gates under the topk budget (predictor.gate: head, "
                    f"budget: topk); this one has gate {cfg.gate!r}, budget {cfg.budget!r}: "
                    "use pairs.target: beats_dense")
    total = predictor.n_layers * predictor.n_heads
    return keep_count(total, predictor.n_layers, cfg.keep, per_layer=False)


def ground_truth(cfg: PairsConfig, lm, predictor, cache: ContextCache, mask: torch.Tensor, device, skip: str,
                 store: Path | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """The ε-good keep sets of the first ``cfg.sequences`` train and ``cfg.val_sequences`` val windows
    (module docstring): (the pairs file's arrays, figures). ``store``: each batch's search is kept
    there as it finishes (:func:`lookahead.train.checkpoints.kept`), so that a cut-off run resumes."""
    k = budget_of(predictor, PairsError)
    n_l, n_h = predictor.n_layers, predictor.n_heads
    n_e = n_edges(n_l, n_h)
    t_len = cache.context_length
    out = {key: [] for key in ("rows", "split", "bits", "nll", "dense_nll", "kl", "rank")}
    counts, greedy_kl, best_kl, greedy_best, candidates = {0: [], 1: []}, [], [], [], 0
    tic = time.perf_counter()
    jobs = [(split, idx) for split, n in ((0, cfg.sequences), (1, cfg.val_sequences))
            for idx in np.array_split(np.arange(n), max(1, -(-n // cfg.batch_size)))]
    with torch.no_grad():
        for j, (split, idx) in enumerate(tqdm(jobs, desc="pairs (eps-good sets)", unit="batch", mininterval=2.0)):
            windows, _ = (x.to(device) for x in cache.batch(("train", "val")[split], idx))
            ids, targets = windows[:, :-1], windows[:, 1:]

            def search(ids=ids, targets=targets) -> dict[str, torch.Tensor]:
                dense = token_nll(lm(input_ids=ids).logits, targets)
                sets, kl, nll = search_keep_sets(lm, ids, targets, n_l, n_h, k, skip, cfg.rounds, max_rows=cfg.batch_size,
                                                 per_round=cfg.per_round, candidates=cfg.candidates, swaps=cfg.swaps,
                                                 generator=torch.Generator().manual_seed(cfg.seed * 1_000_003 + j))
                return {"dense": dense, "sets": sets, "kl": kl, "nll": nll}

            found = kept(store, f"batch-{j:05d}", search, device)
            dense = found["dense"].flatten().cpu().numpy()
            sets, kl, nll = found["sets"], found["kl"], found["nll"]
            candidates = sets.shape[0]
            flat_sets = sets.flatten(1, 2)  # (C, P, L·H)
            flat_nll, flat_kl = nll.flatten(1).cpu().numpy(), kl.flatten(1).cpu()
            greedy_kl += flat_kl[0].tolist()
            best_kl += flat_kl.min(0).values.tolist()
            greedy_best += (flat_kl[0] <= flat_kl.min(0).values).tolist()
            for p, (chosen, kls) in enumerate(eps_good(sets.cpu(), kl.cpu(), cfg.eps)):
                counts[split].append(len(chosen))
                gates = as_gates(flat_sets[chosen, p])
                packed = pack_bits(stored_edges(head_graph(gates, n_l, n_h), gates, mask))
                for rank, c in enumerate(chosen.tolist()):
                    out["rows"].append(int(idx[p // t_len]) * t_len + p % t_len)
                    out["split"].append(split)
                    out["bits"].append(packed[rank])
                    out["nll"].append(flat_nll[c, p])
                    out["dense_nll"].append(dense[p])
                    out["kl"].append(float(kls[rank]))
                    out["rank"].append(rank)
    seconds = time.perf_counter() - tic
    pairs = len(out["rows"])
    arrays = {
        "rows": np.asarray(out["rows"], dtype=np.int64), "split": np.asarray(out["split"], dtype=np.uint8),
        "bits": np.asarray(out["bits"], dtype=np.uint8).reshape(pairs, -1),
        "nll": np.asarray(out["nll"], dtype=np.float32), "dense_nll": np.asarray(out["dense_nll"], dtype=np.float32),
        "kl": np.asarray(out["kl"], dtype=np.float32), "rank": np.asarray(out["rank"], dtype=np.int32),
        "head_fraction": np.full(pairs, k / (n_l * n_h), dtype=np.float32),
    }
    arrays["edge_fraction"] = (unpack_bits(arrays["bits"], n_e).sum(-1) / n_e).astype(np.float32)
    train, val = np.asarray(counts[0]), np.asarray(counts[1])
    every = np.concatenate([train, val])
    figures = {
        "positions": len(every), "pairs": pairs, "heads_kept": k, "search_space": math.comb(n_l * n_h, k),
        "candidates_per_position": candidates,
        "eps_good_per_position": float(train.mean()), "eps_good_multi_share": float((train >= 2).mean()),
        "val_eps_good_per_position": float(val.mean()), "val_eps_good_multi_share": float((val >= 2).mean()),
        "eps_good_max": int(every.max()),
        "greedy_kl": float(np.mean(greedy_kl)), "best_kl": float(np.mean(best_kl)),
        "greedy_best_share": float(np.mean(greedy_best)),
        "positions_per_s": len(every) / max(seconds, 1e-9),
    }
    return arrays, figures


def build_pairs(cfg: PairsConfig, base_dir, contexts_dir, init_file, predictor_file, out_dir,
                checkpoint_root=None) -> dict:
    """Sample, score and keep pairs (or, for ``eps_good``, search the keep sets); write
    ``out_dir/pairs.safetensors``; return the metrics. ``checkpoint_root``: ``eps_good``'s per-batch
    searches are kept there (under a digest of the config and inputs) until the output is written."""
    from safetensors.numpy import save_file
    from transformers import AutoModelForCausalLM

    from lookahead.core.atomic import atomic_dir

    device = torch.device(resolve_device(cfg.device, "pairs.device"))
    cache = ContextCache(contexts_dir)
    n_train = len(cache.windows("train"))
    if cfg.sequences > n_train:
        raise PairsError(f"pairs.sequences is {cfg.sequences} but the context cache holds {n_train} train windows "
                         "(contexts.train_sequences)")
    n_val = len(cache.windows("val"))
    if cfg.target == "eps_good" and cfg.val_sequences > n_val:
        raise PairsError(f"pairs.val_sequences is {cfg.val_sequences} but the context cache holds {n_val} val windows "
                         "(contexts.val_sequences)")
    lm = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval().requires_grad_(False).to(device)
    predictor, meta = load_predictor(predictor_file)
    predictor.to(device)
    check_context_dim(predictor, meta, cache.dim, lm, PairsError, predictor_file)
    skip = recorded_skip(meta)
    tensors, _ = load_init(init_file)
    geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float()).to(device)
    mask = allowed_mask(predictor.n_layers, predictor.n_heads).to(device)
    n_e = n_edges(predictor.n_layers, predictor.n_heads)
    t_len = cache.context_length
    info = {"n_layers": predictor.n_layers, "n_heads": predictor.n_heads, "n_edges": n_e, "context_length": t_len,
            "split": "train", "row": "window index * context_length + position", "encoder": cache.meta["encoder"],
            "gate": predictor.cfg.gate, "skip": skip, "config": to_dict(cfg), "target": cfg.target}
    unit = recorded_unit(meta)
    if unit_shape(lm, unit) != (predictor.n_layers, predictor.n_heads):
        raise PairsError(f"{predictor_file} routes {predictor.n_layers} x {predictor.n_heads} nodes, the base LM has "
                         f"{unit_shape(lm, unit)} {unit}s (runtime.unit): rerun `dvc repro phase1`")
    if unit != "head":  # a node is a key/value group (omitted at the default: the same bytes as before)
        info["unit"] = unit
    if cfg.target == "eps_good":
        windows = np.concatenate([cache.windows("train")[: cfg.sequences], cache.windows("val")[: cfg.val_sequences]])
        store = checkpoint_dir(checkpoint_root, "pairs", {"config": to_dict(cfg), "skip": skip, "unit": unit},
                               [Path(base_dir) / "model.safetensors", predictor_file],
                               [hashlib.sha256(np.ascontiguousarray(windows).tobytes()).hexdigest()])
        arrays, figures = ground_truth(cfg, lm, predictor, cache, mask, device, skip, store)
        info.update(split="split (0 train, 1 val)", heads_kept=figures["heads_kept"])
        with atomic_dir(out_dir) as tmp:
            save_file(arrays, str(tmp / PAIRS_FILE), metadata={"lookahead": json.dumps(info, sort_keys=True)})
        if store is not None:
            shutil.rmtree(store, ignore_errors=True)
        return {**figures, "bits_per_pair": n_e, "bytes_per_pair": int(arrays["bits"].shape[1]),
                "window_sets": {"train": set_label("cache-train", cache.windows("train")[: cfg.sequences]),
                                "val": set_label("cache-val", cache.windows("val")[: cfg.val_sequences])}}
    arrays, distinct, kept_counts, null_counts, seconds = draw_pairs(cfg, lm, predictor, cache, geo, mask, device, skip)
    positions = cfg.sequences * t_len
    pairs = len(arrays["rows"])
    spearman, approx_n = approximation(cfg, lm, predictor, cache, geo, mask, arrays, n_e, device, skip)
    with atomic_dir(out_dir) as tmp:
        save_file(arrays, str(tmp / PAIRS_FILE), metadata={"lookahead": json.dumps(info, sort_keys=True)})
    gains = arrays["dense_nll"] - arrays["nll"]
    counts = np.asarray(kept_counts)
    return {
        "positions": positions,
        "window_sets": {"train": set_label("cache-train", cache.windows("train")[: cfg.sequences])},
        "pairs": pairs,
        "pairs_per_position": pairs / positions,
        "mean_gain": float(gains.mean()) if pairs else 0.0,
        "multi_topology_share": float((counts >= 2).mean()),
        "positions_with_pair_share": float((counts >= 1).mean()),
        "multi_topology_share_null": float((np.asarray(null_counts) >= 2).mean()),
        "positions_with_pair_share_null": float((np.asarray(null_counts) >= 1).mean()),
        "distinct_sampled_per_position": float(np.mean(distinct)),
        "kept_active_head_fraction": float(arrays["head_fraction"].mean()) if pairs else None,
        "approximation_spearman": spearman,
        "approximation_positions": approx_n,
        "bits_per_pair": n_e,
        "bytes_per_pair": int(arrays["bits"].shape[1]) if pairs else math.ceil(n_e / 8),
        "pairs_per_s": pairs / max(seconds, 1e-9),
        "samples_per_s": positions * cfg.samples / max(seconds, 1e-9),
    }


@torch.no_grad()
def approximation(cfg: PairsConfig, lm, predictor, cache: ContextCache, geo: GeoLookup, mask: torch.Tensor,
                  arrays: dict, n_e: int, device, skip: str = "full") -> tuple[float | None, int]:
    """Spearman correlation between each re-scored pair's gain (its topology at t, the predictor's
    deterministic topology elsewhere) and its gain in the one-forward sample. (rho, pairs used)"""
    from scipy import stats

    n = min(cfg.approx_positions, len(arrays["rows"]))
    if n < 3:
        return None, n
    pick = np.sort(np.random.default_rng([cfg.seed, 60]).choice(len(arrays["rows"]), n, replace=False))
    t_len = cache.context_length
    isolated = []
    predictor.eval()
    for start in range(0, n, cfg.batch_size):
        sel = pick[start : start + cfg.batch_size]
        rows = arrays["rows"][sel]
        windows, contexts = (x.to(device) for x in cache.batch("train", rows // t_len))
        ids, targets = windows[:, :-1], windows[:, 1:]
        router = router_context(predictor.cfg.input, lm, ids, contexts)
        adjacency, gates = predictor(router, geo(ids), hard=True)  # deterministic everywhere
        pos = torch.as_tensor(rows % t_len, device=device)
        b = torch.arange(len(sel), device=device)
        edges = torch.from_numpy(unpack_bits(arrays["bits"][sel], n_e)).to(device=device, dtype=adjacency.dtype)
        a_t, g_t = executed_topology(edges, mask, predictor.n_layers, predictor.n_heads, predictor.cfg.gate)
        adjacency, gates = adjacency.clone(), gates.clone()
        adjacency[b, pos], gates[b, pos] = a_t, g_t
        nll = token_nll(execute(lm, ids, adjacency, gates, skip), targets)[b, pos]
        isolated.append(nll.cpu().numpy())
    dense = arrays["dense_nll"][pick]
    gain_isolated = dense - np.concatenate(isolated)
    gain_joint = dense - arrays["nll"][pick]
    rho = stats.spearmanr(gain_joint, gain_isolated)[0]
    return (None if not np.isfinite(rho) else float(rho)), n


def build_pairs_seeds(cfg: PairsConfig, base_dir, contexts_dir, init_file, predictor_file, out_dir,
                      checkpoint_root=None) -> dict:
    """:func:`build_pairs`, then ``cfg.seeds - 1`` more samplings on other seeds (their pairs
    discarded): the metrics carry the :data:`SEEDED` figures' mean and sd (lookahead.core.seeds).
    ``eps_good`` has no randomness: one run."""
    if cfg.target == "eps_good":
        return build_pairs(cfg, base_dir, contexts_dir, init_file, predictor_file, out_dir, checkpoint_root)
    return over_seeds(cfg, "pairs", SEEDED, lambda c, scratch: build_pairs(
        c, base_dir, contexts_dir, init_file, predictor_file, scratch / "pairs" if scratch else out_dir))
