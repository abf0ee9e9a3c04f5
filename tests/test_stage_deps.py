"""dvc.yaml lists, for every stage, each `lookahead` module its script imports, transitively
(STYLE 3): a change to any of them must rerun the stage. Imports inside functions count too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

SRC = REPO / "src"
# imported only by `python -m lookahead.config` (config.main), never on a stage's path: the registry
# of sections is kept out of every stage's deps on purpose (see lookahead/sections.py)
NOT_STAGE_CODE = {"lookahead.sections"}


def module_file(name: str) -> Path | None:
    path = SRC / Path(*name.split("."))
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return None


def lookahead_imports(path: Path) -> set[str]:
    """`lookahead.*` modules imported anywhere in a file (``from lookahead import x`` counts x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("lookahead")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lookahead") and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names if module_file(f"{node.module}.{a.name}")}
    return {name for name in found if module_file(name) and name not in NOT_STAGE_CODE}


def closure(script: Path) -> set[Path]:
    """Source files of every `lookahead` module a script imports, transitively (package
    __init__ files excluded: they hold no logic)."""
    todo, seen = list(lookahead_imports(script)), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += lookahead_imports(module_file(name))
    return {module_file(n) for n in seen if module_file(n).name != "__init__.py"}


STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_deps_cover_its_imports(stage):
    spec = STAGES[stage]
    script = REPO / "stages" / f"{stage}.py"
    assert f"stages/{stage}.py" in spec["cmd"] and f"stages/{stage}.py" in spec["deps"]
    needed = {str(p.relative_to(REPO)) for p in closure(script)}
    missing = sorted(needed - set(spec["deps"]))
    assert not missing, f"dvc.yaml stage {stage!r} imports {missing} but does not list them in deps"
    listed = {d for d in spec["deps"] if d.startswith("src/lookahead/")}
    extra = sorted(listed - needed)
    assert not extra, f"dvc.yaml stage {stage!r} lists {extra} in deps but never imports them (needless reruns)"


def test_the_checker_sees_imports_inside_functions(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("def f():\n    from lookahead.init import build_init\n    from lookahead import data\n")
    files = {p.name for p in closure(script)}
    assert {"init.py", "data.py", "wordnet.py", "wordnet_data.py", "encoders.py"} <= files
