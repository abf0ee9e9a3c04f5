"""What free connectivity (``phase2.connectivity``) costs against the stock forward, side by side in
one process on the trained base LM and the phase-1 router, at phase 2's batch of train-stream windows:

- parameters it adds (static, dynamic, both) beside the LM's;
- one phase-2 training step (forward, backward, AdamW) with every head on: the stock LM (the dense
  control's step) against each kind, which runs through the general head-graph runtime (the
  execution plan covers standard-stream graphs only), and the default router at 50 % heads off
  with and without ``both``;
- hard execution (inference) of one batch: stock against each kind, and against the router's all-on
  graph through the execution plan (``router_inputs``: the dense pass that computes the router's
  input, which the dynamic weights read too, included in every kind's time);
- FLOPs per token: the stock forward (2 per weight of the blocks and the unembedding, plus
  attention's 4·D·(t + 1) per head), the mixing that builds each head's input stream (2·d per
  allowed edge), and the dynamic weights' MLP and U Vᵀ.

    python benchmarks/connectivity.py [--base models/base] [--tokens data/tokens] \
        [--predictor models/phase1/predictor.safetensors] [--batch-size 16] [--repeats 3]

Prints one JSON line: seconds (mean and sd over ``repeats`` after one warm-up) and each over stock.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import torch


def main(argv: list[str] | None = None) -> int:
    from lookahead.graph.connectivity import Connectivity
    from lookahead.graph.nodes import n_edges, n_nodes
    from lookahead.graph.plan import execute
    from lookahead.graph.predictor import load_init, load_predictor
    from lookahead.graph.runtime import recorded_skip
    from lookahead.graph.scoring import GeoLookup
    from lookahead.pipeline.phase2.model import Phase2Model
    from lookahead.pipeline.phase2.common import base_lm, routed_loss
    from lookahead.train import data

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="models/base")
    parser.add_argument("--tokens", default="data/tokens")
    parser.add_argument("--predictor", default="models/phase1/predictor.safetensors")
    parser.add_argument("--init", default="models/init/init.safetensors")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--context-length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args(argv)

    torch.set_num_threads(2)
    stream = data.load_stream(args.tokens, "train")
    router, meta = load_predictor(args.predictor)
    router.requires_grad_(False)
    skip = recorded_skip(meta)
    every = dataclasses.replace(router.cfg, keep=1.0)
    tensors, _ = load_init(args.init)
    geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float()) if router.geo_dim else None
    n_layers, n_heads = meta["n_layers"], meta["n_heads"]

    def batch(step: int) -> torch.Tensor:
        return data.train_batch(stream, step, args.batch_size, args.context_length, seed=0, salt=71)

    def make(kind: str | None, keep_all: bool):
        lm = base_lm(args.base)
        predictor = load_predictor(args.predictor)[0].requires_grad_(False)
        if keep_all:
            predictor.cfg = every
        conn = (Connectivity(kind, n_layers, n_heads, meta["context_dim"], args.rank, args.hidden, predictor.cfg.input)
                if kind else None)
        return Phase2Model(lm, predictor, skip, connectivity=conn)

    def step_times(kind: str | None, keep_all: bool) -> list[float]:
        model = make(kind, keep_all)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
        out = []
        for step in range(args.repeats + 1):
            ids, targets = batch(step)[:, :-1], batch(step)[:, 1:]
            tic = time.perf_counter()
            logits, _ = model(ids, geo=geo(ids) if geo is not None else None, hard=True)
            routed_loss(logits, targets, None, None, 0.0, {}).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step:
                out.append(time.perf_counter() - tic)
        return out

    @torch.no_grad()
    def hard_times(kind: str | None, router: bool = False) -> list[float]:
        """Stock (kind None), or the router's all-on graph through the plan (``router``: what the
        dynamic weights' inputs cost, a dense pass for the LM's states), or a kind's weighted graph."""
        model = make(kind, keep_all=True).eval()
        if kind:  # trained-looking weights: every parameter moved
            gen = torch.Generator().manual_seed(0)
            for p in model.connectivity.parameters():
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
        out = []
        for step in range(args.repeats + 1):
            ids = batch(step)[:, :-1]
            g = geo(ids) if geo is not None else None
            tic = time.perf_counter()
            if router:
                execute(model.lm, ids, *model.route(ids, None, g, hard=True), skip)
            else:
                model.hard(ids, None, g, None)
            if step:
                out.append(time.perf_counter() - tic)
        return out

    kinds = ("static", "dynamic", "both")
    train = {"stock": step_times(None, True), **{k: step_times(k, True) for k in kinds},
             "routed_50": step_times(None, False), "routed_50_both": step_times("both", False)}
    hard = {"stock": hard_times(None), "router_inputs": hard_times(None, router=True), **{k: hard_times(k) for k in kinds}}

    out = {}
    for label, runs in (("train", train), ("hard", hard)):
        base = statistics.mean(runs["stock"])
        for name, seconds in runs.items():
            out[f"{label}_{name}_s"] = round(statistics.mean(seconds), 4)
            out[f"{label}_{name}_s_sd"] = round(statistics.stdev(seconds), 4) if len(seconds) > 1 else 0.0
            out[f"{label}_{name}_over_stock"] = round(statistics.mean(seconds) / base, 3)

    lm = base_lm(args.base)
    cfg = lm.config
    d, t, n = cfg.hidden_size, args.context_length, n_nodes(n_layers, n_heads)
    d_head = d // n_heads
    block_weights = sum(p.numel() for name, p in lm.named_parameters() if "layers." in name and p.dim() == 2)
    stock = 2 * (block_weights + lm.lm_head.weight.numel()) + n_layers * n_heads * 4 * d_head * (t + 1) / 2  # mean over t
    mixing = 2 * d * n_edges(n_layers, n_heads)
    dynamic = 2 * (meta["context_dim"] * args.hidden + args.hidden * 2 * n * args.rank) + 2 * n * n * args.rank
    for kind in kinds:
        conn = Connectivity(kind, n_layers, n_heads, meta["context_dim"], args.rank, args.hidden)
        out[f"{kind}_parameters"] = conn.n_parameters()
        extra = mixing + (dynamic if conn.dynamic else 0)
        out[f"{kind}_flops_per_token_over_stock"] = round((stock + extra) / stock, 4)
    out.update({"lm_parameters": sum(p.numel() for p in lm.parameters()), "stock_flops_per_token": int(stock),
                "mixing_flops_per_token": mixing, "dynamic_flops_per_token": dynamic,
                "batch_size": args.batch_size, "context_length": t, "repeats": args.repeats, "skip": skip,
                "rank": args.rank, "hidden": args.hidden, "threads": torch.get_num_threads()})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
