"""The greedy label-free oracle's speed: every candidate removal of a step stacked along the batch
(:func:`lookahead.graph.oracle.greedy_gates`) against one forward per candidate removal (as it was
written before), side by side on the same val windows of the trained base LM, and whether the two
keep the same heads.

    python benchmarks/greedy_oracle.py [--base models/base] [--contexts data/contexts] [--windows 8] \
        [--keep 0.5] [--skip query]

Prints one JSON line: positions/s of each, the speed-up, the share of positions whose kept heads
agree, and the windows and positions timed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


@torch.no_grad()
def one_removal_per_forward(lm, ids, n_layers, n_heads, k, skip):
    """The greedy oracle as it was: a forward of the windows per head and step."""
    from lookahead.graph.nodes import head_graph
    from lookahead.graph.runtime import forward_with_topology

    dense_logp = F.log_softmax(lm(input_ids=ids).logits.float(), -1)
    total = n_layers * n_heads
    gates = torch.ones(*ids.shape, 1 + total)
    for _ in range(total - k):
        cost = torch.full((*ids.shape, total), math.inf)
        for h in range(total):
            trial = gates.clone()
            trial[..., 1 + h] = 0
            logits = forward_with_topology(lm, ids, head_graph(trial, n_layers, n_heads), trial, hard=True, skip=skip)
            logq = F.log_softmax(logits.float(), -1)
            kl = (dense_logp.exp() * (dense_logp - logq)).sum(-1)
            cost[..., h] = torch.where(gates[..., 1 + h] > 0, kl, cost[..., h])
        gates.scatter_(-1, 1 + cost.argmin(-1)[..., None], 0.0)
    return gates


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoModelForCausalLM

    from lookahead.artifacts.contexts import ContextCache
    from lookahead.graph.oracle import greedy_gates

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="models/base")
    parser.add_argument("--contexts", default="data/contexts")
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--keep", type=float, default=0.5, help="share of heads kept per position")
    parser.add_argument("--skip", default="query", choices=("full", "query"))
    args = parser.parse_args(argv)

    torch.set_num_threads(2)
    lm = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32).eval()
    n_layers, n_heads = lm.config.num_hidden_layers, lm.config.num_attention_heads
    k = round(args.keep * n_layers * n_heads)
    val = ContextCache(args.contexts).windows("val")[: args.windows]
    batches = [torch.from_numpy(val[i : i + args.batch_size, :-1].astype(np.int64))
               for i in range(0, len(val), args.batch_size)]
    positions = sum(b.numel() for b in batches)
    out, kept = {}, {}
    for name, fn in (("one_removal_per_forward", one_removal_per_forward), ("batched", greedy_gates)):
        tic = time.perf_counter()
        kept[name] = torch.cat([fn(lm, b, n_layers, n_heads, k, args.skip).flatten(0, 1) for b in batches])
        out[f"{name}_positions_per_s"] = round(positions / (time.perf_counter() - tic), 1)
    out["speedup"] = round(out["batched_positions_per_s"] / out["one_removal_per_forward_positions_per_s"], 2)
    same = (kept["batched"] == kept["one_removal_per_forward"]).all(-1)
    out.update({"same_heads_fraction": round(float(same.float().mean()), 4), "windows": len(val),
                "positions": positions, "heads_kept": k, "skip": args.skip})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
