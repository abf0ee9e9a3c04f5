"""Head-graph runtime speed: stock Hugging Face forward vs the rewired forward, dense and with
heads switched off in hard mode (DESIGN §4, §6).

On one model and one batch, in one process, timed in interleaved rounds (median per variant):

- stock: ``model(input_ids).logits``;
- dense: ``forward_with_topology`` with adjacency = the allowed mask (shared), and the same dense
  graph given per position (B, T, N, N);
- shared_off{25,50,75}: hard mode, one topology for every position with that share of heads off
  (the edges among the heads that run all kept);
- per_position_off{25,50,75}: hard mode, an independent random topology per position with exactly
  that share of heads off.

Which heads are off matters for a shared topology (a layer with every head off costs nothing), so
each hard variant is timed on ``--draws`` random topologies: its figures are the median over the
draws, with the range over draws beside them (``…_range``).

CPU runs re-execute themselves with glibc's mmap/trim thresholds raised (``--system-malloc``
keeps the system default): PyTorch's CPU allocator does not cache, and with the default
thresholds every large intermediate is mmapped and page-faulted anew, which makes timings of
any variant swing by tens of percent between rounds; CUDA's caching allocator has no such cost.
Prints one JSON line; without a trained model directory (or with ``--arch``) a random model of the
profile's (or the given) architecture is timed — the cost is the same as with trained weights.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from lookahead.graph.nodes import allowed_mask, n_nodes
from lookahead.graph.runtime import forward_with_topology

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "1073741824", "MALLOC_TRIM_THRESHOLD_": "17179869184",
              "MALLOC_TOP_PAD_": "268435456"}
FRACTIONS = (25, 50, 75)


def load_model(path: str, params: str, arch: str | None, dtype: torch.dtype, device: str):
    """The model at ``path``; else (a fresh clone, or ``--arch``) a random OLMo2 of the params'
    base architecture with the tokenizer's vocabulary size (same cost as trained weights)."""
    from transformers import AutoModelForCausalLM, Olmo2Config, Olmo2ForCausalLM

    from lookahead.core.config import load_section, read_params
    from lookahead.pipeline.base import BaseConfig

    if arch is None and Path(path).is_dir():
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval(), path
    a = load_section(params, "base", BaseConfig).arch
    n_layers, n_heads, hidden, ffn = (int(x) for x in arch.split(",")) if arch else (
        a.n_layers, a.n_heads, a.hidden_size, a.intermediate_size)
    vocab = read_params(params)["tokenizer"]["vocab_size"]
    cfg = Olmo2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=n_layers,
                      num_attention_heads=n_heads, num_key_value_heads=n_heads, max_position_embeddings=4096,
                      rms_norm_eps=a.rms_norm_eps, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    model = Olmo2ForCausalLM(cfg).to(dtype=dtype, device=device).eval()
    return model, f"random {n_layers}x{n_heads} heads, hidden {hidden}, ffn {ffn}, vocab {vocab}"


def shared_topology(n_layers, n_heads, off_pct, gen):
    """One hard topology: off_pct % of heads off, all edges among the others."""
    n = n_nodes(n_layers, n_heads)
    g = torch.ones(n)
    g[1 + torch.randperm(n - 1, generator=gen)[: round((n - 1) * off_pct / 100)]] = 0
    return allowed_mask(n_layers, n_heads).float() * g[:, None] * g[None, :], g


def per_position_topology(n_layers, n_heads, off_pct, b, t, gen):
    """Per position, exactly off_pct % of heads off (chosen independently)."""
    n = n_nodes(n_layers, n_heads)
    order = torch.rand(b, t, n - 1, generator=gen).argsort(-1)
    g = torch.ones(b, t, n)
    g[..., 1:] = (order >= round((n - 1) * off_pct / 100)).float()
    return allowed_mask(n_layers, n_heads).float() * g[..., :, None] * g[..., None, :], g


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/base", help="HF model directory (default: the base stage's)")
    parser.add_argument("--params", default="params.yaml", help="for the random fallback model's architecture")
    parser.add_argument("--arch", help="time a random model instead: 'layers,heads,hidden,ffn'")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--draws", type=int, default=5, help="random topologies per hard variant")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--system-malloc", action="store_true", help="keep glibc's default thresholds")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.rounds < 1 or args.draws < 1:
        parser.error("--rounds and --draws must be at least 1")

    if args.device == "cpu" and not args.system_malloc and any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC_ENV})

    dtype = getattr(torch, args.dtype)
    model, source = load_model(args.model, args.params, args.arch, dtype, args.device)
    cfg = model.config
    n_layers, n_heads = cfg.num_hidden_layers, cfg.num_attention_heads
    gen = torch.Generator().manual_seed(args.seed)
    b, t = args.batch, args.seq
    ids = torch.randint(0, cfg.vocab_size, (b, t), generator=gen).to(args.device)
    dense = allowed_mask(n_layers, n_heads).float().to(args.device)
    n = dense.shape[0]

    variants = {
        "stock": lambda: model(ids).logits,
        "dense": lambda: forward_with_topology(model, ids, dense),
        "dense_per_position": lambda: forward_with_topology(model, ids, dense.expand(b, t, n, n)),
    }
    hard = [f"{kind}_off{pct}" for pct in FRACTIONS for kind in ("shared", "per_position")]
    for draw in range(args.draws):
        for pct in FRACTIONS:
            a, g = (x.to(args.device) for x in shared_topology(n_layers, n_heads, pct, gen))
            variants[f"shared_off{pct}/{draw}"] = lambda a=a, g=g: forward_with_topology(model, ids, a, g, hard=True)
            a, g = (x.to(args.device) for x in per_position_topology(n_layers, n_heads, pct, b, t, gen))
            variants[f"per_position_off{pct}/{draw}"] = lambda a=a, g=g: forward_with_topology(
                model, ids, a, g, hard=True)

    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    times: dict[str, list[float]] = {k: [] for k in variants}
    with torch.inference_mode():
        max_diff = (variants["dense"]().float() - variants["stock"]().float()).abs().max().item()
        for f in variants.values():  # warm-up
            f()
        for _ in range(args.rounds):
            for name, f in variants.items():
                sync()
                tic = time.perf_counter()
                f()
                sync()
                times[name].append(time.perf_counter() - tic)
        # the same comparison after the timing, so a run whose numbers drift is seen
        max_diff_after = (variants["dense"]().float() - variants["stock"]().float()).abs().max().item()
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}

    def over(name: str, base: str) -> tuple[float, list[float]]:  # median and range over the draws
        ratios = [ms[f"{name}/{draw}"] / ms[base] for draw in range(args.draws)]
        return round(statistics.median(ratios), 3), [round(min(ratios), 3), round(max(ratios), 3)]

    out = {
        "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(),
        "dtype": args.dtype, "model": source, "layers_x_heads": f"{n_layers}x{n_heads}",
        "hidden": cfg.hidden_size, "batch": b, "seq": t, "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "allocator": "system" if args.system_malloc or args.device != "cpu" else "glibc thresholds raised",
        "max_abs_diff_dense_vs_stock": max_diff, "max_abs_diff_dense_vs_stock_after_timing": max_diff_after,
        "draws": args.draws,
        **{f"{k}_ms": round(ms[k], 3) for k in ("stock", "dense", "dense_per_position")},
        **{f"{k}_ms": round(statistics.median(ms[f"{k}/{draw}"] for draw in range(args.draws)), 3) for k in hard},
        "dense_over_stock": round(ms["dense"] / ms["stock"], 3),
        "dense_per_position_over_dense": round(ms["dense_per_position"] / ms["dense"], 3),
    }
    for k in hard:
        out[f"{k}_over_dense"], out[f"{k}_over_dense_range"] = over(k, "dense")
    for pct in FRACTIONS:
        k = f"per_position_off{pct}"
        out[f"{k}_over_dense_per_position"], _ = over(k, "dense_per_position")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
