"""The probe's head ablations, side by side on the same windows of a base LM: every layer run again
for each ablated head (the plain forward under :class:`lookahead.semantics.heads.HeadMasks`, its
per-head norms recorded) against :func:`lookahead.semantics.heads.probe_heads`' way (the layers under
the head replay a dense pass's outputs, no norms recorded). Both give the same floats (tests/test_probe.py).

    python benchmarks/probe_ablation.py [--base models/base] [--batch 8] [--length 128] [--heads 12]

Ablates ``--heads`` heads spread evenly over the layers (the mean over all L·H is the mean over
layers), one batch of random token windows each. Prints one JSON line: seconds an ablation each way,
their ratio, and the identity of the two NLLs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoModelForCausalLM

    from lookahead.lm.nll import causal_lm_nll
    from lookahead.semantics.heads import HeadMasks, attention_layers, layer_outputs, replayed

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="models/base")
    parser.add_argument("--batch", type=int, default=8, help="windows a forward (the probe's head_batch_size)")
    parser.add_argument("--length", type=int, default=128, help="tokens a window (the probe's head_window)")
    parser.add_argument("--heads", type=int, default=12, help="heads ablated, spread evenly over the layers")
    args = parser.parse_args(argv)

    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32).eval()
    n_layers, n_heads = len(attention_layers(model)), model.config.num_attention_heads
    windows = torch.randint(0, model.config.vocab_size, (args.batch, args.length + 1), generator=torch.Generator().manual_seed(0))
    picks = [(i * n_layers // args.heads, i % n_heads) for i in range(args.heads)]
    with torch.no_grad():
        causal_lm_nll(model, windows)  # warm-up
        full, fast, same = 0.0, 0.0, True
        tic = time.perf_counter()
        outputs = layer_outputs(model, windows, n_heads)
        record = time.perf_counter() - tic
        for layer, head in picks:
            mask = torch.ones(n_layers, n_heads)
            mask[layer, head] = 0.0
            tic = time.perf_counter()
            with HeadMasks(model, n_heads, mask):
                a = causal_lm_nll(model, windows).item()
            full += time.perf_counter() - tic
            tic = time.perf_counter()
            with HeadMasks(model, n_heads, mask, record=False), replayed(model, outputs, layer):
                b = causal_lm_nll(model, windows).item()
            fast += time.perf_counter() - tic
            same = same and a == b
    print(json.dumps({"base": args.base, "layers": n_layers, "heads": n_heads, "batch": args.batch, "length": args.length,
                      "ablations": len(picks), "full_s_per_ablation": round(full / len(picks), 4),
                      "replayed_s_per_ablation": round(fast / len(picks), 4), "record_s": round(record, 4),
                      "replayed_over_full": round(fast / full, 3), "same_nll": same}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
