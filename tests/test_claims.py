"""Claims that survive another machine (docs/reproducibility.md): paired intervals, the scoring set, the
base's one-ulp init perturbation and the replicate's helpers."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
import yaml

from lookahead.artifacts.val_scores import ScoresError, ScoringConfig, WindowsConfig, load_scores, paired, save_scores, scoring_windows
from lookahead.core.config import from_dict
from lookahead.core.errors import ConfigError
from lookahead.core.intervals import claim_figures, paired_interval
from lookahead.pipeline.base import BaseConfig, perturb_ulp
from lookahead.tools.replicate import downstream_stages, set_perturbation


def test_one_seed_of_independent_windows_gives_the_normal_interval_of_a_mean():
    # i.i.d. window means: the block bootstrap's se is the closed form sd / sqrt(W) within sampling error
    rng = np.random.default_rng(0)
    window, n = 8, 400
    diffs = np.repeat(rng.normal(0.05, 0.4, n), window)  # constant within a window: fully correlated blocks
    out = paired_interval(diffs, window, resamples=4000)
    closed = diffs.reshape(-1, window).mean(1).std(ddof=1) / math.sqrt(n)
    assert out["mean"] == pytest.approx(diffs.mean()) and out["seeds"] == 1 and out["sd"] == 0.0
    assert out["token_se"] == pytest.approx(closed, rel=0.05) and out["se"] == out["token_se"]
    # the per-token se pretends the 8 copies are independent: sqrt(8) too small
    assert out["naive_token_se"] == pytest.approx(closed / math.sqrt(window), rel=0.05)
    assert out["ci_high"] - out["mean"] == pytest.approx(1.959964 * out["se"]) and out["ci_low"] < out["mean"]


def test_the_seeds_add_their_spread_to_the_interval():
    window = 4
    base = np.random.default_rng(1).normal(0.0, 0.1, 64)
    diffs = np.stack([base + shift for shift in (0.01, 0.02, 0.06)])  # the seeds shift every position alike
    out = paired_interval(diffs, window, resamples=1000)
    per_seed = diffs.mean(1)
    assert out["sd"] == pytest.approx(per_seed.std(ddof=1)) and out["mean"] == pytest.approx(per_seed.mean())
    tokens_only = paired_interval(diffs.mean(0), window, resamples=1000)["token_se"]
    assert out["token_se"] == pytest.approx(tokens_only)  # the bootstrap resamples the seed-averaged windows
    assert out["se"] == pytest.approx(math.sqrt(tokens_only ** 2 + out["sd"] ** 2 / 3))
    assert paired_interval(diffs, window, resamples=1000) == out  # seeded: the same interval every time
    figures = claim_figures("gap", out)
    assert figures == {"gap": out["mean"], "gap_sd": out["sd"], "gap_se": out["se"], "gap_ci_low": out["ci_low"],
                       "gap_ci_high": out["ci_high"]}


def test_an_interval_refuses_ragged_or_diverged_differences():
    with pytest.raises(ValueError, match="multiple of the window"):
        paired_interval(np.zeros(10), 4)
    with pytest.raises(ValueError, match="NaN"):
        paired_interval(np.array([0.0, np.nan, 0.0, 0.0]), 2)


def test_scores_pair_seed_by_seed_position_by_position(tmp_path):
    a, b = np.arange(12.0).reshape(3, 4), np.ones(4)
    save_scores(tmp_path / "s.safetensors", {"a": a, "b": b})
    loaded = load_scores(tmp_path / "s.safetensors")
    np.testing.assert_array_equal(paired(loaded["a"], loaded["b"], "a − b"), a - 1)  # one deterministic b
    with pytest.raises(ScoresError, match="do not pair"):
        paired(a, np.ones((2, 4)), "a − b")
    with pytest.raises(ScoresError, match="do not pair"):
        paired(a, np.ones(5), "a − b")
    with pytest.raises(ScoresError, match="rerun `dvc repro`"):
        load_scores(tmp_path / "missing.safetensors")


NO_CACHE = np.zeros((0, 10), dtype=np.int64)
"""A context cache without val windows, for streams no cache was drawn from."""


def test_scoring_windows_are_a_seeded_choice_of_non_overlapping_val_windows(tmp_path):
    stream = np.arange(1000, dtype=np.int32) % 997
    np.save(tmp_path / "val.npy", stream)
    cfg = ScoringConfig(roles=WindowsConfig(per_role=20, seed=3))
    windows = scoring_windows(tmp_path, cfg, context_length=9, cache=NO_CACHE)  # windows of 10 tokens, every 9: 111
    assert windows.shape == (20, 10) and windows.dtype == torch.int64
    starts = windows[:, 0].numpy()
    assert (np.diff(starts) >= 9).all() and (starts % 9 == 0).all()  # in stream order, no target scored twice
    assert all(np.array_equal(w.numpy(), stream[s : s + 10]) for w, s in zip(windows, starts))
    assert torch.equal(windows, scoring_windows(tmp_path, cfg, 9, cache=NO_CACHE))
    other = ScoringConfig(roles=WindowsConfig(per_role=20, seed=4))
    assert not torch.equal(windows, scoring_windows(tmp_path, other, 9, cache=NO_CACHE))
    # the bootstrap's seed is its own: another one redraws intervals, never windows
    redrawn = ScoringConfig(roles=WindowsConfig(per_role=20, seed=3), bootstrap_seed=7)
    assert torch.equal(windows, scoring_windows(tmp_path, redrawn, 9, cache=NO_CACHE))
    with pytest.raises(ConfigError, match="windows.per_role.*only 111"):
        scoring_windows(tmp_path, ScoringConfig(roles=WindowsConfig(per_role=112)), 9, cache=NO_CACHE)
    with pytest.raises(ScoresError, match="apart from the context cache"):  # the test set is never chosen without it
        scoring_windows(tmp_path, cfg, 9)


def test_the_init_perturbation_moves_a_seeded_share_by_exactly_one_ulp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.Linear(200, 100))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    moved = perturb_ulp(model, 1e-3, seed=5)
    changed = 0
    for name, value in model.state_dict().items():
        old, diff = before[name], value != before[name]
        up = torch.nextafter(old, torch.full_like(old, math.inf))
        down = torch.nextafter(old, torch.full_like(old, -math.inf))
        assert ((value == up) | (value == down))[diff].all(), name  # one ulp, either way
        changed += int(diff.sum())
    total = sum(v.numel() for v in before.values())
    assert changed == moved and abs(moved - 1e-3 * total) < 4 * math.sqrt(1e-3 * total)  # ~80 of 80 300
    again = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.Linear(200, 100))
    again.load_state_dict(before)
    assert perturb_ulp(again, 1e-3, seed=5) == moved
    assert all(torch.equal(again.state_dict()[k], v) for k, v in model.state_dict().items())  # seeded
    state = torch.random.get_rng_state()
    assert perturb_ulp(again, 0.0, seed=5) == 0 and torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(again.state_dict()[k], v) for k, v in model.state_dict().items())  # 0: untouched
    with pytest.raises(ConfigError, match="init_perturbation"):
        from_dict(BaseConfig, {"init_perturbation": 1.0})


def test_the_replicate_sets_only_the_base_perturbation(repo_root):
    text = (repo_root / "params.yaml").read_text()
    changed = set_perturbation(text, 1e-4)
    old, new = yaml.safe_load(text), yaml.safe_load(changed)
    assert new["base"]["init_perturbation"] == 1e-4 and old["base"]["init_perturbation"] == 0.0
    new["base"]["init_perturbation"] = 0.0
    assert new == old and changed.count("\n") == text.count("\n")  # comments and layout kept
    assert yaml.safe_load(set_perturbation(text, 1e-7))["base"]["init_perturbation"] == 1e-7  # a float, not "1e-07"


def test_the_replicate_reruns_what_the_base_feeds():
    lock = {"stages": {
        "tokenizer": {"deps": [{"path": "data/corpus"}], "outs": [{"path": "models/tokenizer"}]},
        "base": {"deps": [{"path": "models/tokenizer"}], "outs": [{"path": "models/base"}, {"path": "metrics/base.json"}]},
        "wordnet": {"deps": [{"path": "models/tokenizer"}], "outs": [{"path": "data/wordnet"}]},
        "probe": {"deps": [{"path": "models/base"}, {"path": "data/wordnet"}], "outs": [{"path": "data/probe"}]},
        "init": {"deps": [{"path": "data/probe/heads.safetensors"}], "outs": [{"path": "models/init"}]},
        "contexts": {"deps": [{"path": "data/corpus"}], "outs": [{"path": "data/contexts"}]},
        "basement": {"deps": [{"path": "models/based"}], "outs": [{"path": "x"}]},  # a prefix is not a path
    }}
    assert downstream_stages(lock) == {"base", "probe", "init"}


TOY_DVC = """stages:
  corpus:
    cmd: {py} -c "import random; open('data/corpus.txt', 'w').write(str(random.random()))"
    deps:
      - seed.txt
    outs:
      - data/corpus.txt
  base:
    cmd: {py} make_base.py
    deps:
      - data/corpus.txt
      - make_base.py
    params:
      - base
    outs:
      - data/base.txt
    metrics:
      - metrics/base.json:
          cache: false
  evaluate:
    cmd: {py} make_evaluate.py
    deps:
      - data/base.txt
      - data/corpus.txt
      - make_evaluate.py
    metrics:
      - metrics/evaluate.json:
          cache: false
"""
TOY_BASE = """import json, yaml
p = yaml.safe_load(open("params.yaml"))["base"]["init_perturbation"]
open("data/base.txt", "w").write(str(p))
json.dump({"val_nll": 4.0 + p}, open("metrics/base.json", "w"))
"""
# the claim moves with the perturbation: -0.009 at 0, +0.091 at 1e-4 (its sign flips)
TOY_EVALUATE = """import json
p, corpus = float(open("data/base.txt").read()), float(open("data/corpus.txt").read())
gap = -0.009 + 1000 * p
json.dump({"corpus": corpus, "gap": gap, "gap_sd": 0.001, "gap_ci_low": gap - 0.003, "gap_ci_high": gap + 0.003},
          open("metrics/evaluate.json", "w"))
"""


@pytest.mark.slow
def test_the_replicate_reruns_from_the_base_in_a_scratch_copy_and_judges_every_claim(tmp_path, capsys):
    import subprocess
    import sys

    from lookahead.tools.replicate import main as replicate_main

    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    (repo / "metrics").mkdir()
    (repo / "dvc.yaml").write_text(TOY_DVC.format(py=sys.executable))
    (repo / "seed.txt").write_text("0\n")
    (repo / "make_base.py").write_text(TOY_BASE)
    (repo / "make_evaluate.py").write_text(TOY_EVALUATE)
    (repo / "params.yaml").write_text("base:\n  eval_tokens: 10\n  init_perturbation: 0.0  # a comment\n  arch:\n    n: 1\n")
    git = ["git", "-c", "user.email=t@e", "-c", "user.name=t"]
    dvc = [sys.executable, "-m", "dvc"]
    for cmd in (["git", "init", "-q"], [*dvc, "init", "-q"], [*dvc, "repro", "-q"], ["git", "add", "-A"],
                [*git, "commit", "-qm", "run"]):
        subprocess.run(cmd, cwd=repo, check=True, capture_output=True)
    def files():  # the workspace, less git's and DVC's own state (`dvc status` takes DVC's lock)
        return {p: p.read_bytes() for p in repo.rglob("*")
                if p.is_file() and ".git" not in p.parts and "tmp" not in p.relative_to(repo).parts[:2]}

    before = files()
    scratch = tmp_path / "scratch"
    report = tmp_path / "replicate.md"
    code = replicate_main(["--repo", str(repo), "--workdir", str(scratch), "--report", str(report)])
    out = capsys.readouterr().out
    assert code == 1  # the toy's claim flips its sign in the replicate
    assert "SIGN FLIPPED" in out and "claims agreeing in verdict, sign and interval: 0 of 1 (failed: evaluate.gap)" in out
    assert "the stages base, evaluate rerun with `base.init_perturbation: 0.0001`" in out
    assert out == report.read_text() + "\n"  # the report is the table printed
    assert not scratch.exists()  # removed at the end
    assert files() == before  # nothing in the workspace written
    # the corpus was copied, not rerun (its random draw is the same); the claim was judged by its interval
    assert "evaluate.corpus" in out and re.search(r"evaluate\.corpus\s+(\S+)\s+\1\s+0\s", out)
    # an incomplete run is refused before any work
    (repo / "make_evaluate.py").write_text(TOY_EVALUATE + "\n")
    assert replicate_main(["--repo", str(repo)]) == 2
    assert "run `dvc repro` first" in capsys.readouterr().err


def test_phase2_claims_pair_the_router_as_deployed_and_say_matches_only_when_the_interval_holds_0(tmp_path):
    from lookahead.pipeline.evaluate.claims import trained_claims, verdict

    assert verdict({"ci_low": -0.01, "ci_high": 0.02}) == "matches"
    assert verdict({"ci_low": 0.001, "ci_high": 0.02}) == "above" and verdict({"ci_low": -0.03, "ci_high": -0.001}) == "below"
    rng = np.random.default_rng(3)
    control = rng.normal(4.0, 0.5, (3, 64))
    hard, deployed = control + 0.05, control + 0.002 * rng.standard_normal((3, 64))
    save_scores(tmp_path / "p2.safetensors", {"dense": control, "hard": hard, "deployed": deployed})
    save_scores(tmp_path / "c.safetensors", {"dense": control})
    save_scores(tmp_path / "s.safetensors", {"dense": control, "hard": control - 0.1})
    figures, report = trained_claims(ScoringConfig(resamples=200), 8, tmp_path / "p2.safetensors",
                                     tmp_path / "c.safetensors", tmp_path / "s.safetensors")
    assert report["phase2_scored_as"] == "deployed"
    assert figures["phase2_minus_control"] == pytest.approx((deployed - control).mean(), abs=1e-6)  # not the dense-state NLL
    assert report["phase2_minus_control"]["verdict"] == "matches"
    assert report["phase2_minus_static_control"]["verdict"] == "above"
    assert figures["phase2_hard_nll"] == pytest.approx(hard.mean(), rel=1e-6)
    save_scores(tmp_path / "p2.safetensors", {"dense": control, "hard": hard})  # a router that cannot run deployed
    figures, report = trained_claims(ScoringConfig(resamples=200), 8, tmp_path / "p2.safetensors",
                                     tmp_path / "c.safetensors", tmp_path / "s.safetensors")
    assert report["phase2_scored_as"] == "dense states" and figures["phase2_minus_control"] == pytest.approx(0.05, abs=1e-5)
    assert report["phase2_minus_control"]["verdict"] == "above"


def test_the_interval_quantile_is_student_t_at_the_welch_satterthwaite_degrees_of_freedom():
    from lookahead.core.intervals import combined_interval, quantile

    assert quantile(0.0, 0.3, 3)[0] == pytest.approx(4.302653, abs=1e-5)  # t(0.975, 2): the seeds alone
    assert quantile(0.1, 0.0, 3) == (pytest.approx(1.959964, abs=1e-6), math.inf)  # the windows alone: normal
    # both: df = se⁴ / ((sd² / S)² / (S − 1)); se² = 0.01 + 0.09 / 3 = 0.04, df = 0.0016 / (0.0009 / 2) = 3.556
    q, df = quantile(0.1, 0.3, 3)
    assert df == pytest.approx(0.04 ** 2 / ((0.09 / 3) ** 2 / 2))
    from scipy import stats
    assert q == pytest.approx(stats.t.ppf(0.975, df))
    out = combined_interval(1.0, 0.1, 0.3, 3)
    assert out["se"] == pytest.approx(0.2) and out["ci_high"] - 1.0 == pytest.approx(q * 0.2)


def test_a_ratio_of_sums_gets_its_window_bootstrap_and_seed_spread():
    from lookahead.core.intervals import ratio_interval

    rng = np.random.default_rng(5)
    den = rng.uniform(0.5, 1.5, (1, 64))
    exact = ratio_interval(2 * den, den, 8, resamples=200)  # the same ratio in every window: no spread at all
    assert exact["mean"] == pytest.approx(2.0) and exact["token_se"] == pytest.approx(0.0, abs=1e-12)
    num = np.stack([den[0] * r + rng.normal(0, 0.2, 64) for r in (0.4, 0.5, 0.6)])  # (3, 64): three seeds
    out = ratio_interval(num, den, 8, resamples=2000)
    per_seed = num.sum(1) / den.sum(1)
    assert out["mean"] == pytest.approx(per_seed.mean()) and out["sd"] == pytest.approx(per_seed.std(ddof=1))
    # the delta method's standard error of a ratio of window sums, computed apart from the bootstrap
    n_w, d_w = num.mean(0).reshape(8, 8).sum(1), den[0].reshape(8, 8).sum(1)
    r = n_w.sum() / d_w.sum()
    delta = math.sqrt(((n_w - r * d_w) ** 2).sum() / (7 * 8)) * 8 / d_w.sum()
    assert out["token_se"] == pytest.approx(delta, rel=0.25)
    assert out["ci_low"] < out["mean"] < out["ci_high"]


def test_the_four_roles_are_disjoint_and_no_test_window_borders_another_role(tmp_path):
    from lookahead.artifacts.val_scores import check_disjoint, scoring_spans, window_roles

    stream = np.arange(3000, dtype=np.int32) % 2999  # 333 windows of 10 tokens, every 9
    np.save(tmp_path / "val.npy", stream)
    every = torch.from_numpy(stream[: 333 * 9 + 1].astype(np.int64)).unfold(0, 10, 9)
    cache = every[np.sort(np.random.default_rng(5).choice(333, 12, replace=False))].numpy()
    roles = WindowsConfig(per_role=20, seed=3)
    got = {r: scoring_windows(tmp_path, ScoringConfig(roles=roles), 9, r, cache) for r in ("fit", "selection", "test")}
    index = {r: set((w[:, 0] // 9).tolist()) for r, w in got.items()} | {"cache": set((cache[:, 0] // 9).tolist())}
    assert all(len(index[r]) == 20 for r in ("fit", "selection", "test")) and len(index["cache"]) == 12
    names = list(index)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not index[a] & index[b] or {a, b} == {"fit", "cache"} or {a, b} == {"selection", "cache"}, (a, b)
    others = index["fit"] | index["selection"] | index["cache"]
    assert not {t + d for t in index["test"] for d in (-1, 0, 1)} & others  # not in, not adjacent to, another role
    # fit and selection are the old test and selection sets: the windows nothing was chosen on are the new test set
    old = window_roles(333, roles)
    assert np.array_equal(old["fit"], np.sort(np.random.default_rng([3, 42]).choice(333, 20, replace=False)))
    assert torch.equal(got["selection"], scoring_windows(tmp_path, ScoringConfig(roles=roles, set="selection"), 9))
    spans = {r: scoring_spans(tmp_path, ScoringConfig(roles=roles), 9, r, cache) for r in ("fit", "selection", "test")}
    assert [a for _, a, _ in spans["test"]] == got["test"][:, 0].tolist()
    check_disjoint({"fit": spans["fit"], "selection": spans["selection"]}, spans["test"])  # not one token shared
    with pytest.raises(ScoresError, match=r"the test set itself read val tokens .* \(val window \d+: tokens"):
        check_disjoint({"the test set itself": spans["test"][:1]}, spans["test"])
    with pytest.raises(ConfigError, match="set: must be one of test, selection"):
        ScoringConfig(set="validation")
    with pytest.raises(ConfigError, match="windows.per_role.*only 333 non-overlapping windows"):
        scoring_windows(tmp_path, ScoringConfig(roles=WindowsConfig(per_role=170)), 9, "fit")
    with pytest.raises(ConfigError, match="windows.per_role.*only \\d+ of the val stream's 333 windows"):
        scoring_windows(tmp_path, ScoringConfig(roles=WindowsConfig(per_role=110)), 9, cache=cache)


def test_a_scoring_stage_refuses_a_choice_that_read_a_test_window(tmp_path):
    from lookahead.artifacts.val_scores import refuse_choices_on_test, scoring_spans

    np.save(tmp_path / "val.npy", np.arange(3000, dtype=np.int32) % 2999)

    class Cache:  # the context cache's val windows: three of the stream's
        context_length = 9

        def windows(self, split):
            return np.stack([np.arange(3000, dtype=np.int64)[i * 9 : i * 9 + 10] % 2999 for i in (4, 50, 200)])

    cfg = ScoringConfig(roles=WindowsConfig(per_role=20, seed=3))
    fit = scoring_spans(tmp_path, cfg, 9, "fit")
    refuse_choices_on_test(cfg, tmp_path, Cache(), {"static_baselines (fit windows)": fit})
    test = scoring_spans(tmp_path, cfg, 9, "test", Cache())
    leaked = ("val", test[3][1] + 2, test[3][1] + 5)  # a chooser that read three tokens of a test window
    with pytest.raises(ScoresError, match=rf"static_baselines \(fit windows\) read val tokens .* \(val window "
                                          rf"{test[3][1] // 9}: tokens"):
        refuse_choices_on_test(cfg, tmp_path, Cache(), {"static_baselines (fit windows)": fit + [leaked]})
    # scoring the selection set is what choosing is for: nothing to refuse
    refuse_choices_on_test(ScoringConfig(roles=cfg.roles, set="selection"), tmp_path, Cache(),
                           {"static_baselines (fit windows)": fit + [leaked]})


def test_score_files_record_their_windows_and_refuse_to_pair_other_windows(tmp_path):
    from lookahead.core.windows import set_label

    windows = torch.arange(40).view(4, 10)
    label = set_label("test", windows)
    assert label.startswith("test:4x9:") and label != set_label("test", windows + 1)
    save_scores(tmp_path / "a.safetensors", {"hard": np.ones((2, 36))}, label)
    save_scores(tmp_path / "b.safetensors", {"hard": np.zeros((2, 36))}, set_label("selection", windows + 1))
    a, b = load_scores(tmp_path / "a.safetensors"), load_scores(tmp_path / "b.safetensors")
    assert a.window_set == label and np.array_equal(a["hard"], np.ones((2, 36)))
    np.testing.assert_array_equal(paired(a["hard"], a["hard"], "a − a", (a.window_set, a.window_set)), 0.0)
    with pytest.raises(ScoresError, match="different windows"):
        paired(a["hard"], b["hard"], "a − b", (a.window_set, b.window_set))


def test_head_importance_reads_no_scoring_window_and_the_check_catches_one_that_does(tmp_path, monkeypatch):
    from lookahead.artifacts.val_scores import check_disjoint, scoring_spans
    from lookahead.pipeline.probe import build as probe

    rng = np.random.default_rng(0)
    for split, n in (("train", 20000), ("val", 4000)):
        np.save(tmp_path / f"{split}.npy", rng.integers(0, 100, n).astype(np.int32))
    cfg, scoring = probe.ProbeConfig(head_window=32, head_batches=2, head_batch_size=8), ScoringConfig(roles=WindowsConfig(per_role=12))
    scored = [span for role in ("fit", "selection", "test")
              for span in scoring_spans(tmp_path, scoring, 32, role, np.zeros((0, 33), dtype=np.int64))]
    chosen = probe.importance_spans(cfg, tmp_path, 32)
    assert len(chosen) == len(cfg.seeds) * 2 * 8 and {s for s, _, _ in chosen} == {"train"}
    check_disjoint({"head importance": chosen}, scored)
    monkeypatch.setattr(probe, "IMPORTANCE_SPLIT", "val")  # importance drawn from the val stream, as it once was
    with pytest.raises(ScoresError, match="head importance read val tokens .* overlap the scoring windows"):
        check_disjoint({"head importance": probe.importance_spans(cfg, tmp_path, 32)}, scored)


def test_random_heads_keep_exactly_k_per_position():
    from lookahead.graph.nodes import random_topology

    gen = torch.Generator().manual_seed(0)
    _, gates = random_topology(4, 4, 0.5, (10, 200), gen, exact=True)
    assert (gates[..., 0] == 1).all() and (gates[..., 1:].sum(-1) == 8).all()
    share = gates[..., 1:].mean(dim=(0, 1))  # each head on at about half the positions (2 000 of them)
    assert 0.45 < share.min() and share.max() < 0.55
    _, bernoulli = random_topology(4, 4, 0.5, (3, 50), torch.Generator().manual_seed(0))
    assert bernoulli[..., 1:].sum(-1).float().std() > 0  # the Bernoulli draw's count varies
