"""Which stages `dvc repro` would rerun after an edit of each module, or of each params key: the
module's bytes are changed (a comment appended), or the key's value in params.yaml; `dvc repro --dry`
lists the stages it would run, and the bytes are put back. Those are the stages whose own inputs
changed: a stage downstream of them reruns as well where an output it reads changes, which a comment
or a scoring-only key does not. Modules (keys) that the same stages list run once for their group.
Needs a workspace whose pipeline is up to date (`dvc status` clean); prints a markdown table.

    python scripts/rerun_table.py                        # every module of src/lookahead and stages/
    python scripts/rerun_table.py --json > before.json   # {module: [stages]}
    python scripts/rerun_table.py --before before.json   # the table with a "before" column beside
    python scripts/rerun_table.py --params               # every key of params.yaml instead

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
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]


def resolved(dep: str, params: dict) -> str:
    """A dep with its ``${section.key}`` params filled in (dvc.yaml templates phase 2's decoder inputs)."""
    def value(match: re.Match) -> str:
        node = params
        for key in match.group(1).split("."):
            node = node.get(key, {}) if isinstance(node, dict) else {}
        return node if isinstance(node, str) else match.group(0)

    return re.sub(r"\$\{([\w.]+)\}", value, dep)


def listing(stages: dict, params: dict) -> dict[str, tuple[str, ...]]:
    """{module: the stages whose deps cover it (by file or by directory)}, for every .py module."""
    modules = sorted(str(p.relative_to(REPO)) for root in ("src/lookahead", "stages")
                     for p in (REPO / root).rglob("*.py") if "__pycache__" not in p.parts)
    deps = {s: [resolved(d, params) for d in spec.get("deps", [])] for s, spec in stages.items()}
    return {m: tuple(s for s in stages if any(m == d or m.startswith(d.rstrip("/") + "/") for d in deps[s]))
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


def leaves(node, prefix: str = "") -> dict[str, object]:
    """params.yaml's keys, dotted down to their values (a list is one value)."""
    if isinstance(node, dict):
        return {k: v for key, child in node.items() for k, v in leaves(child, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): node}


def edited(value):
    """Another value of the same kind: what `dvc repro --dry` compares with the lock is the value."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, list):
        return [*value, value[-1] if value else 0]
    return "0" if value is None else f"{value}-edited"


def set_key(params: dict, key: str, value) -> dict:
    node = params
    *parents, last = key.split(".")
    for name in parents:
        node = node[name]
    node[last] = value
    return params


def params_listing(stages: dict) -> dict[str, tuple[str, ...]]:
    """{params key: the stages that list it (or a section above it), or template it into their
    command or deps}, for every key of params.yaml."""
    text = (REPO / "dvc.yaml").read_text()
    keys = leaves(yaml.safe_load((REPO / "params.yaml").read_text()))

    def listed(stage: str, spec: dict) -> list[str]:
        out = []
        for entry in spec.get("params", []):
            out += [e for names in entry.values() for e in names] if isinstance(entry, dict) else [entry]
        return out

    entries = {s: listed(s, spec) for s, spec in stages.items()}
    templated = set(re.findall(r"\$\{([\w.]+)\}", text))
    return {k: tuple(s for s in stages if any(k == e or k.startswith(e + ".") for e in entries[s]))
            + (("(templated)",) if k in templated else ()) for k in keys}


def rerun_key(key: str) -> list[str]:
    """The stages an edit of params key ``key`` reruns; params.yaml's bytes are restored whatever happens.
    A key templated into a dep's path (``decoder_inputs.*``) names a file that the edit does not make:
    DVC then refuses, and the row says so."""
    path = REPO / "params.yaml"
    original = path.read_bytes()
    try:
        path.write_text(yaml.safe_dump(set_key(yaml.safe_load(original), key, edited(leaves(
            yaml.safe_load(original))[key])), sort_keys=False))
        return dry_run()
    except subprocess.CalledProcessError as err:
        reason = next((line for line in (err.stderr or err.stdout or "").splitlines() if "ERROR" in line), "an error")
        reason = re.sub(r"'?/[^\s']*'?", "<path>", reason.split("ERROR: ", 1)[-1].strip())  # no machine's paths
        return [f"(dvc refuses the edited value: {reason[:80]})"]
    finally:
        path.write_bytes(original)


def measure_params() -> dict[str, list[str]]:
    """{params key: the stages an edit of it reruns}, one `dvc repro --dry` per group of keys that the
    same stages list (a key templated into dvc.yaml runs alone)."""
    if dry_run():
        raise SystemExit("the pipeline is not up to date (dvc status): run `dvc repro` first")
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for key, listed in params_listing(stages).items():
        groups[listed + ((key,) if "(templated)" in listed else ())].append(key)
    result = {}
    for listed, keys in tqdm(groups.items(), desc="params groups", unit="group"):
        stages_rerun = rerun_key(keys[0]) if listed else []
        result.update({k: stages_rerun for k in keys})
    return result


def measure() -> dict[str, list[str]]:
    """{module: the stages a byte change of it reruns}, one `dvc repro --dry` per group of modules that
    the same stages list."""
    if dry_run():
        raise SystemExit("the pipeline is not up to date (dvc status): run `dvc repro` first")
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for module, listed in listing(stages, params).items():
        groups[listed].append(module)
    result = {}
    for listed, modules in groups.items():
        stages_rerun = rerun(modules[0]) if listed else []
        result.update({m: stages_rerun for m in modules})
    return result


def table(after: dict[str, list[str]], before: dict[str, list[str]] | None = None, what: str = "module") -> str:
    """Markdown rows: the modules (or params keys, ``what``) whose edit reruns the same stages (before
    and after), grouped."""
    def cell(stages: list[str] | None) -> str:
        return f"(new {what})" if stages is None else f"{len(stages)}: {', '.join(stages) or '—'}"

    rows = defaultdict(list)
    for module, stages in after.items():
        key = (tuple(stages), tuple(before[module]) if before is not None and module in before else None)
        rows[key].append(module)
    header = "| edit of | stages rerun before | after |\n|---|---|---|" if before is not None else \
        "| edit of | stages rerun |\n|---|---|"
    out = [header]
    for (now, then), modules in sorted(rows.items(), key=lambda r: (-len(r[0][1] or ()), -len(r[0][0]), r[1][0])):
        names = ", ".join(f"`{m.removeprefix('src/lookahead/')}`" for m in modules)
        cells = [cell(list(then) if then is not None else None)] if before is not None else []
        out.append(f"| {names} | " + " | ".join([*cells, cell(list(now))]) + " |")
    if before is not None:
        gone = [f"`{m.removeprefix('src/lookahead/')}`" for m in sorted(set(before) - set(after))]
        if gone:
            out.append(f"| {', '.join(gone)} | (moved or split) | — |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print {module: [stages]} instead of a table")
    parser.add_argument("--before", type=Path, help="a --json file of an earlier revision: its column beside")
    parser.add_argument("--params", action="store_true", help="edits of params.yaml's keys, not of modules")
    args = parser.parse_args()
    result = measure_params() if args.params else measure()
    if args.json:
        print(json.dumps(result, indent=1))
        return
    before = json.loads(args.before.read_text()) if args.before else None
    print(table(result, before, "key" if args.params else "module"))
    what = "params keys" if args.params else "modules"
    summed = f"\nStage reruns summed over the {len(result)} {what}: {sum(len(v) for v in result.values())}"
    if before is not None:
        summed += f" (before: {sum(len(v) for v in before.values())} over {len(before)} {what})"
    print(summed)

if __name__ == "__main__":
    main()
