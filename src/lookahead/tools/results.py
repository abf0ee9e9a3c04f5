"""The results page, rendered from the committed metrics: ``make results`` writes ``docs/results.md``.

    python -m lookahead.tools.results                # (re)write docs/results.md and README.md's summary
    python -m lookahead.tools.results --check        # exit 1 where either differs from a fresh render

Every figure on the page is read from a file in git that the pipeline or a benchmark wrote: the
stages' headlines (``metrics/<stage>.json`` with their spreads and intervals,
:func:`lookahead.core.report.read_headline`), evaluate's rows (``metrics/evaluate_pareto.csv``) and
the runtime benchmark's JSON line kept in ``benchmarks/results/runtime.json``. Nothing else in the
docs quotes a current figure: they link here, but for README.md's five-line summary, rendered from
the same files between two markers (:data:`BEGIN`, :data:`END`). A test renders both afresh and
compares them with the committed ones, so a change of metrics without the page fails CI.

Each finding is a table of comparisons: the figure (mean ± sd over its stage's seeds), the figure it
is judged against, and a verdict by a rule stated beside the table:

- a paired difference with its 95 % interval (:mod:`lookahead.core.intervals`) *holds* where the
  interval lies on the claimed side of the reference, *fails* where it lies on the other side, and is
  *unresolved* where it straddles it;
- a mean against a fixed reference, or against another mean, is judged by its 95 % interval: the
  stage's own (``_ci_low``/``_ci_high``: windows and seeds combined, :mod:`lookahead.core.intervals`)
  where it has one, else Student's t over its seeds (sd / √seeds, t with seeds − 1 degrees of
  freedom; the two spreads combined for two means): it *holds* where the interval lies on the
  claimed side (below or above), *fails* where it lies on the other, and is *within noise* otherwise;
- a speed is judged by the share of its FLOP ideal it reaches.

Every table is scored on one set of windows, named under it (the headline's ``window_set``,
:func:`lookahead.core.windows.set_label`): :func:`lookahead.tools.verdicts.scored_on` refuses a table whose figures come from
two. ``--check`` compares the page with a render of the same revision's metrics (``--rev``, default
the working tree), so that a rerun on another machine — whose metrics differ in their last bits —
does not make the committed page stale: the docs test checks ``HEAD``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from lookahead.core.atomic import atomic_file
from lookahead.core.report import read_headline
from lookahead.tools.verdicts import (COMPARISON, Figures, claim_row, claim_verdict, mean_row, nll_table, scored_on, table,
                                      table_rows, versus_row)

PAGE = Path("docs/results.md")
RUNTIME = Path("benchmarks/results/runtime.json")
GPU = Path("benchmarks/results/gpu.json")
PARETO = Path("metrics/evaluate_pareto.csv")
HEAD_SCALING = Path("metrics/head_scaling_report.json")


def phase1_section(m: dict[str, Figures]) -> list[str]:
    p = m["phase1"]
    frac = p.values.get("active_head_fraction")
    mask = p.values.get("static_pruning_mask")
    out = ["## Phase 1: the router against static pruning and the oracles",
           "",
           f"The base LM frozen; the lookahead router picks each token's heads from the context, at "
           f"{frac:.0%} of heads active (`metrics/phase1.json`). Lower NLL is better. The router *as deployed* "
           "reads the routed model's own states (about dense MACs per token, its router included); on a "
           "dense pass's states it also pays a dense forward (about twice dense MACs). Static pruning is the "
           "stronger of two static masks fitted on the *fit* windows — importance ranked there, and a greedy "
           "static mask searched there — the one of lower NLL on the *selection* windows at the router's head count"
           + (f" (here: {mask})" if mask else "") + "; it runs as a pruned model runs (a pruned head has no query, "
           "key, value or output), which is also how its MACs are counted (a kept head attends every key).", "",
           scored_on(p.values.get("window_set")), ""]
    out += table(COMPARISON, table_rows(
        claim_row(p, "router as deployed below static pruning at the same head count", "deployed_minus_static_pruning",
                   True, "< 0"),
        claim_row(p, "router as deployed below static pruning at the same MACs per token (static pruning's MACs "
                      "counted as it runs, heads interpolated)", "deployed_minus_static_at_equal_macs", True, "< 0"),
        claim_row(p, "router on a dense pass's states (≈2× dense MACs) below static pruning at the same head count",
                   "router_minus_static_pruning", True, "< 0"),
        mean_row(p, "the router as it runs captures the greedy per-token oracle's gain (interval: windows and seeds)",
                  "greedy_capture", "above", 0.6, "0.6 (the router's target)", digits=2),
        claim_row(p, "the router keeps more of the greedy oracle's heads than the static mask does (recall at K, "
                      "per position)", "oracle_recall_minus_static_recall", False, "> 0"),
    ))
    out += ["", "The NLLs behind it (the same windows):", ""]
    nll = [("dense (every head)", "dense_nll"), ("router, hard gates, a dense pass's states", "hard_nll"),
           ("router, as deployed", "deployed_nll"),
           ("static pruning, the stronger on the selection windows", "static_pruning_nll"),
           ("static pruning: importance ranked on the fit windows", "static_importance_nll"),
           ("static pruning: greedy static mask on the fit windows", "static_greedy_nll"),
           ("random per-token heads (exactly K)", "random_heads_nll"),
           ("leave-one-out oracle (label-free: an oracle, not a method)", "loo_oracle_nll"),
           ("greedy per-token oracle (label-free: an oracle, not a method)", "greedy_oracle_nll")]
    out += nll_table(p, "topology", nll)
    return out


def phase2_section(m: dict[str, Figures]) -> list[str]:
    e = m["evaluate"]
    frac = e.values.get("phase2_active_head_fraction")
    out = ["## Phase 2: the LM trained with its router, against both controls", "",
           f"Phase 2 continues pretraining the LM jointly with its router at {frac:.0%} of heads active; the "
           "dense control continues pretraining the same LM for the same tokens with every head on, the "
           "static control under the stronger static mask at the same fraction (`metrics/evaluate.json`). "
           "Phase 2's seed i starts from phase 1's seed i, so the intervals cover the router's seeds too. "
           "The seed's goal is topologies that *lower* NLL against dense.", "",
           scored_on(e.values.get("window_set")), ""]
    out += table(COMPARISON, table_rows(
        claim_row(e, "phase 2 below the dense control (the seed's goal)", "phase2_minus_control", True, "< 0"),
        claim_row(e, "phase 2 below the static control (per-token routing pays)", "phase2_minus_static_control",
                   True, "< 0"),
    ))
    out += ["", "The NLLs behind it (the same windows):", ""]
    nll = [("base LM, dense", "dense_base_nll"), ("dense control", "dense_control_nll"),
           ("static control", "static_control_nll"), ("phase 1 router on the base LM", "phase1_hard_nll"),
           ("phase 2, hard gates", "phase2_hard_nll")]
    out += nll_table(e, "model", nll)
    if e.has("attention_only_flops_over_dense"):
        out += ["", f"Attention FLOPs alone (not the whole model's MACs, which phase 1's `deployed_macs_over_dense` "
                f"counts) of the routed rows over dense: {e.mean('attention_only_flops_over_dense'):.3f} "
                "(`attention_only_flops_over_dense`, on the context cache's val windows)."]
    return out


def decoders_section(m: dict[str, Figures]) -> list[str]:
    d, e = m["diffusion"], m["evaluate"]
    out = ["## Structure decoders against their nulls", "",
           "Can a decoder reading the context propose the keep sets that are good for a token? The ground "
           "truth is each val position's ε-good keep sets (`metrics/pairs.json`); the decoders are the MLP "
           "router's sampler (`baseline_`), the autoregressive keep-set decoder (`autoregressive_`) and the "
           "diffusion head (`metrics/diffusion.json`). Best of K is chosen without labels (by KL to dense).", "",
           scored_on(d.values.get("window_set")), ""]
    # the paired claims (windows and seeds: lookahead.pipeline.diffusion.judge.decoder_claims) where the
    # run has them; a run from before them, its means against each other over seeds alone
    rows = table_rows(
        claim_row(d, "diffusion head's recall@8 of ε-good sets above the router's sampler's (per position)",
                   "diffusion_minus_baseline_recall_at_8", False, "> 0")
        or versus_row(d, "diffusion head's recall@8 of ε-good sets, against the router's sampler", "recall_at_8",
                      "above", "baseline_recall_at_8"),
        claim_row(d, "autoregressive decoder's recall@8 above the router's sampler's (per position)",
                   "autoregressive_minus_baseline_recall_at_8", False, "> 0")
        or versus_row(d, "autoregressive decoder's recall@8, against the router's sampler", "autoregressive_recall_at_8",
                      "above", "baseline_recall_at_8"),
        claim_row(d, "diffusion best of K (label-free) below frequency-matched random sets' (per position)",
                   "best_of_k_minus_null", True, "< 0")
        or versus_row(d, "diffusion best of K (label-free) against frequency-matched random sets",
                      "best_of_k_label_free_nll", "below", "null_frequency_best_of_k_nll"),
        claim_row(d, "autoregressive best of K (label-free) below the same null (per position)",
                   "autoregressive_best_of_k_minus_null", True, "< 0")
        or versus_row(d, "autoregressive best of K (label-free) against the same null",
                      "autoregressive_best_of_k_label_free_nll", "below", "null_frequency_best_of_k_nll"),
        versus_row(d, "diffusion best of K against random heads' best of K", "best_of_k_nll", "below",
                    "baseline_best_of_k_nll"),
    )
    out += table(COMPARISON, rows)
    if d.has("eps_good_per_position"):
        out += ["", f"ε-good keep sets per val position: {d.mean('eps_good_per_position'):.2f}, two or more at "
                f"{d.mean('eps_good_multi_share'):.1%} of positions (`eps_good_per_position`, `eps_good_multi_share`)."]
    claim = claim_row(e, "diffusion best of K below random best of K (evaluate; both chosen by the label: an oracle, "
                          "not a method)", "diffusion_best_of_k_minus_null", True, "< 0")
    if claim is not None:
        out += ["", "Evaluate's best-of-K claim, on its own windows:", "", scored_on(e.values.get("cache_window_set")), ""]
        out += table(COMPARISON, [claim])
    return out


def modulator_section(m: dict[str, Figures]) -> list[str]:
    mod = m["modulator"]
    kind = mod.values.get("kind")
    out = ["## The geometric modulator against the seed's claim", "",
           f"The seed claims that nudging the residual stream toward each token's WordNet geometry (here the "
           f"`{kind}` modulator, the LM frozen) raises the alignment of the model's representations with WordNet "
           "while NLL stays within +1 % (`metrics/modulator.json`).", "",
           scored_on(mod.values.get("window_set")) + " The alignment figures read WordNet glosses, not windows.", ""]
    out += table(COMPARISON, table_rows(
        mean_row(mod, "NLL change, % (coherence kept)", "val_nll_change_pct", "below", 1.0, "+1 % (the seed's bar)"),
        mean_row(mod, "gloss-level Pearson gain, %", "pearson_gain_pct", "above", 0.0, "0 (no gain)"),
        mean_row(mod, "gloss-level Spearman gain, %", "spearman_gain_pct", "above", 0.0, "0 (no gain)"),
        mean_row(mod, "token-level Spearman gain, %", "token_spearman_gain_pct", "above", 0.0, "0 (no gain)"),
        mean_row(mod, "mean α (how far the stream is pulled)", "alpha_mean", "above", 0.0, "0",
                  digits=4),
    ))
    if "cv_in_band" in mod.values:
        out += ["", f"Pentachoron CV of the gloss encodings after: {mod.mean('cv_ratio_after'):.3f} of a Gaussian's "
                f"(`cv_ratio_after`); inside the seed's band: {'yes' if mod.values['cv_in_band'] else 'no'} (`cv_in_band`)."]
    return out


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


def head_scaling_section(path: Path, default_window_set: str | None = None) -> list[str]:
    """The head-scaling study's points (``metrics/head_scaling_report.json``, scripts/head_scaling.py): each
    claim with its 95 % interval at every shape, and the trend's value at 256 heads; where the study was
    scored on other windows than the default run (``default_window_set``), under which rules."""
    if not path.is_file():
        return []
    study = json.loads(path.read_text(encoding="utf-8"))
    sets = sorted({r.get("window_set") for r in study["points"] if r.get("window_set")})
    if sets and default_window_set and sets != [default_window_set]:
        scored = (f"Scored on: {', '.join(f'`{w}`' for w in sets)} — under earlier rules: the windows that were the "
                  "test set before window roles (now the *fit* set, [reproducibility](reproducibility.md#window-roles)), "
                  "static pruning by the probe's importance on train windows and its MACs counted per token; not "
                  "comparable with the tables above until the points are rescored under this page's rules.")
    else:
        scored = scored_on(*sets)
    keys = ("deployed_minus_static_pruning", "deployed_minus_static_at_equal_macs", "greedy_capture",
            "phase2_minus_static_control", "phase2_minus_control")

    def cell(row: dict, key: str) -> str:
        if row.get(key) is None:
            return "–"
        low, high = row.get(f"{key}_ci_low"), row.get(f"{key}_ci_high")
        return f"{row[key]:+.3f} [{low:+.3f}, {high:+.3f}]" if low is not None else f"{row[key]:+.3f}"

    rows = [(f"{r['n_layers']} × {r['n_heads']}", str(r["heads"]), r["oracle"], *(cell(r, k) for k in keys))
            for r in study["points"]]
    trends = study.get("trend_at_256_heads", {})
    if any(trends.get(k) for k in keys):
        rows.append(("trend at 256 heads", "256", "fit over the points",
                     *(cell({k: t["predicted"], f"{k}_ci_low": t["predicted_ci_low"], f"{k}_ci_high": t["predicted_ci_high"]}, k)
                       if (t := trends.get(k)) else "–" for k in keys)))
    out = ["## Head scaling: 16 heads toward 256", "",
           f"The research chain at each model shape (`{HEAD_SCALING}`, written by `make head-scaling`; what each point "
           "changes, the stage times and the reading: [head scaling](research/head-scaling.md)). Half of the "
           "heads off; means over 3 seeds with their 95 % intervals (windows and seeds combined), every point "
           "on the same test windows (the default's corpus and tokenizer); the trend is a weighted line in log₂(heads) evaluated at 256 heads.", "",
           scored, ""]
    return out + table(("shape", "heads", "oracle", "phase 1: deployed − static", "at equal MACs", "greedy capture",
                        "phase 2 − static control", "phase 2 − dense control"), rows) + [""]


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


BEGIN, END = "<!-- results: begin (make results) -->", "<!-- results: end -->"
"""The README's five-line summary sits between these markers; ``make results`` rewrites it."""


def _claim_line(f: Figures, key: str, below: bool, unit: str = " nats") -> str:
    low, high = f.interval(key)
    claimed = "< 0" if below else "> 0"
    return f"{f.mean(key):+.3f}{unit}, 95 % CI [{low:+.3f}, {high:+.3f}]: {claim_verdict((low, high), below)} (claimed {claimed})"


def summary(m: dict[str, Figures], runtime: dict | None) -> list[str]:
    """Five lines for the README, one per finding, each with its verdict."""
    p, e, d, mod = m["phase1"], m["evaluate"], m["diffusion"], m["modulator"]
    capture = p.show("greedy_capture", 2)
    if p.interval("greedy_capture") is not None:
        capture += " (95 % CI [{:.2f}, {:.2f}])".format(*p.interval("greedy_capture"))
    if p.has("deployed_minus_static_pruning") and p.interval("deployed_minus_static_pruning") is not None:
        first = (f"- **Phase 1** (LM frozen; test windows): the router as deployed − static pruning at the same head "
                 f"count {_claim_line(p, 'deployed_minus_static_pruning', True)}")
        if p.interval("deployed_minus_static_at_equal_macs") is not None:
            first += (f"; at the same MACs per token "
                      f"{_claim_line(p, 'deployed_minus_static_at_equal_macs', True)}")
    else:
        first = (f"- **Phase 1** (LM frozen): router − static pruning at the same head budget "
                 f"{_claim_line(p, 'router_minus_static_pruning', True)}")
    lines = [f"{first}; it captures {capture} of the greedy per-token oracle's gain (`greedy_capture`).",
             f"- **Phase 2** (LM trained with its router): phase 2 − dense control "
             f"{_claim_line(e, 'phase2_minus_control', True)}; phase 2 − static control "
             f"{_claim_line(e, 'phase2_minus_static_control', True)}."]
    if d.has("recall_at_8", "diffusion_minus_baseline_recall_at_8"):
        lines.append(f"- **Decoders**: the diffusion head's recall@8 of the ε-good keep sets {d.show('recall_at_8')}, "
                     f"− the router's sampler's {_claim_line(d, 'diffusion_minus_baseline_recall_at_8', False, '')}; "
                     f"its best of K − random best of K {_claim_line(e, 'diffusion_best_of_k_minus_null', True)}.")
    elif d.has("recall_at_8", "baseline_recall_at_8"):
        lines.append(f"- **Decoders**: the diffusion head's recall@8 of the ε-good keep sets {d.show('recall_at_8')} "
                     f"against the router's sampler's {d.show('baseline_recall_at_8')}; its best of K − random best of K "
                     f"{_claim_line(e, 'diffusion_best_of_k_minus_null', True)}.")
    else:
        lines.append(f"- **Decoders**: diffusion best of K − random best of K "
                     f"{_claim_line(e, 'diffusion_best_of_k_minus_null', True)}.")
    lines.append(f"- **Modulator** (`{mod.values.get('kind')}`): NLL change {mod.show('val_nll_change_pct')} %, gloss-level "
                 f"Spearman gain {mod.show('spearman_gain_pct')} %, token-level {mod.show('token_spearman_gain_pct')} % "
                 "(the seed claims a gain within +1 % NLL).")
    key = "prefill_T2048_query_50off_over_dense"
    if runtime and key in runtime:
        gen = "generate_T2048_query_50off_over_dense"
        line = (f"- **Speed** (per token, 50 % of heads off, T = 2048, {runtime.get('device')}): prefill "
                f"{runtime[key]:.2f}× dense (FLOP ideal {runtime[key + '_ideal']:.2f}), generation "
                f"{runtime[gen]:.2f}× (ideal {runtime[gen + '_ideal']:.2f})")
        compiled = "decode_T2048_B8_{}_50off_over_compiled_stock"
        if compiled.format("full") in runtime:
            line += (f"; compiled decoding, batch 8, over compiled stock decoding: per token `full` "
                     f"{runtime[compiled.format('full')]:.2f}× (ideal {runtime[compiled.format('full') + '_ideal']:.2f}), "
                     f"`query` {runtime[compiled.format('query')]:.2f}× "
                     f"(ideal {runtime[compiled.format('query') + '_ideal']:.2f})")
        lines.append(line + ".")
    return lines


def render_readme(root: Path, readme: str) -> str:
    """``readme`` with its summary block rewritten from the metrics at ``root``."""
    if BEGIN not in readme or END not in readme:
        raise ValueError(f"README.md has no results block ({BEGIN} … {END})")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    block = "\n".join(summary(_stages(root), _runtime(root)))
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def _stages(root: Path) -> dict[str, Figures]:
    return {stage: Figures(stage, read_headline(root / "metrics" / f"{stage}.json"))
            for stage in ("phase1", "evaluate", "diffusion", "modulator")}


def _runtime(root: Path) -> dict | None:
    path = root / RUNTIME
    return json.loads(path.read_text(encoding="utf-8").strip().splitlines()[-1]) if path.is_file() else None


def rows_section(path: Path, label: str | None) -> list[str]:
    """Every evaluate row's val NLL and active-head fraction, from ``metrics/evaluate_pareto.csv``
    (scored on the windows ``label`` names: evaluate's ``cache_window_set``)."""
    import csv

    if not path.is_file():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if not r["row"].startswith("static pruning curve")]
    out = ["## Every row of the final table", "",
           f"Evaluate's rows, the first seed's LMs (`{PARETO}`; the whole table, with edges, per-layer fractions "
           "and attention FLOPs, is `metrics/evaluate_table.md`, a DVC output). Rows marked *label-chosen* pick, at "
           "each position, the best of K samples by the position's own next token: an oracle that no model could "
           "run, not a method (the figures above that compare methods choose without labels).", "",
           scored_on(label), ""]
    chosen = lambda row: " (label-chosen: an oracle)" if "best_of_k" in row else ""  # noqa: E731
    return out + table(("row", "active heads", "val NLL"),
                       [(f"`{r['row']}`{chosen(r['row'])}", f"{float(r['active_head_fraction']):.3f}",
                         f"{float(r['nll']):.3f}") for r in rows]) + [""]


def render(root: Path) -> str:
    """The page for the repository at ``root``."""
    m, runtime = _stages(root), _runtime(root)
    base = read_headline(root / "metrics" / "base.json")
    lines = [
        "# Results",
        "",
        "<!-- Generated by `make results` (lookahead.tools.results) from metrics/ and benchmarks/results/: "
        "do not edit by hand. A test fails when this page differs from a fresh render. -->",
        "",
        "**The question.** Can a small predictor that reads only the context choose, for every token, which "
        "attention heads of a language model run and which feed which, so that the model loses less than "
        "static pruning at the same compute, or even beats the dense model? And does nudging the model's "
        "residual stream toward WordNet geometry make its representations more WordNet-like at no cost in NLL?",
        "",
        f"**The run.** The committed profile (`params.yaml`): a base LM of {base.get('parameters', 0) / 1e6:.1f} M "
        f"parameters pretrained to val NLL {base['val_nll']:.3f} (`metrics/base.json`, one run). The figures below "
        "are means ± sd over each stage's training seeds (their number in brackets); what each stage scores on: "
        "[pipeline](pipeline.md); how far the figures should move on another machine: "
        "[reproducibility](reproducibility.md).",
        "",
        "Verdicts: a paired difference with its 95 % interval *holds* where the interval lies on the claimed "
        "side, *fails* where it lies on the other, and is *unresolved* where it straddles it; a mean against "
        "a reference is judged by its own 95 % interval (windows and seeds combined) where it has one, else by "
        "Student's t over its seeds (sd / √seeds, seeds − 1 degrees of freedom): it *holds* where the interval "
        "lies on the claimed side (below or above), *fails* where it lies on the other, else it is *within noise*. "
        "Every table is scored on one set of windows, named above it: the claims on the *test* set, fresh "
        "windows nothing was chosen on and none borders (static baselines are fitted on the *fit* set, defaults, "
        "variants and the stronger baseline chosen on the *selection* set: "
        "[reproducibility](reproducibility.md#window-roles)).",
        "",
    ]
    for section in (phase1_section(m), phase2_section(m), decoders_section(m), modulator_section(m),
                    speed_section(runtime), decode_section(runtime)):
        lines += section + [""]
    lines += head_scaling_section(root / HEAD_SCALING, m["phase1"].values.get("window_set"))
    lines += gpu_section(root / GPU)
    lines += rows_section(root / PARETO, m["evaluate"].values.get("cache_window_set"))
    return "\n".join(lines)


COMMITTED = ("README.md", str(PAGE), "metrics", str(RUNTIME.parent))
"""What the page is rendered from and compared with, as :func:`at_revision` exports them."""


@contextlib.contextmanager
def at_revision(repo: Path, rev: str, paths: tuple[str, ...] = COMMITTED):
    """A temporary directory holding ``paths`` (files or folders; default :data:`COMMITTED`) as they
    are at git revision ``rev`` of ``repo``."""
    with tempfile.TemporaryDirectory(prefix="results-") as tmp:
        listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "--", *paths], cwd=repo,
                                capture_output=True, text=True, check=True).stdout.split()
        archive = subprocess.run(["git", "archive", "--format=tar", rev, "--", *listed], cwd=repo,
                                 capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        yield Path(tmp)


def check(root: Path) -> list[str]:
    """The files of :data:`COMMITTED` at ``root`` that differ from a fresh render of ``root``'s metrics."""
    readme = root / "README.md"
    fresh = {root / PAGE: render(root), readme: render_readme(root, readme.read_text(encoding="utf-8"))}
    return [str(path.relative_to(root)) for path, text in fresh.items()
            if not path.is_file() or path.read_text(encoding="utf-8") != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=Path("."), help="the repository (default: here)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when docs/results.md or README.md's summary differs from a fresh render")
    parser.add_argument("--rev", default=None,
                        help="with --check: the page and metrics as committed at this git revision (e.g. HEAD: a "
                             "rerun's rewritten metrics are not compared; default: the working tree)")
    args = parser.parse_args(argv)
    if args.check and args.rev:
        with at_revision(args.repo, args.rev) as root:
            stale = check(root)
        if stale:
            print(f"stale at {args.rev}: {', '.join(stale)}: run `make results` and commit", file=sys.stderr)
            return 1
        print(f"{PAGE} and README.md's summary at {args.rev} are a fresh render of its metrics")
        return 0
    readme = args.repo / "README.md"
    try:
        fresh = {args.repo / PAGE: render(args.repo), readme: render_readme(args.repo, readme.read_text(encoding="utf-8"))}
    except FileNotFoundError as err:
        print(f"error (results): {err.filename} is missing: run `dvc repro` (or `dvc pull`) first", file=sys.stderr)
        return 2
    if args.check:
        stale = [str(path.relative_to(args.repo)) for path, text in fresh.items()
                 if not path.is_file() or path.read_text(encoding="utf-8") != text]
        if stale:
            print(f"stale: {', '.join(stale)}: run `make results` and commit", file=sys.stderr)
            return 1
        print(f"{PAGE} and README.md's summary are up to date")
        return 0
    for path, text in fresh.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path) as tmp:
            tmp.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(args.repo)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
