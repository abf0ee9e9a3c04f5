"""Comparing a float recomputed here with one committed from another machine.

A figure refitted from committed inputs (a least-squares fit, a bootstrap, a reduction) differs in its
last bits from the committed one when the CPU differs: numpy's OpenBLAS picks its kernels by CPU
(``DYNAMIC_ARCH``), numpy dispatches its loops by instruction set, torch by ``ATEN_CPU_CAPABILITY``, and
each sums in another order. So every check that **recomputes** a float and compares it with a
committed one compares within :data:`RELATIVE` (1e-9: far below any figure a page shows, far above a
CPU's last-bit difference, ~1e-15) — through :func:`mismatches`, the one place that says so. Checks
that only **read** committed values (a page rendered from a report, a headline copied from it) stay
exact: there no CPU is involved.

Everything that is not a float — strings, booleans, integers, ``None``, the keys of a mapping, the
length of a list — must be equal. NaN equals NaN.
"""

from __future__ import annotations

import math

RELATIVE = 1e-9
"""The relative tolerance of a recomputed float against its committed value."""
ABSOLUTE = 1e-12
"""The absolute tolerance beside it, for values that should be 0 and come out as ±1e-17."""


def close(recomputed: float, committed: float) -> bool:
    """Whether two floats are the same figure up to a CPU's last bits (:data:`RELATIVE`, :data:`ABSOLUTE`)."""
    if math.isnan(recomputed) or math.isnan(committed):
        return math.isnan(recomputed) and math.isnan(committed)
    return math.isclose(recomputed, committed, rel_tol=RELATIVE, abs_tol=ABSOLUTE)


def mismatches(recomputed: object, committed: object, where: str = "") -> list[str]:
    """Every place where nested ``recomputed`` (dicts, lists, numbers, strings) differs from ``committed``:
    floats beyond :func:`close`, anything else at all. Each entry names the dotted key (``fits.a.b``,
    ``rows[2]``) and both values."""
    name = where or "(the value)"
    if isinstance(committed, dict) and isinstance(recomputed, dict):
        out = [f"{_join(where, k)}: only recomputed" for k in recomputed if k not in committed]
        out += [f"{_join(where, k)}: only committed" for k in committed if k not in recomputed]
        for key in committed:
            if key in recomputed:
                out += mismatches(recomputed[key], committed[key], _join(where, key))
        return out
    if isinstance(committed, (list, tuple)) and isinstance(recomputed, (list, tuple)):
        if len(committed) != len(recomputed):
            return [f"{name}: {len(recomputed)} items recomputed, {len(committed)} committed"]
        return [m for i, (a, b) in enumerate(zip(recomputed, committed)) for m in mismatches(a, b, f"{where}[{i}]")]
    if _float_pair(recomputed, committed):
        if close(float(recomputed), float(committed)):
            return []
        relative = abs(recomputed - committed) / max(abs(committed), ABSOLUTE)
        return [f"{name}: recomputed {recomputed!r}, committed {committed!r} (relative difference {relative:.1e} "
                f"> {RELATIVE:g})"]
    if type(recomputed) is not type(committed) or recomputed != committed:
        return [f"{name}: recomputed {recomputed!r}, committed {committed!r}"]
    return []


def _float_pair(a: object, b: object) -> bool:
    """Two numbers of which at least one is a float (JSON writes 2.0 as 2.0, yet a refit may give an int)."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
    return numbers and (isinstance(a, float) or isinstance(b, float))


def _join(where: str, key: object) -> str:
    return f"{where}.{key}" if where else str(key)
