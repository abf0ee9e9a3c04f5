"""Forwards that differ from one already run only from some layer on, side by side on the same windows
of a base LM: every layer run again against starting at that layer from the stream the first forward
recorded — the same floats either way (tests/test_probe.py, tests/test_static_baselines.py).

- the probe's head ablations: the plain forward under :class:`lookahead.semantics.heads.HeadMasks`
  (its per-head norms recorded) against :func:`lookahead.semantics.heads.probe_heads`' way (the
  layers under the head replay a dense pass's outputs, no norms recorded);
- the greedy static search's trials (``static_baselines``): a static mask with one more head off,
  :func:`lookahead.pipeline.static_baselines.mask_nll` whole against resumed at the head's layer from
  the current mask's stream (:func:`lookahead.pipeline.static_baselines.layer_streams`).

    python benchmarks/layer_replay.py [--base models/base] [--batch 8] [--length 128] [--heads 12]

Each over ``--heads`` heads spread evenly over the layers (the mean over all L·H is the mean over
layers), one batch of random token windows. Prints one JSON line: seconds a forward each way, their
ratio, and whether the NLLs are identical.
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
    from lookahead.pipeline.static_baselines import layer_streams, mask_nll
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
    windows = torch.randint(0, model.config.vocab_size, (args.batch, args.length + 1),
                            generator=torch.Generator().manual_seed(0))
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
        # the static search: the current mask (every third head off), each trial one head more
        on = torch.arange(n_layers * n_heads) % 3 != 0
        batches = [windows]
        tic = time.perf_counter()
        streams = layer_streams(model, batches, on)
        static_record = time.perf_counter() - tic
        whole, resumed, static_same = 0.0, 0.0, True
        for layer, head in picks:
            trial = on.clone()
            trial[layer * n_heads + head] = False
            tic = time.perf_counter()
            a = mask_nll(model, batches, trial)
            whole += time.perf_counter() - tic
            tic = time.perf_counter()
            b = mask_nll(model, batches, trial, resume=(layer, streams[layer]))
            resumed += time.perf_counter() - tic
            static_same = static_same and a == b
    n = len(picks)
    print(json.dumps({"base": args.base, "layers": n_layers, "heads": n_heads, "batch": args.batch, "length": args.length,
                      "forwards_each": n, "probe_full_s": round(full / n, 4), "probe_replayed_s": round(fast / n, 4),
                      "probe_record_s": round(record, 4), "probe_replayed_over_full": round(fast / full, 3),
                      "probe_same_nll": same, "static_whole_s": round(whole / n, 4), "static_resumed_s": round(resumed / n, 4),
                      "static_record_s": round(static_record, 4), "static_resumed_over_whole": round(resumed / whole, 3),
                      "static_same_nll": static_same}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
