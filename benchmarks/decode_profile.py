"""Where a compiled decode step's time goes, per op: ``torch.profiler`` over decode steps of the
stock forward compiled (``StaticCache`` + ``torch.compile``) and of the routed step
(:class:`lookahead.graph.decode.DecodeStep`) — shared ``full`` and per token (a router) in both
skip modes — at one context length and batch, 50 % of heads off.

Inductor's kernels are named in the profile (``cpp.enable_kernel_profile``); ops are grouped into
what they are: ``attention`` (the fused gather–softmax–reduce kernels of the per-token step, or SDPA's
CPU flash kernel), ``matmul`` (``aten::mm``: projections, MLP, LM head), ``other kernels`` (norms,
RoPE, cache writes, embedding), ``host`` (guards, the graph call, the host read of the step's
sizes, eager bookkeeping). Prints one JSON line: per variant, milliseconds per step in each group
and in all (the profiler's overhead included: compare the groups, not the totals with
``benchmarks/runtime.py``).

    python benchmarks/decode_profile.py [--seq 2048] [--batch 8] [--steps 8]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent)]

from runtime import MALLOC_ENV, load_model, random_router, shared_gates  # noqa: E402


def group(name: str) -> str:
    if "softmax" in name or "scaled_dot_product" in name or "flash_attention" in name:
        return "attention"
    if name in ("aten::mm", "aten::addmm", "aten::bmm"):
        return "matmul"
    if name.startswith("graph_") and "cpp_fused" in name:
        return "other kernels"
    return "host"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/base")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    if any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):  # as benchmarks/runtime.py times
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC_ENV})
    torch._inductor.config.cpp.enable_kernel_profile = True
    from transformers import StaticCache

    from lookahead.graph.decode import DecodeStep, compiled_stock

    model, source = load_model(args.model, args.params, None, torch.float32, "cpu", 2 * args.seq + 64)
    cfg = model.config
    t, b, steps = args.seq, args.batch, args.steps
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, cfg.vocab_size, (b, t), generator=gen)
    ids = torch.randint(0, cfg.vocab_size, (b, 2 * steps + 2), generator=gen)
    router = random_router(model, 0.5, args.params)

    def stock():
        cache = StaticCache(config=cfg, max_cache_len=t + 2 * steps + 2)
        model(input_ids=prompt, past_key_values=cache, use_cache=True, cache_position=torch.arange(t))
        forward = compiled_stock(model).forward
        return lambda i: forward(input_ids=ids[:, i : i + 1], past_key_values=cache, use_cache=True,
                                 cache_position=torch.tensor([t + i]))

    def routed(mode, gates=None):
        step = DecodeStep(model, b, t + 2 * steps + 2, mode, None if gates is not None else router)
        state = {"previous": step.prefill(prompt, gates if gates is not None else router.gates(prompt)).hidden[:, -1:]}

        def run(i):
            out = step.step(ids[:, i : i + 1], gates, state["previous"])[0]
            state["previous"] = out.hidden
        return run

    variants = {"stock_compiled": stock, "full_shared_50off": lambda: routed("full", shared_gates(
        cfg.num_hidden_layers, cfg.num_attention_heads, 50, gen)), "full_50off": lambda: routed("full"),
        "query_50off": lambda: routed("query")}
    out = {"model": source, "seq": t, "batch": b, "steps": steps, "threads": torch.get_num_threads()}
    with torch.inference_mode():
        for name, make in variants.items():
            run = make()
            for i in range(steps + 2):  # compiles, then warms
                run(i)
            from torch.profiler import profile

            with profile() as prof:
                for i in range(steps + 2, 2 * steps + 2):
                    run(i)
            groups: dict[str, float] = {}
            for event in prof.key_averages():  # self times: an enclosing range counts its own part only
                groups[group(event.key)] = groups.get(group(event.key), 0.0) + event.self_cpu_time_total
            out[name] = {k: round(v / steps / 1e3, 3) for k, v in sorted(groups.items())}
            out[name]["total"] = round(sum(groups.values()) / steps / 1e3, 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
