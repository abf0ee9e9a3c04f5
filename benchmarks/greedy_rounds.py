"""A greedy oracle that drops several heads a step (``per_round`` r,
:func:`lookahead.graph.oracle.greedy_targets`) against the exact one (r = 1), side by side on the
same val windows of the trained base LM: what the cheaper oracle loses, and what it saves.

    python benchmarks/greedy_rounds.py [--base models/base] [--tokens data/tokens] [--heads data/probe/heads.safetensors]
        [--set selection] [--windows 256] [--keep 0.5] [--rounds 2,4,8]

For each r: the mean NLL of its keep sets minus the exact oracle's, with the paired 95 % interval
over windows (docs/reproducibility.md); its recall of the exact oracle's heads (the share of the
exact keep set it keeps, over positions); the share of the exact oracle's gain over static pruning
it keeps (``capture``: (static − r) / (static − exact), with its interval); its trial forwards and
seconds against the exact one's. Nulls beside them: static importance pruning at the same head count
(probe importance, from the train stream) and one step (r = L·H − K: the K heads of largest
leave-one-out KL). Windows: the selection set by default, the windows defaults are chosen on
(``--set test`` for the committed claims' windows). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time

import numpy as np
import torch


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoModelForCausalLM

    from lookahead.artifacts.contexts import read_context_length
    from lookahead.artifacts.probe_heads import head_importance
    from lookahead.artifacts.val_scores import ScoringConfig, batches, scoring_windows
    from lookahead.core.config import load_section
    from lookahead.core.intervals import paired_interval, ratio_interval
    from lookahead.graph.nodes import keep_count
    from lookahead.graph.oracle import gates_nll, greedy_gates
    from lookahead.graph.scoring import static_token_nll

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="models/base")
    parser.add_argument("--tokens", default="data/tokens")
    parser.add_argument("--heads", default="data/probe/heads.safetensors")
    parser.add_argument("--params", default="params.yaml", help="its scoring section picks the windows")
    parser.add_argument("--set", default="selection", choices=("selection", "test"))
    parser.add_argument("--windows", type=int, default=0, help="the first N windows of the set (0: all)")
    parser.add_argument("--keep", type=float, default=0.5, help="share of heads kept per position")
    parser.add_argument("--skip", default="query", choices=("full", "query"))
    parser.add_argument("--rounds", default="2,4,8", help="heads dropped per step, comma-separated")
    args = parser.parse_args(argv)

    torch.set_num_threads(2)
    lm = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32).eval()
    n_layers, n_heads = lm.config.num_hidden_layers, lm.config.num_attention_heads
    total = n_layers * n_heads
    k = keep_count(total, n_layers, args.keep, per_layer=False)
    scoring = dataclasses.replace(load_section(args.params, "scoring", ScoringConfig), set=args.set)
    windows = scoring_windows(args.tokens, scoring, read_context_length(args.params))
    if args.windows:
        windows = windows[: args.windows]
    window = windows.shape[1] - 1
    parts = batches(windows, scoring.batch_size, "cpu")
    rounds = [int(r) for r in args.rounds.split(",")]
    importance = head_importance(args.heads)

    def run(per_round: int) -> tuple[np.ndarray, torch.Tensor, float]:
        """Per-position NLL under the oracle's keep sets, the keep sets (P, L·H) bool, seconds."""
        tic = time.perf_counter()
        gates = [greedy_gates(lm, w[:, :-1], n_layers, n_heads, k, args.skip, per_round=per_round) for w in parts]
        seconds = time.perf_counter() - tic
        with torch.no_grad():
            nll = torch.cat([gates_nll(lm, w, g, n_layers, n_heads, args.skip).flatten() for w, g in zip(parts, gates)])
        return nll.double().numpy(), torch.cat([g[..., 1:].reshape(-1, total) > 0 for g in gates]), seconds

    exact_nll, exact_on, exact_s = run(1)
    with torch.no_grad():
        static = torch.cat([static_token_nll(lm, w, importance, k, args.skip).flatten() for w in parts]).double().numpy()
    out = {"windows": len(windows), "positions": len(exact_nll), "set": args.set, "heads": total, "heads_kept": k,
           "skip": args.skip, "exact_nll": round(float(exact_nll.mean()), 5), "static_nll": round(float(static.mean()), 5),
           "exact_s": round(exact_s, 1), "exact_trials_per_window": (total - k) * total}
    for per_round in sorted(set(rounds) | {total - k}):
        nll, on, seconds = run(per_round)
        gap = paired_interval(nll - exact_nll, window)
        capture = ratio_interval(static - nll, static - exact_nll, window)
        recall = float((on & exact_on).sum(-1).double().mean() / k)
        name = f"r{per_round}"
        out[name] = {
            "steps": math.ceil((total - k) / per_round), "trials_per_window": math.ceil((total - k) / per_round) * total,
            "seconds": round(seconds, 1), "speedup": round(exact_s / seconds, 2),
            "nll_minus_exact": round(gap["mean"], 5), "nll_minus_exact_ci": [round(gap["ci_low"], 5), round(gap["ci_high"], 5)],
            "capture": round(capture["mean"], 4), "capture_ci": [round(capture["ci_low"], 4), round(capture["ci_high"], 4)],
            "recall_of_exact": round(recall, 4),
            "same_set_fraction": round(float((on == exact_on).all(-1).double().mean()), 4),
        }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
