"""Names of the sets of windows figures are scored on (docs/reproducibility.md): every figure that stands beside
another in a table, a headline or a ratio is scored on the same windows, and each report and
headline records which (``window_set``), so that a reader — and a test — can tell."""

from __future__ import annotations

import hashlib

import numpy as np


def window_set_id(windows) -> str:
    """A short hash of a set of windows' token ids (n, T+1): what a figure was scored on."""
    array = np.ascontiguousarray(np.asarray(windows, dtype="<i8"))
    return hashlib.sha256(array.tobytes() + str(array.shape).encode()).hexdigest()[:12]


def set_label(name: str, windows) -> str:
    """``<name>:<n>x<T>:<hash>``: a window set's name (``test``, ``selection``, ``cache-val``), its
    size (windows x positions each) and :func:`window_set_id`."""
    n, t = np.shape(windows)
    return f"{name}:{n}x{t - 1}:{window_set_id(windows)}"


def set_name(label: str | None) -> str | None:
    """The name part of a :func:`set_label` (None for None)."""
    return None if label is None else label.split(":", 1)[0]
