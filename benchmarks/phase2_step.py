"""What one phase-2 training step costs, side by side in one process on the trained base LM and the
phase-1 router, at phase 2's batch (windows of the train stream): the dense control's step, the
static control's step (NLL; and distilling from the frozen dense base over the whole vocabulary or
its top-k words + a tail bucket), phase 2's routed step, and one router refresh of each oracle (the
greedy one and the leave-one-out top-K, of the LM on ``refresh_windows`` windows with the shared heads
fixed, and the router's update).

    python benchmarks/phase2_step.py [--base models/base] [--tokens data/tokens] \
        [--predictor models/phase1/predictor.safetensors] [--heads data/probe/heads.safetensors] \
        [--batch-size 16] [--repeats 3] [--top-k 64] [--refresh-windows 4]

Prints one JSON line: seconds per step of each (mean and sd over ``repeats`` steps after one
warm-up), each one's cost over the static control's NLL step, and each refresh's seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch


def main(argv: list[str] | None = None) -> int:
    from lookahead.artifacts.probe_heads import head_importance
    from lookahead.graph.nodes import static_gates
    from lookahead.graph.predictor import load_init, load_predictor
    from lookahead.graph.scoring import GeoLookup
    from lookahead.graph.runtime import recorded_skip
    from lookahead.pipeline.phase2.model import Phase2Model
    from lookahead.pipeline.phase2.common import base_lm, routed_loss
    from lookahead.pipeline.phase2.control import StaticMask, StaticPruned
    from lookahead.pipeline.phase2.refresh import Refresher
    from lookahead.train import data

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="models/base")
    parser.add_argument("--tokens", default="data/tokens")
    parser.add_argument("--predictor", default="models/phase1/predictor.safetensors")
    parser.add_argument("--heads", default="data/probe/heads.safetensors")
    parser.add_argument("--init", default="models/init/init.safetensors")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--context-length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top-k", type=int, default=64)
    parser.add_argument("--shared-heads", type=int, default=0)
    parser.add_argument("--refresh-windows", type=int, default=4)
    args = parser.parse_args(argv)

    torch.set_num_threads(2)
    stream = data.load_stream(args.tokens, "train")
    teacher = base_lm(args.base).eval().requires_grad_(False)
    predictor, meta = load_predictor(args.predictor)
    skip = recorded_skip(meta)
    importance = head_importance(args.heads)
    predictor.set_always_on(static_gates(importance, args.shared_heads)[1:].nonzero().flatten().tolist())
    predictor.requires_grad_(False)
    mask = StaticMask(importance, predictor.cfg.keep, skip)
    tensors, _ = load_init(args.init)
    geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float()) if predictor.geo_dim else None

    def batch(step: int) -> torch.Tensor:
        return data.train_batch(stream, step, args.batch_size, args.context_length, seed=0, salt=52)

    def timed(make_loss) -> list[float]:
        lm = base_lm(args.base)
        opt = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=1e-5)
        out = []
        for step in range(args.repeats + 1):
            windows = batch(step)
            tic = time.perf_counter()
            loss = make_loss(lm, windows)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step:  # the first is a warm-up
                out.append(time.perf_counter() - tic)
        return out

    def static(distill: float, top_k: int):
        def loss(lm, windows):
            model = StaticPruned(lm, mask)
            return routed_loss(model(windows[:, :-1]), windows[:, 1:], teacher, windows[:, :-1], distill, {}, top_k)
        return loss

    def dense(lm, windows):
        return routed_loss(lm(input_ids=windows[:, :-1]).logits, windows[:, 1:], None, None, 0.0, {})

    def routed(lm, windows):
        model = Phase2Model(lm, predictor, skip)
        ids = windows[:, :-1]
        logits, _ = model(ids, geo=geo(ids) if geo is not None else None, hard=True)
        return routed_loss(logits, windows[:, 1:], None, None, 0.0, {})

    runs = {"dense_control": timed(dense), "static_nll": timed(static(0.0, 0)),
            "static_distill_full": timed(static(0.5, 0)), f"static_distill_top{args.top_k}": timed(static(0.5, args.top_k)),
            "phase2_routed": timed(routed)}
    lm = base_lm(args.base)
    refresh = {}
    for oracle in ("greedy", "loo"):
        refresher = Refresher(predictor, lr=3e-3, steps=1, windows=args.refresh_windows, oracle=oracle)
        refresh[oracle] = [refresher.step(lm, predictor, skip, batch(step)[:, :-1], geo)["seconds"]
                           for step in range(args.repeats)]
    base = statistics.mean(runs["static_nll"])
    out = {}
    for name, seconds in runs.items():
        out[f"{name}_s"] = round(statistics.mean(seconds), 4)
        out[f"{name}_s_sd"] = round(statistics.stdev(seconds), 4) if len(seconds) > 1 else 0.0
        out[f"{name}_over_static_nll"] = round(statistics.mean(seconds) / base, 3)
    for oracle, seconds in refresh.items():
        out[f"refresh_{oracle}_s"] = round(statistics.mean(seconds), 3)
        out[f"refresh_{oracle}_s_sd"] = round(statistics.stdev(seconds), 3) if len(seconds) > 1 else 0.0
    out.update({"refresh_windows": args.refresh_windows, "batch_size": args.batch_size,
                "context_length": args.context_length, "repeats": args.repeats, "skip": skip,
                "shared_heads": args.shared_heads, "threads": torch.get_num_threads()})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
