"""Static pruning's strength against the windows head importance is measured on: importance from N
train-stream batches (or from the val stream, as the probe once did) with the probe's own
``probe_heads``, then static pruning at half the heads scored on the **selection** windows (never the
test windows). Needs a complete run of the default (`dvc repro`); prints one JSON line.

    python scripts/importance_windows.py                 # 2, 8 and 32 batches per seed of 8 windows
    python scripts/importance_windows.py --batches 2 --stream val

Figures: [the measurement-integrity page](../docs/research/measurement-integrity.md).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import yaml
from transformers import AutoModelForCausalLM

from lookahead.artifacts.val_scores import scoring_from_params, scoring_windows
from lookahead.graph.nodes import static_topology
from lookahead.graph.plan import execute
from lookahead.lm.nll import token_nll
from lookahead.semantics.heads import probe_heads
from lookahead.train import data


def static_nll(lm, importance: np.ndarray, windows: torch.Tensor, keep: float, skip: str) -> float:
    """Mean NLL of ``windows`` (n, T+1) with the ``keep`` share of heads most important by ``importance``."""
    adjacency, gates = static_topology(torch.as_tensor(importance), keep, skip)
    total = 0.0
    with torch.no_grad():
        for chunk in windows.split(32):
            total += token_nll(execute(lm, chunk[:, :-1], adjacency, gates, skip), chunk[:, 1:]).sum().item()
    return total / (windows.shape[0] * (windows.shape[1] - 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[2, 8, 32], help="batches of 8 windows per seed")
    parser.add_argument("--stream", default="train", choices=("train", "val"))
    args = parser.parse_args()
    params = yaml.safe_load(open("params.yaml", encoding="utf-8"))
    probe, arch = params["probe"], params["base"]["arch"]
    window = min(probe["head_window"], arch["context_length"])
    lm = AutoModelForCausalLM.from_pretrained("models/base", dtype=torch.float32).eval()
    stream = data.load_stream("data/tokens", args.stream)
    selection = scoring_windows("data/tokens", scoring_from_params(params), arch["context_length"], "selection")
    out = {"stream": args.stream, "keep": params["predictor"]["keep"], "scored_on": "selection"}
    for batches in args.batches:
        importance = np.mean([probe_heads(lm, [data.train_batch(stream, step=b, batch_size=probe["head_batch_size"],
                                                                seq_len=window, seed=seed) for b in range(batches)])
                              ["importance"] for seed in probe["seeds"]], axis=0)
        out[f"static_nll_{len(probe['seeds'])}x{batches}x{probe['head_batch_size']}"] = static_nll(
            lm, importance, selection, params["predictor"]["keep"], params["runtime"]["skip"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
