"""Which `lookahead` modules a file imports (read from its AST, imports inside functions too): the
checker behind the layout rules (test_layout) and dvc.yaml's deps (test_stage_deps)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def module_file(name: str) -> Path | None:
    """The source file of module ``name`` (a package: its ``__init__.py``), or None."""
    path = SRC / Path(*name.split("."))
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return None


def module_name(path: Path) -> str:
    """``src/lookahead/graph/runtime.py`` -> ``lookahead.graph.runtime``."""
    parts = path.resolve().relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def lookahead_imports(path: Path) -> dict[str, int]:
    """{module: line of its first import} for every `lookahead.*` module a file imports
    (``from lookahead.semantics import geometry`` counts ``lookahead.semantics.geometry``)."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "lookahead"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "lookahead":
            names = [f"{node.module}.{a.name}" if module_file(f"{node.module}.{a.name}") else node.module
                     for a in node.names]
        for name in names:
            found.setdefault(name, node.lineno)
    return found


def closure(script: Path) -> set[Path]:
    """Source files of every `lookahead` module a script imports, transitively (package
    ``__init__`` files excluded: they hold a docstring only)."""
    todo, seen = list(lookahead_imports(script)), set()
    while todo:
        name = todo.pop()
        if name in seen or module_file(name) is None:
            continue
        seen.add(name)
        todo += lookahead_imports(module_file(name))
    return {module_file(n) for n in seen if module_file(n).name != "__init__.py"}
