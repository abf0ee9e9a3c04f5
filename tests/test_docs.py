"""The documentation: README and docs/ point only at things that exist, the results page and
README's summary are what the committed metrics render to, README stays short."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from lookahead.tools import results, verdicts
from tests import consistency

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}


def dvc_outputs() -> set[str]:
    """The outputs dvc.yaml declares: a link to one resolves after `dvc pull` or `dvc repro`."""
    files = set()
    for stage in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].values():
        for kind in ("outs", "metrics", "plots"):
            for entry in stage.get(kind, []):
                files |= set(entry) if isinstance(entry, dict) else {entry}
    return files


def test_every_relative_link_resolves_to_a_file_and_heading():
    outputs, broken = dvc_outputs(), []
    for page in PAGES:
        text = FENCE.sub("", page.read_text(encoding="utf-8"))
        for match in LINK.finditer(text):
            target = match.group(1) or match.group(2)
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            inside = dest == REPO or REPO in dest.parents
            if path and not (inside and (dest.exists() or str(dest.relative_to(REPO)) in outputs)):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


NOT_MODULES = {"lookahead.failed_stages"}  # an MLflow tag (docs/tracking.md), not a module


def _module_exists(dotted: str) -> bool:
    """``lookahead.a.b`` a module or package, or ``lookahead.a.b.name`` something defined in one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = REPO / "src" / Path(*parts[:cut])
        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if source.is_file():
            rest = parts[cut:]
            if not rest:
                return True
            if len(rest) > 1:
                return False
            return re.search(rf"^\s*(def|class)\s+{rest[0]}\b|^{rest[0]}\b\s*[:=]", source.read_text(encoding="utf-8"),
                             re.M) is not None
    return False


def test_every_module_make_target_stage_and_path_named_exists():
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    stages = set(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"])
    missing = []
    for page in PAGES:
        text, where = page.read_text(encoding="utf-8"), page.relative_to(REPO)
        for dotted in set(re.findall(r"\blookahead(?:\.[A-Za-z_]\w*)+", text)) - NOT_MODULES:
            if not _module_exists(dotted.rstrip(".")):
                missing.append(f"{where}: {dotted}")
        # commands: in code (after a backtick, or starting a line of a code block), not prose ("make its")
        for target in set(re.findall(r"(?:`|^\s*)make ([a-z][\w-]*)", text, re.M)):
            if target not in targets:
                missing.append(f"{where}: make {target}")
        for stage in set(re.findall(r"(?:`|^\s*)dvc repro (?:-[fs] )*([a-z]\w*)", text, re.M)):
            if stage not in stages:
                missing.append(f"{where}: dvc repro {stage}")
        for path in set(re.findall(r"\b((?:stages|scripts|benchmarks|tests|profiles)/[\w/.-]+\.(?:py|yaml|sh))", text)):
            if not (REPO / path).is_file():
                missing.append(f"{where}: {path}")
    assert not missing, "\n".join(sorted(missing))


def test_the_readme_is_short_and_answers_the_newcomer_first():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    headings = re.findall(r"^## (.*)$", FENCE.sub("", readme), re.M)
    assert headings[:5] == ["What it found", "Quick start", "Run it on OLMo-2-1B", "Change a parameter and see the effect",
                            "Share results"]
    for page in (REPO / "docs").glob("*.md"):  # every topic page is in the index
        assert f"(docs/{page.name})" in readme, page.name


def test_the_estimate_in_the_readme_is_what_make_estimate_prints():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme.split("<!-- make estimate PROFILE=profiles/olmo2-1b.yaml", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    out = subprocess.run([sys.executable, "-m", "lookahead.tools.params", "profiles/olmo2-1b.yaml", "--estimate"],
                         cwd=REPO, capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HF_HOME": str(REPO / ".no-hub-cache")}).stdout
    assert block == out


def test_the_committed_results_page_and_summary_are_a_fresh_render():
    """`make results` renders docs/results.md and README's summary from the metrics in git: a change
    of metrics without the page fails here. Both as committed (HEAD): a rerun that rewrote the
    working tree's metrics (another machine's last bits) does not make the committed page stale."""
    with consistency.committed() as root:
        consistency.results_page_is_a_fresh_render(root)


def test_a_rerun_that_rewrites_the_metrics_last_bits_leaves_the_docs_checks_green(tmp_path):
    # a clone as a fresh machine has it; then `make repro` there rewrites the headlines: their last bits
    # differ from the probe on, and training carries the difference on (within the seeds' spread)
    subprocess.run(["git", "clone", "--quiet", "--local", str(REPO), str(tmp_path / "clone")], check=True)
    clone = tmp_path / "clone"
    path = clone / "metrics" / "phase1.json"
    phase1 = json.loads(path.read_text())
    phase1["dense_nll"] = float(np.nextafter(phase1["dense_nll"], np.inf))  # one ulp
    phase1["hard_nll"] += 0.004  # carried through training: a visible change, within 3 seed sd
    path.write_text(json.dumps(phase1, indent=2) + "\n")
    assert results.main(["--repo", str(clone), "--check"]) == 1  # the working tree's page is older than its metrics
    assert results.main(["--repo", str(clone), "--check", "--rev", "HEAD"]) == 0  # what the docs test checks
    with results.at_revision(clone, "HEAD") as root:
        assert results.check(root) == []


def test_a_table_of_figures_from_two_window_sets_is_refused():
    assert "`test:256x128:0123456789ab`" in verdicts.scored_on("test:256x128:0123456789ab", "test:256x128:0123456789ab")
    with pytest.raises(verdicts.MixedWindows, match="2 window sets"):
        verdicts.scored_on("test:256x128:0123456789ab", "cache-val:32x128:ba9876543210")


def test_no_table_of_the_committed_page_mixes_window_sets():
    with consistency.committed() as root:
        consistency.no_table_of_the_results_page_mixes_window_sets(root)


def _as_another_machine(value, rng):
    """A figure as a rerun on another CPU writes it: a float moved by up to 2 % (training carries the
    last bits' difference on), an int or a string as it is."""
    if isinstance(value, bool) or not isinstance(value, float):
        return value
    return value * (1 + rng.uniform(-0.02, 0.02)) + rng.uniform(-1e-3, 1e-3)


def _rewrite(node, rng):
    if isinstance(node, dict):
        return {k: _rewrite(v, rng) for k, v in node.items()}
    if isinstance(node, list):
        return [_rewrite(v, rng) for v in node]
    return _as_another_machine(node, rng)


def test_a_rerun_on_another_machine_leaves_the_consistency_set_green(tmp_path):
    """The README's two commands in sequence on a machine whose CPU differs from the committed run's:
    `make repro` rewrites every metric (json and csv, every float moved), then the consistency set
    (every check of one committed file against another, tests/consistency.py) passes, since it reads
    the committed pair. Read from the working tree instead, the same checks fail: the rewrite is one
    they would see."""
    subprocess.run(["git", "clone", "--quiet", "--local", str(REPO), str(tmp_path / "clone")], check=True)
    clone, rng = tmp_path / "clone", np.random.default_rng(0)
    for path in sorted((clone / "metrics").rglob("*")):
        if path.suffix == ".json":
            path.write_text(json.dumps(_rewrite(json.loads(path.read_text()), rng), indent=2) + "\n")
        elif path.suffix == ".csv":
            rows = list(csv.reader(path.read_text().splitlines()))
            rows[1:] = [[repr(_as_another_machine(float(cell), rng)) if re.fullmatch(r"-?\d+\.\d*(e[-+]?\d+)?", cell)
                         else cell for cell in row] for row in rows[1:]]
            with path.open("w", newline="") as out:
                csv.writer(out).writerows(rows)
    changed = subprocess.run(["git", "diff", "--name-only", "--", "metrics"], cwd=clone, capture_output=True,
                             text=True, check=True).stdout.split()
    # every figure file that holds a float (a file of counts alone reads the same on any CPU)
    assert len(changed) > 50 and {"metrics/phase1.json", "metrics/evaluate_ci.json", "metrics/phase1_eval.csv",
                                  "metrics/head_scaling/4x4.json", "metrics/head_scaling_report.json"} <= set(changed)
    with consistency.committed(clone) as root:
        for check in consistency.CHECKS:
            check(root)
    failed = []
    for check in consistency.CHECKS:  # the working tree, as the tests read it before they read git
        try:
            check(clone)
        except AssertionError:
            failed.append(check.__name__)
    # (head_scaling_default_point_is_the_default_run compares figures only while the study and the default run
    # share a window set; scored under earlier rules, it checks the page's statement of them, which no rewrite moves)
    assert set(failed) >= {"results_page_is_a_fresh_render", "head_scaling_page_is_a_fresh_render"}, failed


def test_the_consistency_set_holds_on_the_baseline_kernels_of_any_cpu():
    """The consistency set once more in a process whose numpy, OpenBLAS and torch run their baseline
    kernels (no AVX2, no AVX-512: tests/consistency.py's restricted_cpu): every float it recomputes then
    differs in its last bits from the committed run's, on any machine, so a check that compared such a
    float bit for bit fails here wherever the suite runs (before the shared tolerance, the head-scaling
    refit did), not only on a CPU unlike the committed run's."""
    restricted = consistency.restricted_cpu()
    done = subprocess.run([sys.executable, "-m", "tests.consistency"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **restricted})
    assert done.returncode == 0, done.stdout + done.stderr
    kernels = json.loads(done.stdout.splitlines()[0])["kernels"]
    assert kernels["numpy_dispatch"] == []  # every dispatch target above the baseline disabled
    if "OPENBLAS_CORETYPE" in restricted:  # x86-64 and aarch64: OpenBLAS on its oldest core, no vector extension
        assert not {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "Sandybridge",
                    "NeoverseN1", "NeoverseV1"} & set(kernels["openblas_core"]), kernels
    assert f"{len(consistency.CHECKS)} of {len(consistency.CHECKS)} checks" in done.stdout


def test_a_changed_metric_makes_the_committed_page_stale(tmp_path, capsys):
    with results.at_revision(REPO, "HEAD") as root:  # the page and metrics as committed
        shutil.copytree(root, tmp_path, dirs_exist_ok=True)
    assert results.main(["--repo", str(tmp_path), "--check"]) == 0
    phase1 = json.loads((tmp_path / "metrics/phase1.json").read_text())
    phase1["deployed_nll"] += 0.01
    (tmp_path / "metrics/phase1.json").write_text(json.dumps(phase1))
    assert results.main(["--repo", str(tmp_path), "--check"]) == 1
    assert "stale: docs/results.md" in capsys.readouterr().err
    assert results.main(["--repo", str(tmp_path)]) == 0 and results.main(["--repo", str(tmp_path), "--check"]) == 0
    assert f"| `deployed_nll` | {phase1['deployed_nll']:.3f} ± " in (tmp_path / "docs/results.md").read_text()
    # a changed interval flips a verdict in the README's summary too
    ci = json.loads((tmp_path / "metrics/evaluate_ci.json").read_text()) if (tmp_path / "metrics/evaluate_ci.json").exists() \
        else json.loads((tmp_path / "metrics/evaluate.json").read_text())
    ci["phase2_minus_static_control_ci_low"], ci["phase2_minus_static_control_ci_high"] = -0.02, -0.01
    target = "evaluate_ci.json" if (tmp_path / "metrics/evaluate_ci.json").exists() else "evaluate.json"
    (tmp_path / "metrics" / target).write_text(json.dumps(ci))
    assert results.main(["--repo", str(tmp_path), "--check"]) == 1
    results.main(["--repo", str(tmp_path)])
    summary = (tmp_path / "README.md").read_text().split(results.BEGIN)[1].split(results.END)[0]
    assert "phase 2 − static control" in summary and "[-0.020, -0.010] (this base LM): holds (claimed < 0)" in summary
    # the claims across base LMs: a section of the page and the README's lead line, from the bases' report
    import numpy as np

    from lookahead.artifacts.val_scores import ScoringConfig
    from lookahead.tools import bases
    from tests.test_bases import synthetic

    rng = np.random.default_rng(0)
    report = bases.tables([synthetic(s, -0.1, 0.02, 0.05, 0.01, rng=rng) for s in range(3)], ScoringConfig(resamples=100))
    (tmp_path / "metrics" / "bases_report.json").write_text(json.dumps(report))
    assert results.main(["--repo", str(tmp_path), "--check"]) == 1
    results.main(["--repo", str(tmp_path)])
    across = report["claims"]["deployed_minus_static_pruning"]["across"]
    page = (tmp_path / "docs/results.md").read_text()
    assert "## Across base LMs" in page and f"{across['mean']:+.3f} [{across['ci_low']:+.3f}, {across['ci_high']:+.3f}]" in page
    lead = (tmp_path / "README.md").read_text().split(results.BEGIN)[1].split(results.END)[0].strip().splitlines()[0]
    assert lead.startswith("- **Across 3 base LMs**") and f"router as deployed − static pruning {across['mean']:+.3f}" in lead


@pytest.mark.parametrize("interval, below, verdict", [
    ((-0.3, -0.1), True, "holds"), ((0.1, 0.3), True, "fails"), ((-0.1, 0.1), True, "unresolved"),
    ((0.1, 0.3), False, "holds"), ((-0.3, -0.1), False, "fails"),
])
def test_a_claim_is_judged_by_where_its_interval_lies(interval, below, verdict):
    assert verdicts.claim_verdict(interval, below) == verdict


def test_a_mean_is_judged_by_its_student_t_interval_over_seeds():
    # 3 seeds, sd 0.3: se = 0.1732; t(0.975, 2 df) = 4.3027 (tables), so the half-width is 0.7453
    assert verdicts.mean_verdict(1.75, 0.3, 3, 1.0) == "above"
    assert verdicts.mean_verdict(1.74, 0.3, 3, 1.0) == "within noise"
    assert verdicts.mean_verdict(0.25, 0.3, 3, 1.0) == "below"
    assert verdicts.mean_verdict(0.9, 0.0, 1, 1.0) == "below"  # no spread: the sign decides
    # two means: their spreads combine, sqrt((0.3² + 0.4²) / 3) = 0.2887, x 4.3027 = 1.242
    assert verdicts.mean_verdict(2.2, 0.3, 3, 1.0, other_sd=0.4) == "within noise"
    assert verdicts.mean_verdict(2.25, 0.3, 3, 1.0, other_sd=0.4) == "above"
    # a figure's own interval (windows and seeds combined) decides where it has one
    assert verdicts.mean_verdict(0.5, 0.01, 3, 0.6, interval=(0.4, 0.62)) == "within noise"
    assert verdicts.mean_verdict(0.5, 0.01, 3, 0.6, interval=(0.4, 0.58)) == "below"
    assert verdicts.mean_verdict(1.6, 0.3, 3, 1.0, other_sd=0.4) == "within noise"  # above by twice its se only


def test_the_smollm2_estimate_on_its_research_page_is_what_make_estimate_prints():
    page = (REPO / "docs/research/pretrained-lm.md").read_text(encoding="utf-8")
    marker = "<!-- make estimate PROFILE=profiles/smollm2-135m.yaml FORWARD_S=0.59"
    block = page.split(marker, 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    out = subprocess.run([sys.executable, "-m", "lookahead.tools.params", "profiles/smollm2-135m.yaml", "--estimate",
                          "--forward-seconds", "0.59"], cwd=REPO, capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HF_HOME": str(REPO / ".no-hub-cache")}).stdout
    assert block == out
