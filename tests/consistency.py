"""The consistency set: every check of one committed file against another (a generated page against
the metrics it renders, a study's point against the run it copies), each a function of a directory
that holds the committed files (:func:`committed`).

They read the files as committed (``git archive`` of a revision), never the working tree: `make repro`
rewrites the working tree's metrics, and on a machine whose CPU differs from the committed run's their
last bits (and, through training, more) differ, while the committed pair still agrees. The README's
two commands in sequence (`make repro`, then `make test`) must pass there
(tests/test_docs.py::test_a_rerun_on_another_machine_leaves_the_consistency_set_green).

A check that only *reads* one committed file into another (a page rendered from a report, a headline
copied from it) compares exactly. A check that *recomputes* a float from committed inputs (the
head-scaling fits refitted from the point files) compares within :data:`lookahead.core.floats.RELATIVE`
(:func:`assert_recomputed`): the committed run's CPU is not this one, and a least-squares fit or a
reduction differs in its last bits from one instruction set to another. ``python -m tests.consistency``
runs the whole set on ``HEAD``; the suite runs it once more with the CPU features restricted to the
baseline (:func:`restricted_cpu`), so that a bit-for-bit comparison of a recomputed float fails on any
machine, not only on one whose CPU differs from the committed run's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
from pathlib import Path

from lookahead.core.floats import RELATIVE, mismatches
from lookahead.core.report import read_headline

from lookahead.tools import results

REPO = Path(__file__).resolve().parents[1]
EXPORTED = (*results.COMMITTED, "docs/research")
"""What the checks read, as a revision holds it."""


def metrics_width(shown: dict, name: str) -> int:
    """How wide `dvc metrics show <name>` prints, from `dvc metrics show --json`'s output ``shown``:
    DVC's own table (dvc.compare), as its command renders it."""
    import io

    from dvc.compare import metrics_table

    one = {rev: {"data": {name: data["data"][name]}} for rev, data in shown.items()}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        metrics_table(one, precision=5, round_digits=True).render()
    return max(len(line) for line in out.getvalue().splitlines())


def headline_width(name: str, figures: dict) -> int:
    """:func:`metrics_width` of a headline file ``name`` holding ``figures`` in the workspace."""
    return metrics_width({"workspace": {"data": {name: {"data": figures}}}}, name)


@contextlib.contextmanager
def committed(repo: Path = REPO, rev: str = "HEAD"):
    """A temporary directory holding :data:`EXPORTED` as committed at ``rev`` of ``repo``."""
    with results.at_revision(repo, rev, EXPORTED) as root:
        yield root


def head_scaling_script():
    """scripts/head_scaling.py as a module (it is a script, not a package module)."""
    return script("head_scaling")


def script(name: str):
    """scripts/<name>.py as a module (a script, not a package module)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


def assert_recomputed(recomputed: object, committed: object, what: str) -> None:
    """A value recomputed from committed inputs is the committed value up to a CPU's last bits
    (:func:`lookahead.core.floats.mismatches`); the error names every key that differs."""
    found = mismatches(json.loads(json.dumps(recomputed)), committed, what)
    assert not found, (f"recomputed from the committed inputs, {len(found)} value(s) differ from the committed file "
                       f"beyond relative {RELATIVE:g}:\n  " + "\n  ".join(found))


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
            assert point[key + suffix] == phase1[key + suffix], key + suffix  # copied: exact
    for key in ("phase2_minus_control", "phase2_minus_static_control"):
        for suffix in ("", "_ci_low", "_ci_high"):
            assert point[key + suffix] == evaluate[key + suffix], key + suffix
    assert (point["n_layers"], point["n_heads"], point["heads"]) == (4, 4, 16)
    report = json.loads((root / study.REPORT).read_text())
    assert report["points"][0]["point"] == "4x4" and report["points"][0] == {k: study.without_windows(v) for k, v in point.items()
                                                                          if k != "windows"}


def head_scaling_page_is_a_fresh_render(root: Path) -> None:
    """docs/research/head-scaling.md's generated block is what the script renders from
    metrics/head_scaling_report.json, that file's fits are refitted from the committed point files, and the
    headline metrics/head_scaling.json (its intervals in head_scaling_ci.json) is drawn from it: two claims at
    the largest point and their slope over the heads-per-layer leg, no value past the largest point, and
    narrow enough for `dvc metrics show` (≤ 400 columns)."""
    import contextlib

    import yaml

    from lookahead.artifacts.val_scores import scoring_from_params

    study = head_scaling_script()
    report = json.loads((root / study.REPORT).read_text())
    page = (root / study.PAGE).read_text()
    block = page.split(study.BEGIN, 1)[1].split(study.END, 1)[0]
    assert block.strip() == study.markdown(report).strip()
    assert "trend_at_256_heads" not in report and "256 heads" not in block.split("| contrast |")[-1]
    rows = [json.loads((root / "metrics" / "head_scaling" / f"{r['point']}.json").read_text()) for r in report["points"]]
    assert [{k: study.without_windows(v) for k, v in r.items() if k != "windows"} for r in rows] == report["points"]
    committed = sorted(path.stem for path in (root / "metrics" / "head_scaling").glob("*.json"))
    assert sorted([r["point"] for r in report["points"]] + report["pending"]) == committed  # every point, once
    assert all("windows" in r for r in rows)  # a point under earlier rules is pending, never in a table
    scoring = scoring_from_params(yaml.safe_load((REPO / "params.yaml").read_text()))  # root may hold metrics alone
    with contextlib.chdir(root):  # the between-base spread the fits add: root's metrics/bases_report.json
        refitted = study.fits(rows, scoring)
        refitted_75 = study.fits(study.quarter_rows(rows), scoring, study.QUARTER_FIT_CLAIMS)
    assert_recomputed(refitted, report["fits"], "fits")  # refitted on this CPU: within RELATIVE
    assert_recomputed(refitted_75, report["fits_75"], "fits_75")
    table = json.loads((root / study.TABLE).read_text())
    whole = read_headline(root / study.TABLE)  # with its intervals and window set (head_scaling_{ci,sd}.json)
    assert whole == study.headline(report) and whole["window_set"] == report["points"][0]["window_set"]
    largest_heads = max(r["heads"] for r in report["points"])
    assert table["points"] == ",".join(r["point"] for r in report["points"])
    assert table["largest_point"] == next(r["point"] for r in report["points"] if r["heads"] == largest_heads)
    largest = next(r for r in report["points"] if r["point"] == table["largest_point"])
    for key in study.HEADLINE_CLAIMS:
        for suffix in ("", "_ci_low", "_ci_high"):
            assert whole[f"{key}_at_largest{suffix}"] == largest[key + suffix], key + suffix
    if report["fits_75"]:  # the 75 % rows' claim, at the largest point's 75 % row and over the leg
        key = study.QUARTER_HEADLINE_CLAIM
        for suffix in ("", "_ci_low", "_ci_high"):
            assert whole[f"{key}_75_at_largest{suffix}"] == largest["off_75"][key + suffix], key + suffix
        assert whole[f"{key}_75_slope"] == report["fits_75"][key]["slope_per_doubling"]["estimate"]
    width = headline_width("metrics/head_scaling.json", table)  # `dvc metrics show metrics/head_scaling.json`
    assert width <= 400, width


def frontier_headline_is_drawn_from_its_report(root: Path) -> None:
    """metrics/frontier.json is the judged claims of metrics/frontier_report.json, rendered by the study's
    headline, under the declaration metrics/frontier_declared.json, and `dvc metrics show` prints it
    within 400 columns (nothing to check before the study is scored on the test windows)."""
    from lookahead.tools import frontier_page as page

    if not (root / page.HEADLINE).is_file():
        return
    report = json.loads((root / page.REPORT).read_text())
    committed = json.loads((root / page.HEADLINE).read_text())
    assert committed == page.headline(report["judged"], report["declaration"])
    assert report["declaration"] == json.loads((root / page.DECLARED).read_text())
    assert headline_width(str(page.HEADLINE), committed) <= 400


CHECKS = (results_page_is_a_fresh_render, no_table_of_the_results_page_mixes_window_sets,
          head_scaling_default_point_is_the_default_run, head_scaling_page_is_a_fresh_render,
          frontier_headline_is_drawn_from_its_report)
"""Every check of one committed file against another. A new one joins here, so that the rewrite test
runs it too."""


def numpy_cpu() -> tuple[list[str], dict[str, bool]]:
    """numpy's dispatch targets above its baseline, and which CPU features this process may use."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:  # numpy < 2
        from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    return list(__cpu_dispatch__), dict(__cpu_features__)


def restricted_cpu() -> dict[str, str]:
    """Environment variables that hold numpy, its OpenBLAS and torch to their baseline kernels, below any
    CPU's own (numpy's dispatch targets all disabled, OpenBLAS's oldest core of the architecture, torch's
    ``default`` capability): a float recomputed under them differs in its last bits from one the
    committed run computed with AVX2 or AVX-512 kernels, on any machine."""
    import platform

    dispatch, _ = numpy_cpu()
    env = {"NPY_DISABLE_CPU_FEATURES": " ".join(dispatch), "ATEN_CPU_CAPABILITY": "default"}
    core = {"x86_64": "Prescott", "amd64": "Prescott", "aarch64": "ARMV8", "arm64": "ARMV8"}.get(platform.machine().lower())
    if core:
        env["OPENBLAS_CORETYPE"] = core
    return env


def kernels() -> dict[str, object]:
    """Which kernels this process runs: numpy's enabled dispatch targets, OpenBLAS's core (threadpoolctl)."""
    import numpy
    import threadpoolctl

    dispatch, features = numpy_cpu()
    numpy.ones(2) @ numpy.ones(2)  # OpenBLAS loaded
    return {"numpy_dispatch": [f for f in dispatch if features.get(f)],
            "openblas_core": [i.get("architecture") for i in threadpoolctl.threadpool_info() if i["internal_api"] == "openblas"]}


def main(rev: str = "HEAD") -> int:
    """Every check of :data:`CHECKS` on the files as committed at ``rev``; exit 1 where one fails."""
    print(json.dumps({"kernels": kernels()}), flush=True)
    failed = []
    with committed(REPO, rev) as root:
        for check in CHECKS:
            try:
                check(root)
                print(f"ok      {check.__name__}", flush=True)
            except AssertionError as error:
                failed.append(check.__name__)
                print(f"FAILED  {check.__name__}: {error}", flush=True)
    print(f"{len(CHECKS) - len(failed)} of {len(CHECKS)} checks of the consistency set pass at {rev}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))
