"""Which stages `dvc repro` would rerun after an edit of each module: the module's bytes are changed
(a comment appended), `dvc repro --dry` lists the stages it would run — the cascade through changed
outputs counted — and the bytes are put back. Modules that the same stages list run once for their
group. Needs a workspace whose pipeline is up to date (`dvc status` clean); prints a markdown table.

    python scripts/rerun_table.py            # every module of src/lookahead and stages/
    python scripts/rerun_table.py --json     # {module: [stages]}

The tables: [development](../docs/development.md#what-reruns-after-an-edit).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from collections import defaultdict
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def listing(stages: dict) -> dict[str, tuple[str, ...]]:
    """{module: the stages whose deps cover it (by file or by directory)}, for every .py module."""
    modules = sorted(str(p.relative_to(REPO)) for root in ("src/lookahead", "stages")
                     for p in (REPO / root).rglob("*.py") if "__pycache__" not in p.parts)
    return {m: tuple(s for s, spec in stages.items()
                     if any(m == d or m.startswith(d.rstrip("/") + "/") for d in spec.get("deps", [])))
            for m in modules}


def dry_run() -> list[str]:
    """The stages `dvc repro --dry` would run, in its order."""
    out = subprocess.run(["dvc", "repro", "--dry"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return re.findall(r"Running stage '([^']+)'", out)


def rerun(module: str) -> list[str]:
    """The stages a byte change of ``module`` reruns; its bytes are restored whatever happens."""
    path = REPO / module
    original = path.read_bytes()
    try:
        path.write_bytes(original + b"\n# edited by scripts/rerun_table.py\n")
        return dry_run()
    finally:
        path.write_bytes(original)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print {module: [stages]} instead of a table")
    args = parser.parse_args()
    if dry_run():
        raise SystemExit("the pipeline is not up to date (dvc status): run `dvc repro` first")
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for module, listed in listing(stages).items():
        groups[listed].append(module)
    result = {}
    for listed, modules in groups.items():
        stages_rerun = rerun(modules[0]) if listed else []
        result.update({m: stages_rerun for m in modules})
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"| edit of | stages rerun (of {len(stages)}) |\n|---|---|")
    rows = defaultdict(list)
    for module, stages_rerun in result.items():
        rows[tuple(stages_rerun)].append(module)
    for stages_rerun, modules in sorted(rows.items(), key=lambda r: (-len(r[0]), r[1][0])):
        names = ", ".join(f"`{m.removeprefix('src/lookahead/')}`" for m in modules)
        print(f"| {names} | {len(stages_rerun)}: {', '.join(stages_rerun) or '—'} |")


if __name__ == "__main__":
    main()
