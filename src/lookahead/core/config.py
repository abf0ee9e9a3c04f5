"""Strict, typed configuration (docs/troubleshooting.md, STYLE 2).

Each stage's section of ``params.yaml`` loads into a dataclass defined next to the code that uses
it. Loading is strict: an unknown key, a missing section, a value of the wrong type or out of range
raises :class:`ConfigError` naming the full dotted key and what is allowed. Nothing falls back to a
default silently for a misspelt key.

Run ``python -m lookahead.tools.params params.yaml`` to validate every section at once (the registry of
sections lives in :mod:`lookahead.tools.params`, so that adding a stage does not touch this module and
rerun every stage that imports it).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

from lookahead.core.errors import ConfigError

T = TypeVar("T")

# Bounds every number in a params file obeys, whatever its key: beyond them a value is a typo (a
# step count no run reaches, a size no memory holds, an overflowing float), refused before any work.
MAX_INT = 2**31 - 1
MAX_FLOAT = 1e12


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; return it (converted where lossless)."""
    origin = get_origin(tp)
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise ConfigError(key, f"must be one of {', '.join(repr(a) for a in allowed)}; got {value!r}")
        return value
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, key)
            except ConfigError as err:
                errors.append(err.message)
        raise ConfigError(key, " or ".join(errors))
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, f"must be a list; got {value!r}")
        (item,) = get_args(tp)[:1] or (Any,)
        items = [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(key, f"must be a mapping of {_type_name(tp)} fields; got {value!r}")
        try:
            return from_dict(tp, value)
        except ConfigError as err:
            raise err.under(key) from None
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"must be true or false; got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"must be an integer; got {value!r}")
        if abs(value) > MAX_INT:
            raise ConfigError(key, f"must be at most {MAX_INT} in magnitude; got {value}")
        return value
    if tp is float:
        # YAML 1.1 reads `3e-4` (no dot) as a string: accept numeric strings, reject anything else.
        if isinstance(value, bool):
            raise ConfigError(key, f"must be a number; got {value!r}")
        number = None
        if isinstance(value, (int, float)):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise ConfigError(key, f"must be a number; got {value!r}")
        if not math.isfinite(number) or abs(number) > MAX_FLOAT:
            raise ConfigError(key, f"must be a finite number at most {MAX_FLOAT:g} in magnitude; got {value!r}")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"must be a string; got {value!r}")
        return value
    raise TypeError(f"unsupported config annotation {tp!r} for {key}")


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build dataclass ``cls`` from ``data`` strictly; errors name keys relative to ``cls``."""
    if not isinstance(data, dict):
        raise ConfigError("", f"must be a mapping; got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(unknown[0], f"unknown key; allowed keys are {', '.join(sorted(fields))}")
    kwargs = {}
    for name, field in fields.items():
        if name in data:
            kwargs[name] = _coerce(data[name], hints[name], name)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(name, f"missing (required, type {_type_name(hints[name])})")
    return cls(**kwargs)


def read_params(path: str | Path) -> dict[str, Any]:
    """Read a params file: a mapping of sections."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("", f"params file {path} not found")
    try:
        with path.open(encoding="utf-8") as f:
            params = yaml.safe_load(f) or {}
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        raise ConfigError("", f"{path} is not valid YAML{at}: {getattr(err, 'problem', None) or err}") from None
    if not isinstance(params, dict):
        raise ConfigError("", f"{path} must hold a mapping of sections")
    return params


def load_section(path: str | Path, section: str, cls: type[T], partial: bool = False) -> T:
    """Load and validate one section of a params file into its dataclass.

    With ``partial=True``, ``cls`` is a view of some of the section's keys (e.g. the tokenizer
    stage reads only ``base.source``...): keys that are not fields of ``cls`` are left for the
    section's own stage to validate.
    """
    params = read_params(path)
    if section not in params:
        raise ConfigError(section, f"section missing from {path}")
    values = params[section]
    if partial and isinstance(values, dict):
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in values.items() if k in names}
    try:
        return from_dict(cls, values)
    except ConfigError as err:
        raise err.under(section) from None


OMIT_DEFAULT = {"omit_default": True}
"""Field metadata of a key added after outputs embedding its config were made: :func:`to_dict`
leaves it out at its default, so the saved configs (and the files and checkpoints keyed on them) of
a run that does not use it stay byte-identical."""


def _default(f: dataclasses.Field) -> Any:
    """A field's default value (a fresh one from its factory)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def to_dict(cfg: Any) -> dict[str, Any]:
    """A dataclass config as plain YAML/JSON-able data (tuples become lists; a field marked
    :data:`OMIT_DEFAULT` is left out at its default)."""
    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)
                    if not (f.metadata.get("omit_default") and getattr(v, f.name) == _default(f))}
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return copy.deepcopy(v)

    return plain(cfg)


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (for MLflow params)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            flat.update(flatten(value, name))
        else:
            flat[name] = value
    return flat
