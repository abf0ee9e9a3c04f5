"""dvc.yaml lists, for every stage, each `lookahead` module its script imports, transitively
(STYLE 3): a change to any of them must rerun the stage, and a change to any other must not.
`src/lookahead/core` is one directory dep of every stage (every stage runs through its CLI, config
and tracking); every other module is listed by file. Imports inside functions count too."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.imports import closure

CORE = "src/lookahead/core"
STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


def expand(deps: list[str]) -> set[str]:
    """The source files a stage's deps cover: a directory dep stands for every .py file under it."""
    files = set()
    for dep in deps:
        path = REPO / dep
        if dep.startswith("src/") and path.is_dir():
            files |= {str(p.relative_to(REPO)) for p in path.rglob("*.py") if "__pycache__" not in p.parts}
        elif dep.startswith("src/"):
            files.add(dep)
    return files


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_deps_cover_its_imports(stage):
    spec = STAGES[stage]
    script = REPO / "stages" / f"{stage}.py"
    assert f"stages/{stage}.py" in spec["cmd"] and f"stages/{stage}.py" in spec["deps"]
    assert CORE in spec["deps"], f"dvc.yaml stage {stage!r}: {CORE} (a directory dep) is missing"
    needed = {str(p.relative_to(REPO)) for p in closure(script)}
    missing = sorted(needed - expand(spec["deps"]))
    assert not missing, f"dvc.yaml stage {stage!r} imports {missing} but does not list them in deps"
    listed = {d for d in spec["deps"] if d.startswith("src/lookahead/") and d != CORE}
    extra = sorted(listed - needed)
    assert not extra, f"dvc.yaml stage {stage!r} lists {extra} in deps but never imports them (needless reruns)"


def test_the_checker_sees_imports_inside_functions(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("def f():\n    from lookahead.pipeline.init import build_init\n"
                      "    from lookahead.semantics import geometry\n")
    files = {str(p.relative_to(REPO / "src" / "lookahead")) for p in closure(script)}
    assert {"pipeline/init.py", "semantics/geometry.py", "artifacts/wordnet_tables.py", "lm/encoders.py"} <= files


def test_core_is_a_directory_dep_that_ignores_bytecode():
    assert Path(REPO / CORE).is_dir()
    assert "__pycache__/" in (REPO / ".dvcignore").read_text().split()
    assert expand([CORE]) == {str(p.relative_to(REPO)) for p in (REPO / CORE).glob("*.py")}
