"""The consistency set: every check of one committed file against another (a generated page against
the metrics it renders, a study's point against the run it copies), each a function of a directory
that holds the committed files (:func:`committed`).

They read the files as committed (``git archive`` of a revision), never the working tree: `make repro`
rewrites the working tree's metrics, and on a machine whose CPU differs from the committed run's their
last bits (and, through training, more) differ, while the committed pair still agrees. The README's
two commands in sequence (`make repro`, then `make test`) must pass there
(tests/test_docs.py::test_a_rerun_on_another_machine_leaves_the_consistency_set_green).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from lookahead.core.report import read_headline

from lookahead.tools import results

REPO = Path(__file__).resolve().parents[1]
EXPORTED = (*results.COMMITTED, "docs/research")
"""What the checks read, as a revision holds it."""


@contextlib.contextmanager
def committed(repo: Path = REPO, rev: str = "HEAD"):
    """A temporary directory holding :data:`EXPORTED` as committed at ``rev`` of ``repo``."""
    with results.at_revision(repo, rev, EXPORTED) as root:
        yield root


def head_scaling_script():
    """scripts/head_scaling.py as a module (it is a script, not a package module)."""
    name = "head_scaling"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "head_scaling.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


def results_page_is_a_fresh_render(root: Path) -> None:
    """docs/results.md and README's summary are what `make results` renders from the metrics."""
    assert results.check(root) == [], "run `make results` and commit the page with the metrics"


def no_table_of_the_results_page_mixes_window_sets(root: Path) -> None:
    page = results.render(root)  # raises MixedWindows where a table's figures come from two sets
    for section in page.split("\n## ")[1:4]:  # phase 1, phase 2, decoders: each names one set per table
        assert "Scored on: " in section, section.splitlines()[0]
    assert "Scored on: the test set" in page.split("\n## ")[1]


def head_scaling_default_point_is_the_default_run(root: Path) -> None:
    """metrics/head_scaling/4x4.json is the default run's figures: phase 1's claims as its metrics have
    them, phase 2's as evaluate's (the same score files), the shape of params.yaml."""
    study = head_scaling_script()
    metrics = root / "metrics"
    point = json.loads((metrics / "head_scaling" / "4x4.json").read_text())
    phase1 = {**json.loads((metrics / "phase1.json").read_text()), **json.loads((metrics / "phase1_ci.json").read_text())}
    if point["window_set"] != read_headline(metrics / "phase1.json").get("window_set"):  # a study scored under earlier rules: the page must say which
        section = results.render(root).split("\n## Head scaling", 1)[1].split("\n## ", 1)[0]
        assert f"`{point['window_set']}`" in section and "earlier rules" in section, section[:400]
        return
    evaluate = {**json.loads((metrics / "evaluate.json").read_text()),
                **json.loads((metrics / "evaluate_ci.json").read_text())}
    for key in ("deployed_minus_static_pruning", "deployed_minus_static_at_equal_macs", "greedy_capture"):
        for suffix in ("", "_ci_low", "_ci_high"):
            assert point[key + suffix] == pytest.approx(phase1[key + suffix], abs=1e-12), key + suffix
    for key in ("phase2_minus_control", "phase2_minus_static_control"):
        for suffix in ("", "_ci_low", "_ci_high"):
            assert point[key + suffix] == pytest.approx(evaluate[key + suffix], abs=1e-12), key + suffix
    assert (point["n_layers"], point["n_heads"], point["heads"]) == (4, 4, 16)
    report = json.loads((root / study.REPORT).read_text())
    assert report["points"][0]["point"] == "4x4" and report["points"][0] == point


def head_scaling_page_is_a_fresh_render(root: Path) -> None:
    """docs/research/head-scaling.md's generated block is what the script renders from
    metrics/head_scaling_report.json, that file's trend is refitted from its points, and the headline
    metrics/head_scaling.json is drawn from it: the main claims at the largest point and their trend at
    256 heads, with their intervals, in a couple of dozen keys (DESIGN §1)."""
    study = head_scaling_script()
    report = json.loads((root / study.REPORT).read_text())
    page = (root / study.PAGE).read_text()
    block = page.split(study.BEGIN, 1)[1].split(study.END, 1)[0]
    assert block.strip() == study.markdown(report).strip()
    for key, _ in study.CLAIMS:
        assert report["trend_at_256_heads"][key] == study.trend(report["points"], key)
    table = json.loads((root / study.TABLE).read_text())
    assert table == study.headline(report)
    assert table["points"] == [r["point"] for r in report["points"]] and table["largest_point"] == "8x16"
    largest = next(r for r in report["points"] if r["point"] == table["largest_point"])
    for key in study.HEADLINE_CLAIMS:
        trend = report["trend_at_256_heads"][key]
        for suffix in ("", "_ci_low", "_ci_high"):
            assert table["at_largest_point"][key + suffix] == largest[key + suffix], key + suffix
            assert table["trend_at_256_heads"][key + suffix] == trend["predicted" + suffix], key + suffix

    def count(node) -> int:
        return sum(count(v) for v in node.values()) if isinstance(node, dict) else 1

    assert count(table) <= 24  # headline figures only


CHECKS = (results_page_is_a_fresh_render, no_table_of_the_results_page_mixes_window_sets,
          head_scaling_default_point_is_the_default_run, head_scaling_page_is_a_fresh_render)
"""Every check of one committed file against another. A new one joins here, so that the rewrite test
runs it too."""
