"""The results page, rendered from the committed metrics: ``make results`` writes ``docs/results.md``.

    python -m lookahead.tools.results                # (re)write docs/results.md and README.md's summary
    python -m lookahead.tools.results --check        # exit 1 where either differs from a fresh render

Every figure on the page is read from a file in git that the pipeline or a benchmark wrote: the
stages' headlines (``metrics/<stage>.json`` with their spreads and intervals,
:func:`lookahead.core.report.read_headline`), evaluate's rows (``metrics/evaluate_pareto.csv``) and
the runtime benchmark's JSON line kept in ``benchmarks/results/runtime.json``. Nothing else in the
docs quotes a current figure: they link here, but for README.md's five-line summary, rendered from
the same files between two markers (:data:`BEGIN`, :data:`END`), and the pretrained LM's research page
(docs/research/pretrained-lm.md), whose block between its own markers
(:mod:`lookahead.tools.results_pretrained`) sets the toy's claims beside SmolLM2's. A test renders
them afresh and compares them with the committed ones, so a change of metrics without the pages fails CI.

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
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from lookahead.core.atomic import atomic_file
from lookahead.core.report import read_headline
from lookahead.tools.results_findings import (BASES, HEAD_SCALING, bases_section, decoders_section, head_scaling_section,
                                              modulator_section, phase1_section, phase2_section, summary)
from lookahead.tools.results_frontier import FRONTIER, frontier_line, frontier_section
from lookahead.tools.results_pretrained import PAGE as PRETRAINED_PAGE
from lookahead.tools.results_pretrained import pretrained_line, pretrained_section, render_page
from lookahead.tools.results_runtime import GPU, RUNTIME, decode_section, gpu_section, speed_section
from lookahead.tools.verdicts import Figures, replace_block, scored_on, table

PAGE = Path("docs/results.md")
PARETO = Path("metrics/evaluate_pareto.csv")

BEGIN, END = "<!-- results: begin (make results) -->", "<!-- results: end -->"
"""The README's five-line summary sits between these markers; ``make results`` rewrites it."""


def render_readme(root: Path, readme: str) -> str:
    """``readme`` with its summary block rewritten from the metrics at ``root``."""
    line = frontier_line(root / FRONTIER)
    lead = pretrained_line(root)  # the pretrained LM's verdicts first, once collected
    block = "\n".join(([lead] if lead else []) + summary(_stages(root), _runtime(root), _bases(root)) + ([line] if line else []))
    return replace_block(readme, BEGIN, END, block, "README.md")


def _stages(root: Path) -> dict[str, Figures]:
    return {stage: Figures(stage, read_headline(root / "metrics" / f"{stage}.json"))
            for stage in ("phase1", "evaluate", "diffusion", "modulator")}


def _bases(root: Path) -> dict | None:
    path = root / BASES
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


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
        "Every interval in the tables of one run is *this base LM's*: over the stage's seeds and the test windows "
        "of the committed run, whose base LM is one draw; \"Across base LMs\", where committed, gives each claim "
        "across base LMs ([base variance](research/base-variance.md)). "
        "Every table is scored on one set of windows, named above it: the claims on the *test* set, fresh "
        "windows nothing was chosen on and none borders (static baselines are fitted on the *fit* set, defaults, "
        "variants and the stronger baseline chosen on the *selection* set: "
        "[reproducibility](reproducibility.md#window-roles)).",
        "",
    ]
    for section in (phase1_section(m), phase2_section(m), decoders_section(m), modulator_section(m),
                    speed_section(runtime), decode_section(runtime)):
        lines += section + [""]
    lines += bases_section(root / BASES)
    lines += head_scaling_section(root / HEAD_SCALING, m["phase1"].values.get("window_set"))
    lines += frontier_section(root / FRONTIER)
    lines += pretrained_section(root)
    lines += gpu_section(root / GPU)
    lines += rows_section(root / PARETO, m["evaluate"].values.get("cache_window_set"))
    return "\n".join(lines)


COMMITTED = ("README.md", str(PAGE), str(PRETRAINED_PAGE), "metrics", str(RUNTIME.parent), "params.yaml", "profiles")
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


def fresh_pages(root: Path) -> dict[Path, str]:
    """Each generated file of the repository at ``root`` as a fresh render would write it: the results
    page, README's summary and the pretrained LM's research page (where it exists) with their blocks."""
    readme, research = root / "README.md", root / PRETRAINED_PAGE
    fresh = {root / PAGE: render(root), readme: render_readme(root, readme.read_text(encoding="utf-8"))}
    if research.is_file():
        fresh[research] = render_page(root, research.read_text(encoding="utf-8"))
    return fresh


def check(root: Path) -> list[str]:
    """The files of :data:`COMMITTED` at ``root`` that differ from a fresh render of ``root``'s metrics."""
    fresh = fresh_pages(root)
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
    try:
        fresh = fresh_pages(args.repo)
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
