"""Context-encoder throughput (docs/pipeline.md): positions encoded per second by each encoder kind, on
the same windows of the pipeline's train stream, side by side in one process.

- `minilm`: the packaged all-MiniLM-L6-v2, one encoder pass per position (text of the last
  `--window` base tokens);
- `base`: the pipeline's own LM, one causal pass per window;
- `hf`: an HF causal model directory/id with last-token pooling, through the per-base-token
  tokenization that keeps it causal (default: the base model directory used as such a model).

Needs the tokenizer and base stages' outputs. Prints one JSON line.

    python benchmarks/contexts.py [--windows 16] [--device cuda] [--hf Qwen/Qwen3-Embedding-0.6B]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import AutoTokenizer

from lookahead.lm.encoders import load_context_encoder
from lookahead.train import data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default="models/tokenizer")
    parser.add_argument("--tokens", default="data/tokens")
    parser.add_argument("--base", default="models/base")
    parser.add_argument("--hf", default="models/base", help="HF causal model id/dir for the `hf` kind")
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--context-length", type=int, default=128)
    parser.add_argument("--window", type=int, default=16, help="minilm: tokens of text per position")
    parser.add_argument("--batch-size", type=int, default=8, help="windows per encoder call")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if min(args.windows, args.context_length, args.window, args.batch_size) < 1:
        parser.error("--windows, --context-length, --window and --batch-size must be >= 1")

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    windows = data.train_batch(data.load_stream(args.tokens, "train"), step=0, batch_size=args.windows,
                               seq_len=args.context_length - 1, seed=7)
    out = {"device": args.device, "threads": torch.get_num_threads(), "windows": args.windows,
           "context_length": args.context_length, "minilm_window": args.window, "hf_model": args.hf}
    for kind, spec in (("minilm", "minilm"), ("base", "base"), ("hf", args.hf)):
        encoder = load_context_encoder(spec, args.base, tokenizer, args.window, device=args.device)
        encoder.encode(windows[:1])  # warm-up
        if args.device == "cuda":
            torch.cuda.synchronize()
        tic = time.perf_counter()
        for i in range(0, len(windows), args.batch_size):
            encoder.encode(windows[i : i + args.batch_size])
        if args.device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - tic
        out[f"{kind}_positions_per_s"] = round(windows.numel() / seconds, 1)
        out[f"{kind}_dim"] = encoder.dim
    print(json.dumps(out))


if __name__ == "__main__":
    main()
