"""`make verify` (lookahead.tools.verify): a run's headline figures against a git revision's (docs/reproducibility.md)."""

from __future__ import annotations

import json
import subprocess

import pytest

from lookahead.tools.verify import main, verify

DVC_YAML = """stages:
  a:
    cmd: echo
    metrics:
      - metrics/a.json:
          cache: false
  b:
    cmd: echo
    metrics:
      - metrics/b.json:
          cache: false
"""
COMMITTED_A = {"ratio": 1.0, "ratio_sd": 0.1, "steps": 100, "encoder": "minilm", "seeds": 3,
               "per_layer": {"l0": 0.5}}


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "metrics").mkdir()
    (tmp_path / "dvc.yaml").write_text(DVC_YAML)
    (tmp_path / "metrics" / "a.json").write_text(json.dumps(COMMITTED_A))
    (tmp_path / "metrics" / "b.json").write_text(json.dumps({"nll": 4.0}))
    (tmp_path / "metrics" / "a_timing.json").write_text(json.dumps({"x_per_s": 1.0}))
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "run"]):
        subprocess.run(cmd, cwd=tmp_path, check=True)
    return tmp_path


def write(repo, name, figures):
    (repo / "metrics" / f"{name}.json").write_text(json.dumps(figures))


def test_a_rerun_on_the_same_bytes_is_within_everywhere(repo, capsys):
    assert main(["--repo", str(repo)]) == 0
    out = capsys.readouterr().out
    assert "0 of 0 claims agree with HEAD in verdict, sign and interval; 1 of 1 research headlines within their spread " \
           "(between base LMs for 0; 3 seed sd, at least 0.5%, for the rest); 4 of 4 other figures within 2%." in out
    assert "a.seeds" not in out and "ratio_sd" not in out  # the spread and the seed count are not figures


def test_a_research_headline_outside_its_spread_fails_and_others_only_report(repo, capsys):
    # within 3 sd (0.3): 1.25; other figures: steps within 2 %, nll 4.5 is 12.5 % away but not research
    write(repo, "a", {**COMMITTED_A, "ratio": 1.25, "ratio_sd": 0.05, "steps": 101})
    write(repo, "b", {"nll": 4.5})
    rows = {r.figure: r for r in verify(repo, "HEAD")}
    assert rows["a.ratio"].difference == pytest.approx(0.25) and rows["a.ratio"].tolerance == pytest.approx(0.3)
    assert rows["a.ratio"].research and rows["a.ratio"].within
    assert rows["a.steps"].within and not rows["a.steps"].research
    assert not rows["b.nll"].within and rows["b.nll"].difference == pytest.approx(0.5)
    assert main(["--repo", str(repo)]) == 0
    assert "outside (not a research headline)" in capsys.readouterr().out

    write(repo, "a", {**COMMITTED_A, "ratio": 1.35, "encoder": "base"})
    rows = {r.figure: r for r in verify(repo, "HEAD")}
    assert not rows["a.ratio"].within and not rows["a.encoder"].within and rows["a.per_layer.l0"].within
    assert main(["--repo", str(repo)]) == 1
    out = capsys.readouterr().out
    assert "OUTSIDE: a.ratio" in out and "0 of 1 research headlines" in out


def test_a_zero_spread_falls_back_to_the_floor(repo):
    write(repo, "a", {**COMMITTED_A, "ratio": 1.004, "ratio_sd": 0.0})
    subprocess.run(["git", "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qam", "sd 0"], cwd=repo, check=True)
    write(repo, "a", {**COMMITTED_A, "ratio": 1.0, "ratio_sd": 0.0})
    (row,) = [r for r in verify(repo, "HEAD") if r.figure == "a.ratio"]
    assert row.tolerance == pytest.approx(0.00502) and row.basis == "0.5%" and row.within
    write(repo, "a", {**COMMITTED_A, "ratio": 0.998, "ratio_sd": 0.0})
    assert main(["--repo", str(repo)]) == 1  # 0.6 % away, no spread to allow it
    write(repo, "a", {**COMMITTED_A, "ratio": 1.0, "ratio_sd": 0.0})
    assert main(["--repo", str(repo), "--rev", "HEAD~1"]) == 0  # against the older revision: no change at all


def test_nothing_to_compare_is_an_error(tmp_path, capsys):
    (tmp_path / "dvc.yaml").write_text(DVC_YAML)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    assert main(["--repo", str(tmp_path)]) == 2
    assert "no metrics/<stage>.json" in capsys.readouterr().err


def claim(value, low, high, sd=0.001):
    return {"gap": value, "gap_sd": sd, "gap_se": (high - low) / 3.92, "gap_ci_low": low, "gap_ci_high": high}


def test_a_claim_is_judged_by_its_interval_and_fails_on_a_flipped_sign(repo, capsys):
    write(repo, "b", {"nll": 4.0, **claim(-0.009, -0.012, -0.006)})
    subprocess.run(["git", "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qam", "a claim"], cwd=repo, check=True)
    # far outside 3 seed sd (0.003) but the intervals overlap: the claim agrees
    write(repo, "b", {"nll": 4.0, **claim(-0.004, -0.007, -0.001)})
    (row,) = [r for r in verify(repo, "HEAD") if r.figure == "b.gap"]
    assert row.claim and row.within and not row.sign_flipped
    assert not any(r.figure.startswith(("b.gap_ci", "b.gap_se", "b.gap_sd")) for r in verify(repo, "HEAD"))
    assert main(["--repo", str(repo)]) == 0
    assert "1 of 1 claims agree with HEAD" in capsys.readouterr().out
    # the same size, the other sign: the committed interval excludes 0 and the value here is above it
    write(repo, "b", {"nll": 4.0, **claim(0.002, -0.008, 0.012)})
    (row,) = [r for r in verify(repo, "HEAD") if r.figure == "b.gap"]
    assert row.sign_flipped and not row.within
    assert main(["--repo", str(repo)]) == 1
    assert "CLAIMS FAILED: b.gap (sign flipped)" in capsys.readouterr().out
    # the same sign, intervals apart
    write(repo, "b", {"nll": 4.0, **claim(-0.03, -0.033, -0.027)})
    (row,) = [r for r in verify(repo, "HEAD") if r.figure == "b.gap"]
    assert not row.sign_flipped and not row.within
    assert main(["--repo", str(repo)]) == 1
    assert "b.gap (intervals apart)" in capsys.readouterr().out
    # the same sign, the intervals overlap, the interval here reaches 0 where the committed one excluded it: the
    # claim is weaker here (unresolved), not reversed: no verdict flipped, the intervals agree
    write(repo, "b", {"nll": 4.0, **claim(-0.004, -0.008, 0.0005)})
    (row,) = [r for r in verify(repo, "HEAD") if r.figure == "b.gap"]
    assert not row.verdict_flipped and not row.sign_flipped and row.within
    # a claim that lost its interval cannot be judged
    write(repo, "b", {"nll": 4.0, "gap": -0.009})
    assert main(["--repo", str(repo)]) == 1


def test_an_unresolved_claim_makes_no_promise_of_sign(repo):
    write(repo, "b", {"nll": 4.0, **claim(0.001, -0.002, 0.004)})
    subprocess.run(["git", "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qam", "a claim"], cwd=repo, check=True)
    write(repo, "b", {"nll": 4.0, **claim(-0.001, -0.004, 0.002)})
    (row,) = [r for r in verify(repo, "HEAD") if r.figure == "b.gap"]
    assert row.within and not row.sign_flipped


def test_against_another_workspace_instead_of_a_revision(repo, tmp_path_factory, capsys):
    other = tmp_path_factory.mktemp("other")
    (other / "metrics").mkdir()
    (other / "metrics" / "a.json").write_text(json.dumps({**COMMITTED_A, "ratio": 2.0}))
    assert main(["--repo", str(repo), "--against", str(other)]) == 1
    out = capsys.readouterr().out
    assert "OUTSIDE: a.ratio" in out and f"claims agree with {other}" in out


def test_spreads_and_intervals_in_sibling_files_judge_their_figures(tmp_path):
    """As the stages write them (lookahead.core.report): metrics/<stage>.json the figures,
    <stage>_sd.json their spreads, <stage>_ci.json the claims' intervals — at the revision and here."""
    from lookahead.core.report import write_metrics

    (tmp_path / "dvc.yaml").write_text(DVC_YAML.replace("      - metrics/b.json:\n          cache: false\n",
                                                        "      - metrics/b.json:\n          cache: false\n"
                                                        "      - metrics/b_sd.json:\n          cache: false\n"
                                                        "      - metrics/b_ci.json:\n          cache: false\n"))
    (tmp_path / "metrics").mkdir()
    keys = ("nll", "nll_sd", "gap", "gap_sd", "gap_se", "gap_ci_low", "gap_ci_high", "seeds")
    write_metrics({"nll": 4.0, "nll_sd": 0.01, "seeds": 3, **claim(-0.009, -0.012, -0.006)}, keys,
                  tmp_path / "metrics/b.json", tmp_path / "metrics/b_report.json")
    assert set(json.loads((tmp_path / "metrics/b.json").read_text())) == {"nll", "gap"}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "run"]):
        subprocess.run(cmd, cwd=tmp_path, check=True)
    write_metrics({"nll": 4.02, "nll_sd": 0.01, "seeds": 3, **claim(-0.004, -0.007, -0.001)}, keys,
                  tmp_path / "metrics/b.json", tmp_path / "metrics/b_report.json")
    rows = {r.figure: r for r in verify(tmp_path, "HEAD")}
    assert set(rows) == {"b.nll", "b.gap"}  # no row of its own for a spread, an interval or a sibling file
    assert rows["b.nll"].research and rows["b.nll"].basis == "3 sd" and rows["b.nll"].within  # 0.02 <= 3 x 0.01
    assert rows["b.gap"].claim and rows["b.gap"].committed_interval == (-0.012, -0.006) and rows["b.gap"].within
    write_metrics({"nll": 4.05, "nll_sd": 0.01, "seeds": 3, **claim(0.002, -0.008, 0.012)}, keys,
                  tmp_path / "metrics/b.json", tmp_path / "metrics/b_report.json")
    rows = {r.figure: r for r in verify(tmp_path, "HEAD")}
    assert not rows["b.nll"].within and rows["b.gap"].sign_flipped


def test_a_claim_measured_across_base_lms_is_judged_by_its_prediction_interval(repo, capsys):
    """With `metrics/bases_report.json` committed (``make bases``), a fresh run's claim lands within
    mean ± t(B − 1) · sqrt(sd_bases² (1 + 1/B) + its se²), however far from the committed run's own interval."""
    from scipy import stats

    write(repo, "b", {"nll": 4.0, **claim(-0.009, -0.012, -0.006), "gap_se": 0.0015})
    bases = {"bases": 3, "claims": {"gap": {"stage": "b", "across": {"mean": -0.02, "sd": 0.01}}}}
    (repo / "metrics" / "bases_report.json").write_text(json.dumps(bases))
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "bases"], cwd=repo, check=True)
    half = stats.t.ppf(0.975, 2) * (0.01 ** 2 * (1 + 1 / 3) + 0.002 ** 2) ** 0.5
    inside = -0.02 - 0.95 * half  # intervals apart from the committed run's, inside the prediction, below 0 as committed
    write(repo, "b", {"nll": 4.0, **claim(inside, inside - 0.004, inside + 0.004), "gap_se": 0.002})
    (row,) = [r for r in verify(repo, "HEAD") if r.figure == "b.gap"]
    assert row.prediction == pytest.approx((-0.02 - half, -0.02 + half)) and row.within and row.committed == -0.02
    assert main(["--repo", str(repo)]) == 0
    outside = -0.02 - 1.05 * half
    write(repo, "b", {"nll": 4.0, **claim(outside, outside - 0.004, outside + 0.004), "gap_se": 0.002})
    assert main(["--repo", str(repo)]) == 1
    assert "OUTSIDE THE PREDICTION" in capsys.readouterr().out
    # inside the prediction, which straddles 0, but above 0 where the claim was below it: its verdict flipped
    flipped = -0.02 + 0.95 * half
    write(repo, "b", {"nll": 4.0, **claim(flipped, flipped - 0.004, flipped + 0.004), "gap_se": 0.002})
    (row,) = [r for r in verify(repo, "HEAD") if r.figure == "b.gap"]
    assert row.prediction[0] <= flipped <= row.prediction[1] and row.verdict_flipped and not row.within
    assert main(["--repo", str(repo)]) == 1
    assert "b.gap (sign flipped)" in capsys.readouterr().out
    # one base measures no spread: the committed run's interval judges it, as before
    (repo / "metrics" / "bases_report.json").write_text(json.dumps({**bases, "bases": 1}))
    subprocess.run(["git", "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qam", "one base"], cwd=repo, check=True)
    (row,) = [r for r in verify(repo, "HEAD") if r.figure == "b.gap"]
    assert row.prediction is None and row.basis == "interval"


def test_an_absolute_headline_measured_across_base_lms_is_judged_by_the_spread_between_them(repo, capsys):
    """A fresh run trains another base LM, and its absolute figures move with it by more than their seeds'
    spread: where `make bases` measured a headline on each base (`figures` of metrics/bases_report.json), a
    run agreeing with every claim passes however far its NLLs sit from the committed run's in seed sds,
    and fails outside the prediction interval or where a claim's verdict flips; a headline without a base
    spread keeps its seed spread."""
    from scipy import stats

    committed = {"nll": 4.36, "nll_sd": 0.002, "level": 4.5, "level_sd": 0.002, "seeds": 3,
                 **claim(-0.09, -0.10, -0.08)}
    write(repo, "b", committed)
    bases = {"bases": 3, "claims": {"gap": {"stage": "b", "across": {"mean": -0.095, "sd": 0.008,
                                                                      "ci_low": -0.11, "ci_high": -0.08}}},
             "figures": {"b.nll": {"per_base": {"0": 4.36, "1": 4.345, "2": 4.335}, "mean": 4.3467, "sd": 0.0127}}}
    (repo / "metrics" / "bases_report.json").write_text(json.dumps(bases))
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "bases"], cwd=repo, check=True)
    # another CPU's run: the NLL 0.022 lower (11 seed sd, over 0.5 %), the claim where it was
    here = {**committed, "nll": 4.3378, **claim(-0.092, -0.102, -0.082), "gap_se": 0.005}
    write(repo, "b", here)
    rows = {r.figure: r for r in verify(repo, "HEAD")}
    half = stats.t.ppf(0.975, 2) * (0.0127 ** 2 * (1 + 1 / 3) + 0.002 ** 2 / 3) ** 0.5
    assert rows["b.nll"].basis == "bases" and rows["b.nll"].prediction == pytest.approx((4.3467 - half, 4.3467 + half))
    assert rows["b.nll"].research and not rows["b.nll"].claim and rows["b.nll"].within
    assert rows["b.level"].basis == "0.5%"  # no spread between bases measured: its seed spread (floor 0.5 %)
    assert main(["--repo", str(repo)]) == 0
    out = capsys.readouterr().out
    assert "1 of 1 claims agree" in out and "3 of 3 research headlines within their spread (between base LMs for 1;" in out
    # an absolute figure outside what another base LM gives
    write(repo, "b", {**here, "nll": 4.3467 - 1.05 * half})
    assert main(["--repo", str(repo)]) == 1
    out = capsys.readouterr().out
    assert "OUTSIDE: b.nll" in out and "OUTSIDE THE PREDICTION" in out
    # every headline within, a claim's verdict flipped: inside the prediction (-0.095 +- 0.155), yet above 0
    write(repo, "b", {**here, **claim(0.04, 0.02, 0.06), "gap_se": 0.035})
    (row,) = [r for r in verify(repo, "HEAD") if r.figure == "b.gap"]
    assert row.prediction[0] < 0.04 < row.prediction[1] and row.verdict_flipped and not row.within
    assert main(["--repo", str(repo)]) == 1
    assert "CLAIMS FAILED: b.gap (sign flipped)" in capsys.readouterr().out


def test_a_claim_across_base_lms_fails_where_its_verdict_flips_against_its_own_reference(repo, capsys):
    """greedy_capture is claimed above 0.6 (lookahead.tools.bases): across bases it fails (below 0.6); a fresh
    run inside the prediction interval whose own interval lies above 0.6 flips that verdict, though its sign
    (against 0) is the committed one; one whose interval straddles 0.6, or lies below it, agrees."""
    write(repo, "b", {"nll": 4.0, "greedy_capture": 0.5, "greedy_capture_sd": 0.01, "greedy_capture_se": 0.02,
                      "greedy_capture_ci_low": 0.46, "greedy_capture_ci_high": 0.54})
    bases = {"bases": 3, "claims": {"greedy_capture": {"stage": "b", "across": {
        "mean": 0.55, "sd": 0.05, "ci_low": 0.45, "ci_high": 0.58}}}}
    (repo / "metrics" / "bases_report.json").write_text(json.dumps(bases))
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "bases"], cwd=repo, check=True)
    for value, low, high, flipped in ((0.64, 0.61, 0.67, True), (0.6, 0.57, 0.63, False), (0.5, 0.47, 0.53, False)):
        write(repo, "b", {"nll": 4.0, "greedy_capture": value, "greedy_capture_se": 0.015,
                          "greedy_capture_ci_low": low, "greedy_capture_ci_high": high})
        (row,) = [r for r in verify(repo, "HEAD") if r.figure == "b.greedy_capture"]
        assert row.reference == 0.6 and row.prediction[0] < value < row.prediction[1] and not row.sign_flipped
        assert row.verdict_flipped == flipped and row.within != flipped, value
        assert main(["--repo", str(repo)]) == (1 if flipped else 0)
        out = capsys.readouterr().out
        assert ("CLAIMS FAILED: b.greedy_capture (verdict flipped: below -> above 0.6)" in out) == flipped
