"""The results page's measurements of speed and of the GPU check (:mod:`lookahead.tools.results`
assembles the page): prefill and generation against their FLOP ideal, compiled decoding, ``make gpu-check``."""

from __future__ import annotations

import json
import math
from pathlib import Path

from lookahead.tools.verdicts import table

RUNTIME = Path("benchmarks/results/runtime.json")
GPU = Path("benchmarks/results/gpu.json")


SPEED = (("prefill", 128, "query"), ("prefill", 512, "query"), ("prefill", 2048, "query"), ("prefill", 2048, "full"),
         ("generate", 128, "query"), ("generate", 2048, "query"), ("generate", 2048, "full"))


def speed_section(runtime: dict | None) -> list[str]:
    out = ["## Speed against the FLOP ideal", ""]
    if runtime is None:
        return out + [f"No runtime record: run `python benchmarks/runtime.py --runs 3 > {RUNTIME}`."]
    runs = runtime.get("runs", 1)
    out += [f"Per-token topologies with 50 % of heads off, executed by the plan (`lookahead.graph.plan`, backend "
            f"`auto`) against the stock dense forward, tokens/s over dense: mean ± sd over {runs} runs of "
            f"`python benchmarks/runtime.py --runs {runs}` on {runtime.get('device')} "
            f"({runtime.get('threads')} threads, {runtime.get('layers_x_heads')} heads, hidden {runtime.get('hidden')}; "
            f"`{RUNTIME}`). The ideal is the ratio of multiply-accumulates per token; the verdict is the share of the "
            "ideal's speed-up reached, (ratio − 1) / (ideal − 1).", ""]
    rows = []
    for phase, t_len, mode in SPEED:
        key = f"{phase}_T{t_len}_{mode}_50off_over_dense"
        if key not in runtime:
            continue
        ratio, sd, ideal = runtime[key], runtime.get(f"{key}_sd", 0.0), runtime[f"{key}_ideal"]
        share = (ratio - 1.0) / (ideal - 1.0) if ideal > 1.0 else float("nan")
        rows.append((f"{phase}, T = {t_len}, skip `{mode}`", f"`{key}`", f"{ratio:.2f} ± {sd:.2f} ({runs})",
                     f"{ideal:.2f} (FLOP ideal)", f"{share:.2f} of the ideal speed-up" if math.isfinite(share) else "–"))
    return out + table(("comparison", "figure", "mean ± sd (runs)", "judged against", "verdict"), rows)


DECODE = (("full", "shared_"), ("full", ""), ("query", "shared_"), ("query", ""))
"""The compiled decoding section's variants: skip mode, and shared (no router) or per token (a router)."""


def decode_section(runtime: dict | None) -> list[str]:
    """Decoding with compiled steps (``lookahead.graph.decode``) against the fastest stock decoding,
    HF's ``StaticCache`` with ``torch.compile`` (``benchmarks/runtime.py``'s ``decode_T<T>_B<B>_...``)."""
    from lookahead.graph.generate import COMPILE_PAYS_FROM
    if not runtime or not any(k.startswith("decode_T") for k in runtime):
        return []
    runs = runtime.get("runs", 1)

    def cell(key: str, digits: int = 2) -> str:
        if key not in runtime:
            return "–"
        sd = runtime.get(f"{key}_sd")
        return f"{runtime[key]:.{digits}f}" + (f" ± {sd:.{digits}f}" if sd is not None else "")

    rows = []
    shapes = sorted({(int(k.split("_")[1][1:]), int(k.split("_")[2][1:])) for k in runtime
                     if k.startswith("decode_T") and k.endswith("_stock_compiled_tokens_per_s")})
    for t_len, batch in shapes:
        key = f"decode_T{t_len}_B{batch}"
        cells = [cell(f"{key}_stock_compiled_tokens_per_s", 0), cell(f"{key}_stock_eager_over_compiled_stock"),
                 cell(f"{key}_plan_dense_over_compiled_stock")]
        for mode, kind in DECODE:
            name = f"{key}_{mode}_{kind}50off_over_compiled_stock"
            cells.append(f"{cell(name)} / {runtime[name + '_ideal']:.2f}" if name in runtime else "–")
        rows.append((str(t_len), str(batch), *cells))
    out = ["## Decoding with compiled steps", "",
           f"Tokens/s over the fastest stock decoding — Hugging Face's `StaticCache` with `torch.compile` — with 50 % "
           f"of heads off, mean ± sd over {runs} runs of `python benchmarks/runtime.py --runs {runs}` on "
           f"{runtime.get('device')} ({runtime.get('threads')} threads; `{RUNTIME}`), beside each its FLOP ideal "
           "(per token: the router's MACs included). *Shared*: one set of heads for every token (no router); *per "
           "token*: a router of the predictor's shape chooses each token's heads inside the step. The routed steps "
           "are `lookahead.graph.decode.DecodeStep` (`python -m lookahead.graph.generate --compile`); 25 % and 75 % "
           "off, and every figure's `_of_ideal`, are in the JSON.", ""]
    out += table(("T", "batch", "compiled stock tokens/s", "eager stock", "routed, every head on", "shared `full`",
                  "per token `full`", "shared `query`", "per token `query`"), rows)
    if "decode_compilations_routed" in runtime:
        out += ["", f"Compilation, apart from every timing (per process; the first process of a machine starts with "
                    f"inductor's on-disk cache cold): the routed graphs {cell('decode_compilations_routed', 0)} "
                    f"in {cell('decode_compile_s_routed', 1)} s ({cell('decode_compile_s_per_graph', 1)} s each), the "
                    f"stock forward {cell('decode_compilations_stock', 0)} in {cell('decode_compile_s_stock', 1)} s."]
        paid = []
        for t_len, batch in shapes:
            saves = runtime.get(f"decode_T{t_len}_B{batch}_query_50off_saves_ms_per_token")
            if saves and saves > 0:  # a generation compiles two graphs: its router's and the layers'
                paid.append(f"{2 * runtime['decode_compile_s_per_graph'] / (saves * batch / 1e3):,.0f} steps "
                            f"(T = {t_len}, batch {batch})")
        if paid:
            out += ["", "A generation compiles two graphs (the router's and the layers'); against the eager plan's steps "
                        "(per token `query`, 50 % off) the compiled steps pay that back after " + ", ".join(paid)
                    + f". `python -m lookahead.graph.generate` compiles by default on CPU from "
                      f"{COMPILE_PAYS_FROM} new tokens (`--compile` / `--no-compile` choose)."]
    return out + [""]


def gpu_section(path: Path) -> list[str]:
    """``make gpu-check``'s record (benchmarks/gpu_check.py), where one was committed: exactness on
    CUDA, per-token routing at 50 % off against dense at T = 2048 and 8192, and a 1B-shape training
    step's peak memory against the estimate."""
    if not path.is_file():
        return []
    gpu = json.loads(path.read_text(encoding="utf-8").strip().splitlines()[-1])
    out = ["## On a GPU", "", f"`make gpu-check` on {gpu['device']} (torch {gpu['torch']}; `{GPU}`).", ""]
    out += table(("exactness", "max abs logit difference", "tolerance", "holds"),
                 [(f"`{name}`", ", ".join(f"{k} {v:.2g}" for k, v in row.items() if k.endswith(("reference", "sdpa"))
                                          and v is not None), f"{row['tolerance']:g}", "yes" if row["ok"] else "no")
                  for name, row in gpu["exactness"].items()]) + [""]
    rows = []
    for label, run in gpu["runtime"].items():
        for key in sorted(k for k in run if k.endswith("_50off_over_dense") and "_T" in k and "shared" not in k):
            rows.append((f"{label} ({run.get('arch')})", f"`{key}`", f"{run[key]:.2f}", f"{run.get(f'{key}_ideal', float('nan')):.2f}"))
    out += table(("model", "figure", "over dense", "FLOP ideal"), rows) + [""]
    out += table(("1B-shape step", "micro-batch × accumulate", "checkpointing", "peak GiB", "estimate GiB"),
                 [(stage, f"{r['micro_batch']} × {r['accumulate']}", "yes" if r["checkpoint_activations"] else "no",
                   f"{r.get('peak_gib', float('nan')):.1f}", f"{r['estimated_gib']:.1f}") for stage, r in gpu["training"].items()])
    return out + [""]


