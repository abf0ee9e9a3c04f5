"""Hard head-gate execution against the stock dense model: prefill and generation, T = 128 … 2048.

On one model, in one process, for every context length T (``--seqs``), skip mode (``full`` and
``query``), share of heads off (25 / 50 / 75 %) and topology kind — ``shared`` (one set of heads off
at every position) and per token (exactly that share of all L·H heads off at each position, chosen
independently: a top-K router's shape) — it times:

- prefill: the execution plan (:func:`lookahead.graph.plan.gated_forward`) on B × T tokens
  (B = ``--tokens`` / T) against the stock Hugging Face forward on the same batch;
- generation: ``--new`` decoding steps after a T-token prompt, batch ``--gen-batch``, with the
  plan's KV cache (each step its own per-token topology) against stock decoding with HF's
  preallocated ``StaticCache`` (the fastest stock decoding; its default ``DynamicCache``, which
  concatenates the whole cache at every step, is reported beside it as
  ``generate_T<T>_stock_dynamic_cache_over_stock``).

Per-token topologies at 50 % off run under each attention backend of the plan
(:mod:`lookahead.graph.flex`) besides the default ``auto``: ``..._50off_flex_over_dense`` (FlexAttention
wherever it applies: packed active queries in ``query`` prefill, per-(row, head) key blocks in
decoding) and ``..._50off_sdpa_over_dense`` (the SDPA paths only). ``flex_compile_s`` is the time the
process spent compiling Flex kernels (``flex_compiles`` of them, one per shape), apart from every
timing (the warm-up calls absorb it).

Variants are timed in interleaved rounds (median). ``--runs N`` (≥ 2) reruns the whole benchmark in N
fresh processes and prints each figure's mean with its ``_sd`` beside it. Each ratio is (tokens/s) / (stock dense tokens/s),
named ``prefill_T<T>_<mode>_<pct>off_over_dense`` / ``generate_T<T>_<mode>_<pct>off_over_dense``
(per token) and ``..._<mode>_shared_<pct>off_...`` (shared), with ``..._ideal`` beside each: the ratio
of multiply-accumulates per token (:func:`lookahead.graph.cost.macs_per_token`), the limit skipping work can reach. The
plan's own dense path (every head on) against stock is ``prefill_T<T>_plan_dense_over_stock`` /
``generate_T<T>_plan_dense_over_stock``: what the ratios owe to the implementation rather than to
skipping. ``attention_share_T<T>`` is attention's share of the dense MACs (where attention dominates).

CPU runs re-execute themselves with glibc's mmap/trim thresholds raised (``--system-malloc`` keeps
the default): PyTorch's CPU allocator does not cache, and with the default thresholds every large
intermediate is mmapped and page-faulted anew, which makes timings swing by tens of percent.
Prints one JSON line. Without a trained model directory (or with ``--arch``) a random model of the
params' base architecture is timed — the cost is the same as with trained weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from lookahead.graph import flex
from lookahead.graph.cost import macs_per_token
from lookahead.graph.nodes import allowed_mask, n_nodes
from lookahead.graph.plan import KVCache, gated_forward
from lookahead.graph.runtime import forward_with_topology

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "1073741824", "MALLOC_TRIM_THRESHOLD_": "17179869184",
              "MALLOC_TOP_PAD_": "268435456"}
FRACTIONS = (25, 50, 75)
MODES = ("full", "query")
BACKENDS = ("flex", "sdpa")
BACKENDS_ = tuple(f"{b}_" for b in BACKENDS)
"""Backends timed beside ``auto`` for per-token topologies at 50 % off."""


def load_model(path: str, params: str, arch: str | None, dtype: torch.dtype, device: str, max_positions: int = 4096):
    """The model at ``path``; else (a fresh clone, or ``--arch``) a random OLMo2 of the params'
    base architecture with the tokenizer's vocabulary size (same cost as trained weights)."""
    from transformers import AutoModelForCausalLM, Olmo2Config, Olmo2ForCausalLM

    from lookahead.core.config import load_section, read_params
    from lookahead.pipeline.base import BaseConfig

    if arch is None and Path(path).is_dir():  # RoPE extends past the trained context length
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval(), path
    a = load_section(params, "base", BaseConfig).arch
    n_layers, n_heads, hidden, ffn = (int(x) for x in arch.split(",")) if arch else (
        a.n_layers, a.n_heads, a.hidden_size, a.intermediate_size)
    vocab = read_params(params)["tokenizer"]["vocab_size"]
    cfg = Olmo2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=n_layers,
                      num_attention_heads=n_heads, num_key_value_heads=n_heads, max_position_embeddings=max_positions,
                      rms_norm_eps=a.rms_norm_eps, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    model = Olmo2ForCausalLM(cfg).to(dtype=dtype, device=device).eval()
    return model, f"random {n_layers}x{n_heads} heads, hidden {hidden}, ffn {ffn}, vocab {vocab}"


def shared_gates(n_layers, n_heads, off_pct, gen):
    """One topology: off_pct % of the heads off."""
    g = torch.ones(n_nodes(n_layers, n_heads))
    g[1 + torch.randperm(n_layers * n_heads, generator=gen)[: round(n_layers * n_heads * off_pct / 100)]] = 0
    return g


def per_token_gates(n_layers, n_heads, off_pct, b, t, gen):
    """Per position, exactly off_pct % of the L·H heads off (chosen independently)."""
    order = torch.rand(b, t, n_layers * n_heads, generator=gen).argsort(-1)
    g = torch.ones(b, t, n_nodes(n_layers, n_heads))
    g[..., 1:] = (order >= round(n_layers * n_heads * off_pct / 100)).float()
    return g


def timed(variants: dict, rounds: int, sync, setup=None) -> dict[str, float]:
    """Median seconds per variant over interleaved rounds; ``setup(name)`` runs untimed before each call
    and its result is passed to the variant."""
    times = {k: [] for k in variants}
    for name, f in variants.items():  # warm-up
        f(setup(name) if setup else None)
    for _ in range(rounds):
        for name, f in variants.items():
            state = setup(name) if setup else None
            sync()
            tic = time.perf_counter()
            f(state)
            sync()
            times[name].append(time.perf_counter() - tic)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/base", help="HF model directory (default: the base stage's)")
    parser.add_argument("--params", default="params.yaml", help="for the random fallback model's architecture")
    parser.add_argument("--arch", help="time a random model instead: 'layers,heads,hidden,ffn'")
    parser.add_argument("--seqs", default="128,512,2048", help="context lengths T")
    parser.add_argument("--tokens", type=int, default=2048, help="prefill tokens per batch (B = tokens / T)")
    parser.add_argument("--gen-batch", type=int, default=8, help="rows decoded side by side (the eager variants)")
    parser.add_argument("--decode-batches", default="1,8", help="batches of the compiled decoding section ('': none)")
    parser.add_argument("--decode-fractions", default="25,50,75", help="shares of heads off (%%) it times")
    parser.add_argument("--new", type=int, default=16, help="decoding steps timed after the prompt")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--system-malloc", action="store_true", help="keep glibc's default thresholds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=1, help="rerun in N processes: means and _sd")
    args = parser.parse_args()
    if args.runs > 1:
        return repeat(args.runs)
    seqs = [int(x) for x in args.seqs.split(",")]
    if args.rounds < 1 or args.new < 1 or min(seqs) < 2 or any(args.tokens < t for t in seqs):
        parser.error("--rounds and --new must be at least 1, every T at least 2 and at most --tokens")

    if args.device == "cpu" and not args.system_malloc and any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC_ENV})

    dtype = getattr(torch, args.dtype)
    model, source = load_model(args.model, args.params, args.arch, dtype, args.device, 2 * max(seqs) + args.new)
    cfg = model.config
    n_layers, n_heads = cfg.num_hidden_layers, cfg.num_attention_heads
    n = n_nodes(n_layers, n_heads)
    gen = torch.Generator().manual_seed(args.seed)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    dev = args.device
    out = {"device": dev if dev == "cpu" else torch.cuda.get_device_name(), "dtype": args.dtype, "model": source,
           "layers_x_heads": f"{n_layers}x{n_heads}", "hidden": cfg.hidden_size, "ffn": cfg.intermediate_size,
           "vocab": cfg.vocab_size, "threads": torch.get_num_threads(), "rounds": args.rounds,
           "prefill_tokens": args.tokens, "gen_batch": args.gen_batch, "gen_new_tokens": args.new,
           "allocator": "system" if args.system_malloc or dev != "cpu" else "glibc thresholds raised"}
    kinds = [(mode, pct, kind) for mode in MODES for pct in FRACTIONS for kind in ("", "shared_")]
    kinds += [(mode, 50, f"{backend}_") for mode in MODES for backend in BACKENDS]
    max_diff = 0.0

    with torch.inference_mode():
        for t in seqs:
            b = args.tokens // t
            ids = torch.randint(0, cfg.vocab_size, (b, t), generator=gen).to(dev)
            dense_macs = macs_per_token(cfg, (t + 1) / 2, 1.0, "query")
            attn_macs = n_layers * 2 * (t + 1) / 2 * cfg.hidden_size
            out[f"attention_share_T{t}"] = round(attn_macs / dense_macs, 3)
            gates = topologies(kinds, lambda pct, shared: (shared_gates(n_layers, n_heads, pct, gen) if shared else
                                                           per_token_gates(n_layers, n_heads, pct, b, t, gen)).to(dev))
            variants = {"stock": lambda _: model(ids).logits,
                        "plan_dense": lambda _: gated_forward(model, ids, torch.ones(n, device=dev), "query")}
            for mode, pct, kind in kinds:
                name = f"{mode}_{kind}{pct}off"
                variants[name] = lambda _, g=gates[name], mode=mode, backend=backend_of(kind): routed(model, ids, g, mode,
                                                                                                   backend)
            max_diff = max(max_diff, (variants["plan_dense"](None).logits.float() - model(ids).logits.float()).abs().max().item())
            if t == min(seqs) and dev == "cpu":  # the plan against the general runtime on every variant
                mask = allowed_mask(n_layers, n_heads).float()
                for mode, pct, kind in kinds:
                    g = gates[f"{mode}_{kind}{pct}off"]
                    a = mask * g[..., :, None]
                    ref = forward_with_topology(model, ids, a, g, hard=True, skip=mode)
                    out["max_abs_diff_plan_vs_runtime"] = max(out.get("max_abs_diff_plan_vs_runtime", 0.0),
                                                              (variants[f"{mode}_{kind}{pct}off"](None).logits - ref)
                                                              .abs().max().item())
            sec = timed(variants, args.rounds, sync)
            out[f"prefill_T{t}_stock_ms"] = round(sec["stock"] * 1e3, 3)
            out[f"prefill_T{t}_plan_dense_over_stock"] = round(sec["stock"] / sec["plan_dense"], 3)
            for mode, pct, kind in kinds:
                key = f"prefill_T{t}_{mode}_{kind}{pct}off_over_dense"
                out[key] = round(sec["stock"] / sec[f"{mode}_{kind}{pct}off"], 3)
                out[f"{key}_ideal"] = round(dense_macs / macs_per_token(cfg, (t + 1) / 2, 1 - pct / 100, mode), 3)
            out.update(generation(model, t, args, kinds, gen, sync))
            for b in [int(x) for x in args.decode_batches.split(",") if x]:
                out.update(compiled_decoding(model, t, b, args, gen, sync))
    out["max_abs_diff_plan_dense_vs_stock"] = max_diff
    if args.decode_batches:
        out.update(compile_figures(model))
    out.update({f"flex_{k}": round(v, 3) if isinstance(v, float) else v for k, v in flex.stats().items()})
    print(json.dumps(out))


def topologies(kinds, draw) -> dict:
    """The gates of every variant ``<mode>_<kind><pct>off``, drawn in order by ``draw(pct, shared)``;
    a backend variant (``flex_``, ``sdpa_``) runs the gates of its ``auto`` variant."""
    gates = {}
    for mode, pct, kind in kinds:
        gates[f"{mode}_{kind}{pct}off"] = gates[f"{mode}_{pct}off"] if kind in BACKENDS_ else draw(pct, kind == "shared_")
    return gates


def backend_of(kind: str) -> str:
    """The attention backend a variant kind runs under (``auto`` unless it names one)."""
    return kind.rstrip("_") if kind in BACKENDS_ else "auto"


def routed(model, ids, gates, mode, backend, cache=None):
    """The plan's forward under one attention backend."""
    with flex.use(backend):
        return gated_forward(model, ids, gates, mode, cache)


def repeat(runs: int) -> None:
    """The benchmark in ``runs`` fresh processes (its own arguments minus ``--runs``): every numeric
    figure's mean, with ``<key>_sd`` (sample sd) beside the timed ratios and times."""
    import subprocess

    argv, skip = [], False
    for a in sys.argv[1:]:
        if skip or a.startswith("--runs"):
            skip = a == "--runs"
            continue
        argv.append(a)
    outs = [json.loads(subprocess.run([sys.executable, __file__, *argv], check=True, capture_output=True,
                                      text=True).stdout.strip().splitlines()[-1]) for _ in range(runs)]
    res = {"runs": runs}
    for key, first in outs[0].items():
        values = [o[key] for o in outs]
        if isinstance(first, bool) or not isinstance(first, (int, float)) or len(set(values)) == 1:
            res[key] = first if len(set(map(str, values))) == 1 else values
            continue
        res[key] = round(statistics.mean(values), 3)
        res[f"{key}_sd"] = round(statistics.stdev(values), 3)
    print(json.dumps(res))


def generation(model, t: int, args, kinds, gen, sync) -> dict:
    """Decode tokens/s after a T-token prompt: the plan with its cache per topology, and stock (HF's
    ``StaticCache``; its default ``DynamicCache`` beside it)."""
    from transformers import StaticCache

    cfg = model.config
    n_layers, n_heads = cfg.num_hidden_layers, cfg.num_attention_heads
    n, b, new, dev = n_nodes(n_layers, n_heads), args.gen_batch, args.new, args.device
    prompt = torch.randint(0, cfg.vocab_size, (b, t), generator=gen).to(dev)
    steps = torch.randint(0, cfg.vocab_size, (b, new), generator=gen).to(dev)  # teacher-forced: same work per run
    gates = {"plan_dense": torch.ones(n, device=dev),
             **topologies(kinds, lambda pct, shared: (shared_gates(n_layers, n_heads, pct, gen) if shared else
                                                     per_token_gates(n_layers, n_heads, pct, b, t + new, gen)).to(dev))}
    backends = {f"{mode}_{kind}{pct}off": backend_of(kind) for mode, pct, kind in kinds}

    def setup(name):  # the prompt's cache, untimed
        if name == "stock":  # HF's preallocated cache: the fastest stock decoding
            cache = StaticCache(config=cfg, max_cache_len=t + new)
            model(input_ids=prompt, past_key_values=cache, use_cache=True, cache_position=torch.arange(t, device=dev))
            return cache
        if name == "stock_dynamic":  # HF's default cache (grown by concatenation every step)
            return model(input_ids=prompt, use_cache=True).past_key_values
        mode = "query" if name == "plan_dense" else name.split("_")[0]
        g = gates[name]
        cache = KVCache(model, b, t + new, mode)
        gated_forward(model, prompt, g if g.dim() == 1 else g[:, :t], mode, cache)
        return cache

    def stock(cache):
        for i in range(new):
            model(input_ids=steps[:, i : i + 1], past_key_values=cache, use_cache=True,
                  cache_position=torch.tensor([t + i], device=dev))

    def stock_dynamic(past):
        for i in range(new):
            past = model(input_ids=steps[:, i : i + 1], past_key_values=past, use_cache=True).past_key_values

    def plan(name):
        mode = "query" if name == "plan_dense" else name.split("_")[0]
        backend = backends.get(name, "auto")
        g = gates[name]

        def run(cache):
            for i in range(new):
                routed(model, steps[:, i : i + 1], g if g.dim() == 1 else g[:, t + i : t + i + 1], mode, backend, cache)
        return run

    sec = timed({"stock": stock, "stock_dynamic": stock_dynamic, **{name: plan(name) for name in gates}}, args.rounds,
                sync, setup)
    res = {f"generate_T{t}_stock_tokens_per_s": round(b * new / sec["stock"], 1),
           f"generate_T{t}_stock_dynamic_cache_over_stock": round(sec["stock"] / sec["stock_dynamic"], 3),
           f"generate_T{t}_plan_dense_over_stock": round(sec["stock"] / sec["plan_dense"], 3)}
    dense_macs = macs_per_token(cfg, t, 1.0, "query")
    for mode, pct, kind in kinds:
        key = f"generate_T{t}_{mode}_{kind}{pct}off_over_dense"
        res[key] = round(sec["stock"] / sec[f"{mode}_{kind}{pct}off"], 3)
        res[f"{key}_ideal"] = round(dense_macs / macs_per_token(cfg, t, 1 - pct / 100, mode), 3)
    return res



SHARED: dict[int, torch.Tensor] = {}
"""The compiled section's shared topology per share off, one per process: its layers' head counts
(0 and 1 are specialised) then compile once for every T and batch."""


def random_router(model, keep: float, params: str):
    """A head-gate router of the params' predictor shape (input ``lm``, exact top-K of all heads at
    ``keep``; no geometric features), random weights: it costs what a trained one costs."""
    from lookahead.core.config import load_section
    from lookahead.graph.generate import Router
    from lookahead.graph.predictor import PredictorConfig, StructurePredictor

    cfg = load_section(params, "predictor", PredictorConfig)
    cfg = dataclasses.replace(cfg, gate="head", budget="topk", keep=keep, input="lm", geo_features=False,
                              edges="all", always_on=[])
    torch.manual_seed(0)
    n_layers, n_heads, hidden = model.config.num_hidden_layers, model.config.num_attention_heads, model.config.hidden_size
    predictor = StructurePredictor(cfg, n_layers, n_heads, 2 * hidden).to(next(model.parameters()).device).eval()
    with torch.no_grad():  # keep logits that vary with the token, so the topology changes every step
        predictor.to_gate.weight.normal_(0, 1)
    return Router(predictor, model)


def compiled_decoding(model, t: int, b: int, args, gen, sync) -> dict:
    """Decoding with compiled steps after a T-token prompt, batch b, against the fastest stock decoding
    (HF's ``StaticCache`` with ``torch.compile``): the routed step (:class:`lookahead.graph.decode.DecodeStep`)
    with every head on, and per skip mode and share off, a shared topology and a per-token router (its
    graph in the step, its MACs in the ideal); the eager stock and eager routed steps beside. Caches are
    restored from the prompt's between rounds (untimed)."""
    from transformers import StaticCache

    from lookahead.graph.cost import router_macs
    from lookahead.graph.decode import DecodeStep, compiled_stock
    from lookahead.graph.generate import Router

    cfg = model.config
    n_layers, n_heads = cfg.num_hidden_layers, cfg.num_attention_heads
    n, new, dev = n_nodes(n_layers, n_heads), args.new, args.device
    prompt = torch.randint(0, cfg.vocab_size, (b, t), generator=gen).to(dev)
    steps = torch.randint(0, cfg.vocab_size, (b, new), generator=gen).to(dev)
    stock_forward = compiled_stock(model).forward

    def stock_variant(forward):
        cache = StaticCache(config=cfg, max_cache_len=t + new)
        model(input_ids=prompt, past_key_values=cache, use_cache=True, cache_position=torch.arange(t, device=dev))
        saved = [(layer.keys.clone(), layer.values.clone(), layer.cumulative_length.clone()) for layer in cache.layers]

        def restore(_):
            for layer, kept in zip(cache.layers, saved):
                for live, old in zip((layer.keys, layer.values, layer.cumulative_length), kept):
                    live.copy_(old)

        def run(_):
            for i in range(new):
                forward(input_ids=steps[:, i : i + 1], past_key_values=cache, use_cache=True,
                        cache_position=torch.tensor([t + i], device=dev))
        return restore, run

    def routed_variant(mode, gates=None, router: Router | None = None):
        step = DecodeStep(model, b, t + new, mode, router)
        first = step.prefill(prompt, gates if router is None else router.gates(prompt)).hidden[:, -1:]
        live = [x for x in step.keys + step.values if x is not None]  # a shared topology: None where no head runs
        saved = ([x.clone() for x in live], step.cache.stored.clone())

        def restore(_):
            for x, kept in zip(live, saved[0]):
                x.copy_(kept)
            step.cache.stored.copy_(saved[1])
            step.cache.length = t

        def run(_):
            previous = first
            for i in range(new):
                out = step.step(steps[:, i : i + 1], gates, previous)[0]
                previous = out.hidden
        return restore, run

    def eager_routed(router: Router, mode: str):
        """The eager plan's steps with the same router (``generate(compile=False)``'s loop)."""
        cache = KVCache(model, b, t + new, mode)
        first = gated_forward(model, prompt, router.gates(prompt), mode, cache).hidden[:, -1:]
        saved = (cache.kv.clone(), cache.stored.clone())

        def restore(_):
            cache.kv.copy_(saved[0])
            cache.stored.copy_(saved[1])
            cache.length = t

        def run(_):
            previous = first
            for i in range(new):
                ids = steps[:, i : i + 1]
                previous = gated_forward(model, ids, router.gates(ids, previous), mode, cache).hidden
        return restore, run

    variants = {"stock": stock_variant(model), "stock_compiled": stock_variant(stock_forward),
                "plan_dense": routed_variant("query", torch.ones(n, device=dev))}
    fractions = [int(x) for x in args.decode_fractions.split(",")]
    routers = {pct: random_router(model, 1 - pct / 100, args.params) for pct in fractions}
    for mode in MODES:
        for pct in fractions:
            variants[f"{mode}_shared_{pct}off"] = routed_variant(mode, SHARED.setdefault(pct, shared_gates(
                n_layers, n_heads, pct, torch.Generator().manual_seed(pct))).to(dev))
            variants[f"{mode}_{pct}off"] = routed_variant(mode, router=routers[pct])
    if 50 in routers:
        variants["eager_query_50off"] = eager_routed(routers[50], "query")
    sec = timed({name: run for name, (_, run) in variants.items()}, args.rounds, sync,
                setup=lambda name: variants[name][0](None))
    key = f"decode_T{t}_B{b}"
    res = {f"{key}_stock_compiled_tokens_per_s": round(b * new / sec["stock_compiled"], 1),
           f"{key}_stock_eager_over_compiled_stock": round(sec["stock_compiled"] / sec["stock"], 3),
           f"{key}_plan_dense_over_compiled_stock": round(sec["stock_compiled"] / sec["plan_dense"], 3)}
    dense_macs = macs_per_token(cfg, t, 1.0, "query")
    for mode in MODES:
        for pct in fractions:
            for kind in ("shared_", ""):
                name = f"{mode}_{kind}{pct}off"
                ratio = sec["stock_compiled"] / sec[name]
                routed_macs = macs_per_token(cfg, t, 1 - pct / 100, mode) + (router_macs(routers[pct].predictor) if not kind else 0)
                ideal = dense_macs / routed_macs
                res[f"{key}_{name}_over_compiled_stock"] = round(ratio, 3)
                res[f"{key}_{name}_over_compiled_stock_ideal"] = round(ideal, 3)
                res[f"{key}_{name}_of_ideal"] = round(ratio / ideal, 3)
    if "eager_query_50off" in sec:
        res[f"{key}_eager_query_50off_over_compiled_stock"] = round(sec["stock_compiled"] / sec["eager_query_50off"], 3)
        saved_per_token = (sec["eager_query_50off"] - sec["query_50off"]) / (b * new)  # seconds a compiled token saves
        res[f"{key}_query_50off_saves_ms_per_token"] = round(saved_per_token * 1e3, 4)
    return res


def compile_figures(model) -> dict:
    """This process's compilations of the decoding section and the seconds of the steps that compiled
    them (apart from every timing): the routed graphs (the layers' per-token and shared steps, each
    serving both skip modes; per router its step) and the stock forward."""
    from lookahead.graph import decode

    routed, stock = decode._model_graphs(model), decode.compiled_stock(model)
    graphs, seconds = routed.compilations, routed.compile_s
    return {"decode_compilations_routed": graphs, "decode_compile_s_routed": round(seconds, 2),
            "decode_compile_s_per_graph": round(seconds / max(graphs, 1), 2),
            "decode_compilations_stock": stock.compilations, "decode_compile_s_stock": round(stock.compile_s, 2)}


if __name__ == "__main__":
    main()
