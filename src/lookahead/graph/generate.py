"""Generation with a lookahead router: the router predicts each position's head gates before that
position's forward, and the LM runs them through the execution plan (:mod:`lookahead.graph.plan`)
with a KV cache that stores only what the skip mode needs; dense generation with the stock Hugging
Face forward and its preallocated cache (``StaticCache``) is the comparison.

The router's input at position t (``predictor.input``): ``embedding`` — the token embedding at t;
``lm`` — that and the final hidden state at t − 1. For the prompt those states come from one dense
pass over it (the lookahead contract the pipeline trains and evaluates under); for every generated
position, from the routed forward that actually ran at t − 1 (what a deployed router has). Routers
that read the context cache (``input: cache``) need its encoder over every prefix and are refused.

    python -m lookahead.graph.generate --model models/phase2/lm --predictor models/phase2/predictor.safetensors \\
        --init models/init/init.safetensors --prompt "the cat" --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from lookahead.core.errors import LookaheadError
from lookahead.graph import flex
from lookahead.graph.plan import KVCache, gated_forward
from lookahead.graph.deployed import GenerateError, Router, layer_routed, self_consistent
from lookahead.graph.runtime import check_model

__all__ = ["GenerateError", "Generation", "Router", "generate", "generate_dense", "layer_routed", "load", "main",
           "pick", "self_consistent"]


@dataclasses.dataclass
class Generation:
    ids: torch.Tensor
    """(B, P + n): the prompt and the generated tokens"""
    gates: torch.Tensor | None
    """(B, P + n − 1, N) the head gates every position ran with (None: dense)"""
    prefill_s: float
    decode_s: float
    """seconds of the decode steps that compiled nothing"""
    compile_s: float = 0.0
    """seconds of the decode steps that compiled (tracing, compiling and that step's run), apart"""
    compiled_steps: int = 0
    """decode steps that compiled (their tokens are not in :meth:`tokens_per_s`)"""

    def tokens_per_s(self, prompt_len: int) -> float:
        """Generated tokens per second of decoding (after the prefill, steps that compiled left out),
        over the batch."""
        new = self.ids.shape[1] - prompt_len - 1 - self.compiled_steps  # the first new token comes from the prefill
        return self.ids.shape[0] * new / self.decode_s if new > 0 else float("nan")


COMPILE_PAYS_FROM = 8192
"""``compile=None`` (auto) on CPU: the compiled decode steps are taken from this many new tokens per row
(decode steps) on. A generation compiles two graphs (the router's step and the layers'), seconds
each with inductor's on-disk cache warm and several times that cold, and a compiled step saves
about 1–2 ms against the eager plan's at batch 1 or 8 (``benchmarks/runtime.py``:
``decode_compile_s_per_graph``, ``decode_T<T>_B<B>_query_50off_saves_ms_per_token``; the results page
works out where it pays back: after 1,600–4,500 steps in the runs so far, so this is about twice
the longest). On CUDA the compiled step is always taken."""


def compile_wanted(compile: bool | None, device: torch.device, steps: int) -> bool:
    """Whether generation takes the compiled decode step: ``compile`` when set, else (auto) on CUDA
    always and on CPU from :data:`COMPILE_PAYS_FROM` decode steps."""
    if compile is not None:
        return compile
    return device.type == "cuda" or steps >= COMPILE_PAYS_FROM


def pick(logits: torch.Tensor, temperature: float, top_k: int, generator: torch.Generator | None) -> torch.Tensor:
    """The next token of each row from its logits (B, V): greedy at temperature 0, else sampled
    from softmax(logits / temperature) over the top_k largest (0: all)."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)[:, 0]


def _check(prompt: torch.Tensor, max_new_tokens: int, temperature: float, top_k: int) -> None:
    if prompt.dim() != 2 or prompt.shape[1] == 0:
        raise GenerateError(f"the prompt must be (B, P) token ids with P >= 1; got shape {tuple(prompt.shape)}")
    if max_new_tokens < 1:
        raise GenerateError(f"max_new_tokens must be at least 1; got {max_new_tokens}")
    if temperature < 0 or top_k < 0:
        raise GenerateError(f"temperature and top_k must be >= 0; got {temperature}, {top_k}")


@torch.no_grad()
def generate(lm, router: Router, prompt: torch.Tensor, max_new_tokens: int, skip: str = "query",
             temperature: float = 0.0, top_k: int = 0, generator: torch.Generator | None = None,
             use_cache: bool = True, compile: bool | None = False) -> Generation:
    """Routed generation: ``max_new_tokens`` tokens after ``prompt`` (B, P), each position run under
    the gates the router predicts for it. ``use_cache=False`` recomputes the whole prefix at every
    step (the same topologies; the reference the cached loop is tested against). ``compile``: decode
    with the compiled step (:class:`lookahead.graph.decode.DecodeStep`: the router and every layer
    as compiled graphs); None: where it pays (:func:`compile_wanted`); the eager plan is the reference."""
    _check(prompt, max_new_tokens, temperature, top_k)
    check_model(lm)
    if compile_wanted(compile, prompt.device, max_new_tokens) and use_cache:
        return _generate_compiled(lm, router, prompt, max_new_tokens, skip, temperature, top_k, generator)
    tic = time.perf_counter()
    gates = router.gates(prompt)  # (B, P, N): the prompt's, from a dense pass over it
    cache = KVCache(lm, prompt.shape[0], prompt.shape[1] + max_new_tokens, skip) if use_cache else None
    out = gated_forward(lm, prompt, gates, skip, cache)
    ids = torch.cat([prompt, pick(out.logits[:, -1], temperature, top_k, generator)[:, None]], dim=1)
    prefill_s = time.perf_counter() - tic
    tic = time.perf_counter()
    for _ in range(max_new_tokens - 1):
        step = router.gates(ids[:, -1:], out.hidden[:, -1:])  # (B, 1, N) from the state that ran at t − 1
        gates = torch.cat([gates, step], dim=1)
        out = gated_forward(lm, ids[:, -1:], step, skip, cache) if use_cache else gated_forward(lm, ids, gates, skip)
        ids = torch.cat([ids, pick(out.logits[:, -1], temperature, top_k, generator)[:, None]], dim=1)
    return Generation(ids, gates, prefill_s, time.perf_counter() - tic)


class _StepClock:
    """Times decode steps (``with clock:`` around each), those in which ``compilations()`` grew, i.e.
    that compiled a graph, apart from the others: :meth:`figures` gives Generation's decode_s,
    compile_s and compiled_steps."""

    def __init__(self, compilations):
        self._compilations = compilations
        self._seconds = {False: 0.0, True: 0.0}
        self._compiled_steps = 0

    def __enter__(self):
        self._before, self._tic = self._compilations(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        compiled = self._compilations() > self._before
        self._seconds[compiled] += time.perf_counter() - self._tic
        self._compiled_steps += compiled

    def figures(self) -> tuple[float, float, int]:
        return self._seconds[False], self._seconds[True], self._compiled_steps


def _generate_compiled(lm, router: Router, prompt: torch.Tensor, max_new_tokens: int, skip: str,
                       temperature: float, top_k: int, generator: torch.Generator | None) -> Generation:
    """:func:`generate` with the compiled decode step; the prefill is the plan's, as eager."""
    from lookahead.graph.decode import DecodeStep

    tic = time.perf_counter()
    decoder = DecodeStep(lm, prompt.shape[0], prompt.shape[1] + max_new_tokens, skip, router)
    gates = [router.gates(prompt)]
    out = decoder.prefill(prompt, gates[0])
    ids = [prompt, pick(out.logits[:, -1], temperature, top_k, generator)[:, None]]
    prefill_s = time.perf_counter() - tic
    clock = _StepClock(lambda: decoder.compilations)
    for _ in range(max_new_tokens - 1):
        with clock:
            out, step = decoder.step(ids[-1], previous=out.hidden[:, -1:])
            ids.append(pick(out.logits[:, -1], temperature, top_k, generator)[:, None])
        gates.append(step)
    return Generation(torch.cat(ids, 1), torch.cat(gates, 1), prefill_s, *clock.figures())


@torch.no_grad()
def generate_dense(lm, prompt: torch.Tensor, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
                   generator: torch.Generator | None = None, compile: bool | None = False) -> Generation:
    """Dense generation with the stock forward and its preallocated KV cache (``StaticCache``: the
    fastest stock decoding, and like the routed cache it copies nothing as it grows); ``compile``:
    its decode steps through ``torch.compile`` (Hugging Face's recommended fast path; None: where it
    pays, :func:`compile_wanted`)."""
    from transformers import StaticCache

    _check(prompt, max_new_tokens, temperature, top_k)
    p = prompt.shape[1]
    forward, stock = lm, None
    if compile_wanted(compile, prompt.device, max_new_tokens):
        from lookahead.graph.decode import compiled_stock

        stock = compiled_stock(lm)
        forward = stock.forward
    tic = time.perf_counter()
    cache = StaticCache(config=lm.config, max_cache_len=p + max_new_tokens)
    out = lm(input_ids=prompt, past_key_values=cache, use_cache=True, cache_position=torch.arange(p, device=prompt.device))
    ids = torch.cat([prompt, pick(out.logits[:, -1], temperature, top_k, generator)[:, None]], dim=1)
    prefill_s = time.perf_counter() - tic
    clock = _StepClock(lambda: stock.compilations if stock else 0)
    for i in range(max_new_tokens - 1):
        with clock:
            # the last tokens as a tensor of their own (as Hugging Face's generate passes them): a view
            # of the growing ids changes its stride every step, which a compiled forward recompiles for
            last = ids[:, -1:].clone(memory_format=torch.contiguous_format)
            out = forward(input_ids=last, past_key_values=cache, use_cache=True,
                          cache_position=torch.tensor([p + i], device=prompt.device))
            ids = torch.cat([ids, pick(out.logits[:, -1], temperature, top_k, generator)[:, None]], dim=1)
    return Generation(ids, None, prefill_s, *clock.figures())


def load(model_dir: str | Path, predictor_file: str | Path, init_file: str | Path | None):
    """(LM, Router, tokenizer) from a model directory (with its tokenizer), a saved predictor and,
    for routers that read geometric features, the init stage's file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lookahead.graph.predictor import load_init, load_predictor
    from lookahead.graph.scoring import GeoLookup

    if not (Path(model_dir) / "config.json").is_file():
        raise GenerateError(f"no model at {model_dir} (run `dvc repro phase2`, or pass --model)")
    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    predictor, _ = load_predictor(predictor_file)
    geo = None
    if predictor.geo_dim:
        if init_file is None:
            raise GenerateError("this router reads the init stage's geometric features: pass --init")
        tensors, _ = load_init(init_file)
        geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float())
    return lm, Router(predictor, lm, geo), tokenizer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/phase2/lm", help="LM directory with its tokenizer")
    parser.add_argument("--predictor", default="models/phase2/predictor.safetensors", help="head-gate router")
    parser.add_argument("--init", default="models/init/init.safetensors", help="geometric features (if read)")
    parser.add_argument("--prompt", default="the", help="text to continue")
    parser.add_argument("--batch", type=int, default=1, help="copies of the prompt generated side by side")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--top-k", type=int, default=0, help="sample among the k most likely (0: all)")
    parser.add_argument("--skip", choices=["full", "query"], help="default: the one the router was trained under")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="decode with compiled steps, routed and stock alike (default: where it pays: on CUDA, "
                             f"and on CPU from {COMPILE_PAYS_FROM} new tokens)")
    parser.add_argument("--attention", choices=flex.BACKENDS, default=flex.ATTENTION,
                        help="the plan's attention kernels: auto (FlexAttention where it pays), flex, sdpa")
    args = parser.parse_args(argv)
    try:
        flex.set_backend(args.attention)
        from lookahead.graph.predictor import load_predictor
        from lookahead.graph.runtime import recorded_skip

        lm, router, tokenizer = load(args.model, args.predictor, args.init)
        skip = args.skip or recorded_skip(load_predictor(args.predictor)[1])
        prompt = torch.tensor([tokenizer(args.prompt)["input_ids"]] * args.batch)
        runs = {}
        for name in ("routed", "dense"):
            gen = torch.Generator().manual_seed(args.seed)
            runs[name] = (generate(lm, router, prompt, args.max_new_tokens, skip, args.temperature, args.top_k, gen,
                                   compile=args.compile)
                          if name == "routed" else
                          generate_dense(lm, prompt, args.max_new_tokens, args.temperature, args.top_k, gen,
                                         compile=args.compile))
    except (LookaheadError, OSError) as exc:
        raise SystemExit(f"error: {exc}") from None
    p = prompt.shape[1]
    routed = runs["routed"]
    active = routed.gates[..., 1:].float().mean().item()
    for name, run in runs.items():
        print(f"[{name}] {tokenizer.decode(run.ids[0].tolist())!r}")
    print(json.dumps({"skip": skip, "prompt_tokens": p, "new_tokens": args.max_new_tokens, "batch": args.batch,
                      "active_head_fraction": round(active, 4),
                      **{f"{name}_decode_tokens_per_s": round(run.tokens_per_s(p), 1) for name, run in runs.items()},
                      "routed_over_dense": round(routed.tokens_per_s(p) / runs["dense"].tokens_per_s(p), 3),
                      "compiled": compile_wanted(args.compile, prompt.device, args.max_new_tokens),
                      **{f"{name}_compile_s": round(run.compile_s, 2) for name, run in runs.items()},
                      "attention": args.attention, "flex_compile_s": round(flex.stats()["compile_s"], 2)}))


if __name__ == "__main__":
    main()
