"""The results page's section on the pretrained LM (lookahead.tools.results_pretrained): rendered from
what `make smollm2-run` commits to metrics/smollm2/, nothing before the run starts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from lookahead.tools.results_pretrained import bits_per_byte, pretrained_line, pretrained_section


def write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_the_section_shows_the_runs_progress_then_its_claims(tmp_path):
    assert pretrained_section(tmp_path) == [] and pretrained_line(tmp_path) is None
    d = tmp_path / "metrics" / "smollm2"
    write(d / "run.json", {"profile": "p", "stages": {"base": {"seconds": 314.0, "calls": 1, "done": True},
                                                       "oracle": {"seconds": 3600.0, "calls": 2, "done": False,
                                                                  "cut_seconds": 1800.0}}})
    write(d / "base.json", {"val_nll": 4.6643})
    write(d / "tokenizer.json", {"val_bytes_per_token": 4.1493})
    page = "\n".join(pretrained_section(tmp_path))
    assert f"{4.6643 / math.log(2) / 4.1493:.3f} bits a byte" in page and bits_per_byte(math.log(2), 1.0) == 1.0
    assert "| `oracle` | 1.00 | 0.50 | started |" in page and "| `base` | 0.09 | 0.00 | done |" in page
    assert "0.50 h of them in calls cut off" in page
    assert "claim" not in page  # no claims before they are collected
    write(d / "headline.json", {"deployed_minus_static_pruning": -0.1})
    write(d / "report.json", {"window_set": "test:32x128:abcdef012345", "claims": {
        "deployed_minus_static_pruning": {"claimed": "below 0", "per_base": {"0": {
            "mean": -0.1, "ci_low": -0.15, "ci_high": -0.05, "verdict": "holds"}}}}})
    page = "\n".join(pretrained_section(tmp_path))
    assert "| `deployed_minus_static_pruning` | below 0 | -0.100 [-0.150, -0.050] | holds |" in page
    assert "test:32x128:abcdef012345" in page
    # README's summary leads with them
    assert pretrained_line(tmp_path).endswith("router as deployed − the strongest static mask -0.100 [-0.150, -0.050]: holds.")


def pareto(path: Path, dense: float, curve: list[tuple[float, float]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = ["kind,step,active_head_fraction,nll"] + [f"static pruning,,{x},{y}" for x, y in curve]
    path.write_text("\n".join(rows + [f"dense,,1.0,{dense}", "predictor (hard),0,0.5,9.0"]) + "\n")


def test_the_research_block_sets_each_claim_on_the_toy_beside_smollm2(tmp_path):
    from lookahead.tools.results_pretrained import (BEGIN, END, at_share, comparison_rows, redundancy_rows,
                                                    render_page)

    m, d = tmp_path / "metrics", tmp_path / "metrics" / "smollm2"
    # the toy: three base LMs' tabulated claims, each stage's own figures on the committed one
    write(m / "bases_report.json", {"bases": 3, "window_set": "test:256x128:aaaaaaaaaaaa", "claims": {
        "deployed_minus_static_pruning": {"claimed": "below 0", "across": {
            "mean": -0.09, "ci_low": -0.10, "ci_high": -0.08, "verdict": "holds"}, "per_base": {}}}})
    for seed, nll in enumerate((4.3, 4.31, 4.29)):
        write(m / "bases" / f"seed{seed}.json", {"headlines": {"base": {"val_nll": nll}}})
    write(m / "tokenizer.json", {"val_bytes_per_token": 3.2})
    write(m / "modulator.json", {"val_nll_change_pct": 1.5, "seeds": 3})
    write(m / "modulator_ci.json", {"val_nll_change_pct_ci_low": 1.2, "val_nll_change_pct_ci_high": 1.8})
    write(m / "probe.json", {"base_contextual_spearman": 0.1})
    write(m / "probe_sd.json", {"base_contextual_spearman_sd": 0.01})
    (tmp_path / "params.yaml").write_text("probe:\n  seeds: [0, 1, 2]\n")
    # SmolLM2: its one LM's claims and stages
    write(d / "report.json", {"window_set": "test:32x128:bbbbbbbbbbbb", "claims": {
        "deployed_minus_static_pruning": {"claimed": "below 0", "per_base": {"0": {
            "mean": 0.2, "ci_low": 0.1, "ci_high": 0.3, "verdict": "fails"}}}}})
    write(d / "base.json", {"val_nll": 4.6643})
    write(d / "tokenizer.json", {"val_bytes_per_token": 4.1493})
    write(d / "modulator.json", {"val_nll_change_pct": 0.2, "seeds": 3})
    write(d / "modulator_ci.json", {"val_nll_change_pct_ci_low": -0.1, "val_nll_change_pct_ci_high": 0.5})

    rows = {r[0].split(" `")[-1].rstrip("`"): r for r in comparison_rows(tmp_path)}
    toy_bpb = [x / math.log(2) / 3.2 for x in (4.3, 4.31, 4.29)]
    assert rows["dense LM: val bits a byte"][2].startswith(f"{sum(toy_bpb) / 3:.3f} ± ")
    assert rows["dense LM: val bits a byte"][4].startswith(f"{4.6643 / math.log(2) / 4.1493:.3f} (4.664 nats")
    assert rows["deployed_minus_static_pruning"][1:] == ("below 0", "-0.090 [-0.100, -0.080]", "holds",
                                                         "+0.200 [+0.100, +0.300]", "fails")
    # a stage's claim against its bar, by its interval: +1.5 % [1.2, 1.8] misses the modulator's +1 %
    assert rows["modulator.val_nll_change_pct"][1:] == ("below 1", "+1.500 [+1.200, +1.800]", "fails",
                                                        "+0.200 [-0.100, +0.500]", "holds")
    # the probe's spread is over probe.seeds (three, from params): t(2) · 0.01 / √3 ≪ 0.1
    assert rows["probe.base_contextual_spearman"][2:4] == ("0.100 ± 0.010 (3)", "holds")
    assert rows["phase2_minus_control"][2:] == ("–", "–", "–", "–")  # not measured: dashes

    # the redundancy curve: the cost over dense at each share off, read linearly between counts
    toy_curve = [(0.0, 8.0), (0.25, 5.0), (0.5, 4.8), (0.75, 4.6), (1.0, 4.4)]
    lm_curve = [(0.0, 9.0), (0.2, 7.0), (0.3, 6.0), (0.4, 5.5), (0.6, 5.0), (0.7, 4.9), (0.8, 4.8), (1.0, 4.7)]
    pareto(m / "phase1_pareto.csv", 4.4, toy_curve)
    pareto(d / "phase1_pareto.csv", 4.7, lm_curve)
    assert at_share(lm_curve, 0.25) == 6.5 and at_share(lm_curve, 0.75) == 4.85
    write(d / "static_baselines_report.json", {"heads": 8, "by_heads_kept": [
        {"heads_kept": k, "selection_nll_importance": 5.0 + (8 - k) * 0.1, "selection_nll_greedy": 5.0 + (8 - k) * 0.05}
        for k in (2, 4, 6, 8)]})
    assert redundancy_rows(tmp_path) == [("25%", "+0.200", f"{4.85 - 4.7:+.3f}", f"{0.1:+.3f}"),
                                         ("50%", "+0.400", f"{5.25 - 4.7:+.3f}", f"{0.2:+.3f}"),
                                         ("75%", "+0.600", f"{6.5 - 4.7:+.3f}", f"{0.3:+.3f}")]

    # the page: its block rewritten in place, the rest kept, the same on a second render
    page = f"# title\n\nprose\n\n{BEGIN}\nstale\n{END}\n\nafter\n"
    once = render_page(tmp_path, page)
    assert once.startswith("# title\n\nprose\n\n") and once.endswith(f"{END}\n\nafter\n") and "stale" not in once
    assert "| 50% | +0.400 |" in once and render_page(tmp_path, once) == once
    with pytest.raises(ValueError, match="no generated block"):
        render_page(tmp_path, "# no markers\n")
