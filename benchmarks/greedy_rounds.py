"""Cheaper greedy oracles against the exact one, side by side on the same val windows of the trained
base LM: what each loses, and what it saves. A variant ``r<R>`` drops R heads a step (``per_round``,
:func:`lookahead.graph.oracle.greedy_targets`); ``c<C>`` is the lazy greedy that tries each
position's C heads of lowest latest cost a step (``candidates``); ``r<R>c<C>`` both.

    python benchmarks/greedy_rounds.py [--base models/base] [--tokens data/tokens] [--heads data/probe/heads.safetensors]
        [--set selection] [--windows 256] [--length 32] [--keep 0.5] [--variants r2,r4,r8,c2,c4,r2c4]

For each variant: the mean NLL of its keep sets minus the exact oracle's, with the paired 95 % interval
over windows (docs/reproducibility.md); its recall of the exact oracle's heads (the share of the
exact keep set it keeps, over positions); the share of the exact oracle's gain over static pruning
it keeps (``capture``: (static − r) / (static − exact), with its interval); its trial forwards and
seconds against the exact one's. Nulls beside them: static importance pruning at the same head count
(probe importance, from the train stream) and one step (r = L·H − K: the K heads of largest
leave-one-out KL). Windows: the selection set by default, the windows defaults are chosen on
(``--set test`` for the committed claims' windows); ``--length T``: their first T positions, where the
exact oracle is affordable on a large LM (SmolLM2 at T = 32: ~27 000 trial forwards a window, ~70 min
on 2 cores). Prints one JSON line.
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

    from lookahead.artifacts.contexts import ContextCache, read_context_length
    from lookahead.artifacts.probe_heads import head_importance
    from lookahead.artifacts.val_scores import batches, load_scoring, scoring_windows
    from lookahead.core.intervals import paired_interval, ratio_interval
    from lookahead.graph.nodes import keep_count
    from lookahead.graph.oracle import gates_nll, greedy_gates, greedy_trials
    from lookahead.graph.scoring import static_token_nll

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="models/base")
    parser.add_argument("--tokens", default="data/tokens")
    parser.add_argument("--contexts", default="data/contexts", help="the context cache (the test set is chosen apart from it)")
    parser.add_argument("--heads", default="data/probe/heads.safetensors")
    parser.add_argument("--params", default="params.yaml", help="its scoring section picks the windows")
    parser.add_argument("--set", default="selection", choices=("selection", "test"))
    parser.add_argument("--windows", type=int, default=0, help="the first N windows of the set (0: all)")
    parser.add_argument("--length", type=int, default=0, help="score each window's first T positions (0: all)")
    parser.add_argument("--keep", type=float, default=0.5, help="share of heads kept per position")
    parser.add_argument("--skip", default="query", choices=("full", "query"))
    parser.add_argument("--variants", default="r2,r4,r8,c2,c4,r2c4",
                        help="comma-separated: r<R> drops R heads a step, c<C> tries C candidates a step, r<R>c<C> both")
    args = parser.parse_args(argv)

    torch.set_num_threads(2)
    lm = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32).eval()
    n_layers, n_heads = lm.config.num_hidden_layers, lm.config.num_attention_heads
    total = n_layers * n_heads
    k = keep_count(total, n_layers, args.keep, per_layer=False)
    scoring = dataclasses.replace(load_scoring(args.params), set=args.set)
    windows = scoring_windows(args.tokens, scoring, read_context_length(args.params), cache=ContextCache(args.contexts))
    if args.windows:
        windows = windows[: args.windows]
    if args.length:
        windows = windows[:, : args.length + 1]
    window = windows.shape[1] - 1
    parts = batches(windows, scoring.batch_size, "cpu")
    variants = [parse_variant(v) for v in args.variants.split(",")]
    importance = head_importance(args.heads)

    def run(per_round: int, candidates: int = 0) -> tuple[np.ndarray, torch.Tensor, float]:
        """Per-position NLL under the oracle's keep sets, the keep sets (P, L·H) bool, seconds."""
        tic = time.perf_counter()
        gates = [greedy_gates(lm, w[:, :-1], n_layers, n_heads, k, args.skip, per_round=per_round, candidates=candidates)
                 for w in parts]
        seconds = time.perf_counter() - tic
        with torch.no_grad():
            nll = torch.cat([gates_nll(lm, w, g, n_layers, n_heads, args.skip).flatten() for w, g in zip(parts, gates)])
        return nll.double().numpy(), torch.cat([g[..., 1:].reshape(-1, total) > 0 for g in gates]), seconds

    exact_nll, exact_on, exact_s = run(1)
    with torch.no_grad():
        static = torch.cat([static_token_nll(lm, w, importance, k, args.skip).flatten() for w in parts]).double().numpy()
    out = {"windows": len(windows), "length": window, "positions": len(exact_nll), "set": args.set, "heads": total,
           "heads_kept": k,
           "skip": args.skip, "exact_nll": round(float(exact_nll.mean()), 5), "static_nll": round(float(static.mean()), 5),
           "exact_s": round(exact_s, 1), "exact_trials_per_window": (total - k) * total}
    for per_round, candidates in sorted(set(variants) | {(total - k, 0)}, key=lambda v: (v[1], v[0])):
        nll, on, seconds = run(per_round, candidates)
        gap = paired_interval(nll - exact_nll, window)
        capture = ratio_interval(static - nll, static - exact_nll, window)
        recall = float((on & exact_on).sum(-1).double().mean() / k)
        steps = math.ceil((total - k) / per_round)
        out[variant_name(per_round, candidates)] = {
            "steps": steps, "trials_per_window": greedy_trials(total, k, per_round, candidates),
            "seconds": round(seconds, 1), "speedup": round(exact_s / seconds, 2),
            "nll_minus_exact": round(gap["mean"], 5), "nll_minus_exact_ci": [round(gap["ci_low"], 5), round(gap["ci_high"], 5)],
            "capture": round(capture["mean"], 4), "capture_ci": [round(capture["ci_low"], 4), round(capture["ci_high"], 4)],
            "recall_of_exact": round(recall, 4),
            "same_set_fraction": round(float((on == exact_on).all(-1).double().mean()), 4),
        }
    print(json.dumps(out))
    return 0


def parse_variant(text: str) -> tuple[int, int]:
    """``r2`` → (2, 0), ``c4`` → (1, 4), ``r2c4`` → (2, 4): (per_round, candidates)."""
    import re

    match = re.fullmatch(r"(?:r(\d+))?(?:c(\d+))?", text.strip())
    if not match or not any(match.groups()):
        raise SystemExit(f"error: --variants: {text!r} is not r<R>, c<C> or r<R>c<C>")
    return int(match[1] or 1), int(match[2] or 0)


def variant_name(per_round: int, candidates: int) -> str:
    return (f"r{per_round}" if per_round > 1 or not candidates else "") + (f"c{candidates}" if candidates else "")


if __name__ == "__main__":
    sys.exit(main())
