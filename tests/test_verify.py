"""`make verify` (lookahead.tools.verify): a run's headline figures against a git revision's (DESIGN §12)."""

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
    assert "1 of 1 research headlines within their spread of HEAD (3 seed sd, at least 0.5%); 4 of 4 other figures " \
           "within 2%." in out
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
