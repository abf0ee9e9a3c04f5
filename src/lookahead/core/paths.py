"""Where the project is. Stage inputs and outputs themselves come from dvc.yaml (argv)."""

from __future__ import annotations

import os
from pathlib import Path


def project_root(start: str | Path | None = None) -> Path:
    """The nearest directory at or above ``start`` (default: cwd) holding ``dvc.yaml``; else cwd."""
    here = Path(start or os.getcwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "dvc.yaml").is_file():
            return candidate
    return here
