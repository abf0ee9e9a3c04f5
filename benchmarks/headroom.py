"""What any per-token router could gain on a trained base LM: NLL − dense of static importance
pruning, random per-token heads and the label-free oracles (leave-one-out KL, greedy) at 25 / 50 /
75 % of heads off, under both skip modes, side by side on the same val windows.

    python benchmarks/headroom.py [--base models/base] [--contexts data/contexts] \
        [--heads data/probe/heads.safetensors] [--windows 32] [--greedy]

Prints one JSON line: ``<mode>_<pct>off_<method>`` = NLL − dense (nats), and ``dense_nll``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch


def main(argv: list[str] | None = None) -> int:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from lookahead.artifacts.contexts import ContextCache
    from lookahead.graph.nodes import top_k_gates
    from lookahead.graph.oracle import gates_nll, greedy_gates, leave_one_out_kl
    from lookahead.graph.scoring import interpolate_curve, random_heads_nll, static_pruning_curve
    from lookahead.lm.nll import token_nll

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="models/base")
    parser.add_argument("--contexts", default="data/contexts")
    parser.add_argument("--heads", default="data/probe/heads.safetensors")
    parser.add_argument("--windows", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--greedy", action="store_true", help="also the greedy oracle ((L·H − K)·L·H forwards)")
    args = parser.parse_args(argv)

    torch.set_num_threads(2)
    tic = time.perf_counter()
    lm = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32).eval()
    importance = load_file(args.heads)["importance"].float()
    n_layers, n_heads = importance.shape
    total = n_layers * n_heads
    val = ContextCache(args.contexts).windows("val")[: args.windows]
    batches = [torch.from_numpy(val[i : i + args.batch_size].astype(np.int64))
               for i in range(0, len(val), args.batch_size)]
    out: dict[str, float] = {}
    with torch.no_grad():
        dense = float(torch.cat([token_nll(lm(input_ids=w[:, :-1]).logits, w[:, 1:]).flatten() for w in batches]).mean())
        out["dense_nll"] = dense
        for skip in ("full", "query"):
            curve = static_pruning_curve(lm, batches, importance, skip)
            loo = [leave_one_out_kl(lm, w[:, :-1], n_layers, n_heads, skip) for w in batches]
            for off in (25, 50, 75):
                keep = round(total * (100 - off) / 100)
                key = f"{skip}_{off}off"
                out[f"{key}_static"] = interpolate_curve(curve, keep / total) - dense
                out[f"{key}_random"] = random_heads_nll(lm, batches, keep / total, n_layers, n_heads, 3, 0, skip) - dense
                nll = torch.cat([gates_nll(lm, w, top_k_gates(kl, keep), n_layers, n_heads, skip).flatten()
                                 for w, kl in zip(batches, loo)])
                out[f"{key}_oracle_loo"] = float(nll.mean()) - dense
                if args.greedy:
                    nll = torch.cat([gates_nll(lm, w, greedy_gates(lm, w[:, :-1], n_layers, n_heads, keep, skip),
                                               n_layers, n_heads, skip).flatten() for w in batches])
                    out[f"{key}_oracle_greedy"] = float(nll.mean()) - dense
                print(f"{key}: " + ", ".join(f"{k.split('_', 2)[-1]} {v:+.3f}" for k, v in out.items()
                                             if k.startswith(key)), file=sys.stderr)
    out = {k: round(v, 4) for k, v in out.items()}
    out["windows"] = len(val)
    out["seconds"] = round(time.perf_counter() - tic, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
