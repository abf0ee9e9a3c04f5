"""The results page's research findings (:mod:`lookahead.tools.results` assembles the page): one
section per finding, each a table of comparisons judged by the rules of :mod:`lookahead.tools.verdicts`,
and the README's summary lines."""

from __future__ import annotations

import json
from pathlib import Path

from lookahead.tools.scaling_page import pending_shapes
from lookahead.tools.verdicts import (COMPARISON, Figures, claim_row, claim_verdict, interval_cell, mean_row, nll_table, num,
                                      scored_on, table, table_rows, versus_row)

HEAD_SCALING = Path("metrics/head_scaling_report.json")
BASES = Path("metrics/bases_report.json")


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


def head_scaling_section(path: Path, default_window_set: str | None = None) -> list[str]:
    """The head-scaling study's points (``metrics/head_scaling_report.json``, scripts/head_scaling.py): each
    claim with its 95 % interval at every shape, and the slope over the heads-per-layer leg where the points
    keep per-window NLLs; where the study was
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
        return interval_cell(row.get(key), row.get(f"{key}_ci_low"), row.get(f"{key}_ci_high"))

    rows = [(f"{r['n_layers']} × {r['n_heads']}", str(r["heads"]), r["oracle"], *(cell(r, k) for k in keys))
            for r in study["points"]]
    # the slope over the heads-per-layer leg, where the points keep per-window NLLs
    slopes = {name: f["slope_per_doubling"] for name, f in study.get("fits", {}).items() if f.get("slope_per_doubling")}
    if slopes:
        rows.append(("slope per doubling of heads, 4 × 4 → 4 × 16", "", "",
                     *(interval_cell(s["estimate"], s["ci_low"], s["ci_high"]) if (s := slopes.get(k)) else "–"
                       for k in keys)))
    out = ["## Head scaling: 16 heads toward 256", "",
           f"The research chain at each model shape (`{HEAD_SCALING}`, written by `make head-scaling`; what each point "
           "changes, the stage times and the reading: [head scaling](research/head-scaling.md)). Half of the "
           "heads off; means over 3 seeds with their 95 % intervals (windows and seeds combined), every point "
           "on the same test windows (the default's corpus and tokenizer); no value past the largest point."
           + (" The last row: the slope per doubling of heads over the heads-per-layer leg, from window bootstrap "
              "resamples shared by the points, Student's t, the between-base spread added to every point."
              if slopes else "")
           + (f" Not yet rescored under these rules, so not shown: {pending}." if (pending := pending_shapes(study)) else ""),
           "",
           scored, ""]
    return out + table(("shape", "heads", "oracle", "phase 1: deployed − static", "at equal MACs", "greedy capture",
                        "phase 2 − static control", "phase 2 − dense control"), rows) + [""]


def bases_section(path: Path) -> list[str]:
    """The claims across base LMs (``metrics/bases_report.json``, ``make bases``): each base's own
    figure and interval, the mean over bases with its interval and verdict; each base's LM and times."""
    if not path.is_file():
        return []
    report = json.loads(path.read_text(encoding="utf-8"))
    seeds, count = report["seeds"], report["bases"]
    out = ["## Across base LMs", "",
           "Every interval above is conditional on one base LM (`base.train.seed` 0, the committed run) and on the "
           "choices made from it (rankings, masks, the oracle's targets): a stage's seeds vary its own randomness "
           f"only. `make bases` trains base LMs that differ only in `base.train.seed` and runs every stage for each "
           f"(`{BASES}`; [base variance](research/base-variance.md)). Per base: its run's figure and 95 % interval "
           "(*this base LM*: its seeds and the test windows). Across bases: the mean over bases with a 95 % interval "
           "that adds the spread between bases to the test windows' (Student's t at the Welch–Satterthwaite degrees "
           "of freedom), judged by the same rule." + ("" if count > 1 else " One base so far: no interval across bases."),
           "", scored_on(report["window_set"]), ""]
    rows = []
    for name, row in report["claims"].items():
        across = row.get("across")
        rows.append((f"`{name}`", row["claimed"],
                     *(f"{interval_cell(v['mean'], v['ci_low'], v['ci_high'])}: {v['verdict']}" for v in row["per_base"].values()),
                     interval_cell(across["mean"], across["ci_low"], across["ci_high"]) if across else "–",
                     across["verdict"] if across else "–"))
    out += table(("claim", "claimed", *(f"base seed {s}" for s in seeds), f"across {count} base LMs" if count > 1 else "across base LMs (two or more)", "verdict"), rows)
    if count > 1:
        out += ["", "What each interval across base LMs is made of: the sd of the per-base figures, the test windows' "
                "standard error (the base-averaged per-window differences, resampled jointly), the share of the "
                "interval's variance that comes from the spread between base LMs (sd² / B over se²), and the "
                "Welch–Satterthwaite degrees of freedom:", ""]
        out += table(("claim", "sd between bases", "window se", "between-base share", "df"),
                     [(f"`{name}`", f"{a['sd']:.4f}", f"{a['token_se']:.4f}", f"{a['sd'] ** 2 / count / a['se'] ** 2:.0%}",
                       f"{a['df']:.1f}") for name, a in ((n, r["across"]) for n, r in report["claims"].items())])
    out += ["", "Each base LM: its phase-1 NLLs on the test windows (means over seeds; the run's stage times: "
            "`metrics/bases/seed<s>.json`):", ""]
    out += table(("base seed", "base LM val NLL", "dense", "static pruning", "router as deployed"),
                 [(str(s), num(b.get("base_val_nll")), num(b.get("dense_nll")), num(b.get("static_pruning_nll")),
                   num(b.get("deployed_nll"))) for s, b in report["per_base"].items()])
    return out + [""]


def across_line(report: dict | None) -> str | None:
    """The README's lead line: the claims across base LMs, where at least two bases are committed."""
    if not report or report.get("bases", 0) < 2:
        return None
    parts = []
    for name, what in (("deployed_minus_static_pruning", "router as deployed − static pruning"),
                       ("deployed_minus_static_at_equal_macs", "at the same MACs"),
                       ("deployed_ratio", "its share of static pruning's NLL increase"), ("greedy_capture", "greedy capture"),
                       ("phase2_minus_control", "phase 2 − dense control"),
                       ("phase2_minus_static_control", "phase 2 − static control")):
        across = report["claims"].get(name, {}).get("across")
        if across:
            parts.append(f"{what} {interval_cell(across['mean'], across['ci_low'], across['ci_high'])}: {across['verdict']}")
    return (f"- **Across {report['bases']} base LMs** (every stage rerun on each; test windows; 95 % intervals with the "
            f"spread between base LMs): " + "; ".join(parts) + ".")


def _claim_line(f: Figures, key: str, below: bool, unit: str = " nats") -> str:
    low, high = f.interval(key)
    claimed = "< 0" if below else "> 0"
    return (f"{f.mean(key):+.3f}{unit}, 95 % CI [{low:+.3f}, {high:+.3f}] (this base LM): "
            f"{claim_verdict((low, high), below)} (claimed {claimed})")


def summary(m: dict[str, Figures], runtime: dict | None, bases: dict | None = None) -> list[str]:
    """Five lines for the README, one per finding, each with its verdict and the kind of its interval;
    led by the claims across base LMs where ``bases`` (``metrics/bases_report.json``) has two or more."""
    p, e, d, mod = m["phase1"], m["evaluate"], m["diffusion"], m["modulator"]
    capture = p.show("greedy_capture", 2)
    if p.interval("greedy_capture") is not None:
        capture += " (95 % CI [{:.2f}, {:.2f}], this base LM)".format(*p.interval("greedy_capture"))
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
    lead = across_line(bases)
    return ([lead] if lead else []) + lines


