"""The package's import rules (docs/development.md "Layout"; STYLE "The package layout"), read from the AST of
every module, imports inside functions included:

- ``core`` imports only ``core``; ``train`` and ``lm`` only ``core``; ``graph`` and ``semantics``
  only ``core`` and ``lm``; ``artifacts`` anything above it;
- a ``pipeline`` stage (a module or package under ``lookahead.pipeline``) anything above it, and
  never another stage; a stage script (``stages/*.py``) one stage at most;
- nothing outside ``tools`` imports ``tools``;
- ``__init__.py`` files hold a docstring and nothing else.
"""

from __future__ import annotations

import ast
import os
import tempfile
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.imports import SRC, lookahead_imports, module_name

LIBRARIES = ("core", "train", "lm", "graph", "semantics", "artifacts")
MAY_IMPORT = {
    "core": {"core"},
    "train": {"core", "train"},
    "lm": {"core", "lm"},
    "graph": {"core", "lm", "graph"},
    "semantics": {"core", "lm", "semantics"},
    "artifacts": {"core", "train", "lm", "graph", "semantics", "artifacts"},
    "pipeline": {*LIBRARIES},  # and its own stage (checked apart)
    "tools": {*LIBRARIES, "pipeline", "tools"},
}
MODULES = sorted(p for p in (SRC / "lookahead").rglob("*.py") if "__pycache__" not in p.parts)


def group(module: str) -> tuple[str, str | None]:
    """(subpackage, stage) of a module: ``lookahead.pipeline.phase1.plots`` -> ("pipeline", "phase1")."""
    parts = module.split(".")
    if len(parts) < 2:
        return "", None
    return parts[1], parts[2] if parts[1] == "pipeline" and len(parts) > 2 else None


def violations(path: Path, importer: str) -> list[str]:
    """The imports of file ``path`` (as module ``importer``) that break the rules, one line each."""
    where, stage = group(importer)
    found = []
    for target, line in sorted(lookahead_imports(path).items()):
        to, to_stage = group(target)
        if to == "pipeline" and to_stage is None:
            ok = where == "tools"  # the package itself: nothing to import
        elif where == "pipeline":
            ok = to in MAY_IMPORT["pipeline"] or (to == "pipeline" and to_stage == stage)
        else:
            ok = to in MAY_IMPORT.get(where, set())
        if not ok:
            found.append(f"{path.relative_to(REPO)}:{line}: {importer} imports {target}")
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC / "lookahead")))
def test_imports_run_one_way(path):
    module = module_name(path)
    assert group(module)[0] in MAY_IMPORT or module == "lookahead", f"{module}: not in a subpackage of the layout"
    assert not violations(path, module)


def test_a_stage_script_runs_one_stage():
    for script in sorted((REPO / "stages").glob("*.py")):
        stages = {group(t)[1] for t in lookahead_imports(script) if group(t)[0] == "pipeline"}
        assert len(stages) <= 1, f"{script.name} imports the stages {sorted(stages)}"
        assert not any(group(t)[0] == "tools" for t in lookahead_imports(script)), f"{script.name} imports tools"


@pytest.mark.parametrize("path", [p for p in MODULES if p.name == "__init__.py"],
                         ids=lambda p: str(p.parent.relative_to(SRC)))
def test_package_init_files_hold_a_docstring_only(path):
    body = ast.parse(path.read_text(encoding="utf-8")).body
    assert body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant), \
        f"{path.relative_to(REPO)}: starts with a docstring saying what the subpackage is"
    assert len(body) == 1, f"{path.relative_to(REPO)}: holds code; a package's __init__ stays a docstring"


@pytest.mark.parametrize("importer, imported", [
    ("lookahead.core.report", "from lookahead.graph.runtime import forward_with_topology"),
    ("lookahead.graph.scoring", "from lookahead.semantics import geometry"),
    ("lookahead.pipeline.evaluate.build", "from lookahead.pipeline.phase2.build import Phase2Config"),
    ("lookahead.pipeline.pairs", "def f():\n    from lookahead.tools.faults import truncate"),
    ("lookahead.artifacts.contexts", "import lookahead.pipeline.contexts"),
])
def test_the_checker_catches_a_wrong_import(importer, imported):
    # Inside the repo (reported by its path), under a name no other test worker can pick: tmp_path's name is
    # only unique within one worker's base directory, and two workers once removed each other's file.
    handle, name = tempfile.mkstemp(prefix="_wrong_", suffix=".py", dir=REPO / "tests")
    path = Path(name)
    os.close(handle)
    path.write_text(imported + "\n")
    try:
        assert len(violations(path, importer)) == 1
    finally:
        path.unlink()


def test_the_checker_allows_a_stage_its_own_modules():
    path = SRC / "lookahead" / "pipeline" / "diffusion" / "build.py"
    assert "lookahead.pipeline.diffusion.judge" in lookahead_imports(path)  # its own package
    assert not violations(path, module_name(path))


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of a module import graph ({module: modules it imports}), as a path that ends where it
    starts, or [] when there is none (a depth-first search: a module met again while on the stack)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_the_package_has_no_import_cycle():
    """No module imports, directly or through others, a module that imports it back (imports inside
    functions count: a lazy import only hides a circle)."""
    graph = {module_name(p): set(lookahead_imports(p)) for p in MODULES}
    assert import_cycle(graph) == [], " -> ".join(import_cycle(graph))


def test_the_cycle_check_finds_a_cycle():
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []
