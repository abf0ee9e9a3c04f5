"""Strict, typed configuration (DESIGN §10, STYLE 2).

Each stage's section of ``params.yaml`` loads into a dataclass defined next to the code that uses
it. Loading is strict: an unknown key, a missing section, a value of the wrong type or out of range
raises :class:`ConfigError` naming the full dotted key and what is allowed. Nothing falls back to a
default silently for a misspelt key.

Run ``python -m lookahead.config params.yaml`` to validate every section at once (the registry of
sections lives in :mod:`lookahead.sections`, so that adding a stage does not touch this module and
rerun every stage that imports it).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

T = TypeVar("T")

# Bounds every number in a params file obeys, whatever its key: beyond them a value is a typo (a
# step count no run reaches, a size no memory holds, an overflowing float), refused before any work.
MAX_INT = 2**31 - 1
MAX_FLOAT = 1e12

class LookaheadError(Exception):
    """An error the user can fix (bad params, missing data, diverged training): a stage prints
    its message alone, without a traceback, and exits non-zero."""


class ConfigError(LookaheadError, ValueError):
    """A params value is unknown, missing, of the wrong type or out of range."""

    def __init__(self, key: str, message: str):
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}" if key else message)

    def under(self, prefix: str) -> ConfigError:
        """The same error with ``prefix`` prepended to its key."""
        key = f"{prefix}.{self.key}" if self.key else prefix
        return ConfigError(key, self.message)


def require(condition: bool, key: str, message: str) -> None:
    """Raise ``ConfigError(key, message)`` unless ``condition`` holds (for ``__post_init__``)."""
    if not condition:
        raise ConfigError(key, message)


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


def to_dict(cfg: Any) -> dict[str, Any]:
    """A dataclass config as plain YAML/JSON-able data (tuples become lists)."""
    def plain(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v

    return plain(dataclasses.asdict(cfg))


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


def parse_stage_args(description: str, paths: dict[str, str], argv: list[str] | None = None) -> argparse.Namespace:
    """The shared command line of a stage script: ``--params``, ``--dry-run`` and its paths.

    ``paths`` maps each path option (without ``--``) to its help text. dvc.yaml passes them all;
    they may be left out only with ``--dry-run``.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    parser.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    for name, help_text in paths.items():
        parser.add_argument(f"--{name}", help=help_text)
    args = parser.parse_args(argv)
    missing = [f"--{n}" for n in paths if getattr(args, n.replace("-", "_")) is None]
    if missing and not args.dry_run:
        parser.error(f"missing {', '.join(missing)} (dvc.yaml passes them)")
    # the paths whose help says "(input": the stage checks them (lookahead.inputs) once its params are valid
    args.inputs = {n: getattr(args, n.replace("-", "_")) for n, help_text in paths.items() if "(input" in help_text}
    return args


def first_vector_math_call() -> None:
    """Make the process's first call into MKL's vector math library (VML) here, on one thread.

    torch's CPU build computes float ``cos``, ``sin``, ``exp``, ``log``, ... with MKL VML. Measured
    on the default pipeline (phase 1's dense NLL, 2 threads): when the process's first VML call is
    a parallel one — the LM's rotary ``cos`` over 8 × 128 × 32 values, split over both threads — in
    about 1 process in 8 one thread gets low-accuracy values (error up to 1.5e-4 against 3.5e-8 on
    the next call, though torch asks VML for its high-accuracy mode), and the stage's figures change
    in their last bits. After one single-threaded call first, 48 of 48
    processes were exact. A process that has not imported torch makes no VML call and is left alone.
    ``benchmarks/first_vml_call.py`` measures it.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return
    one = torch.ones(1)
    for op in (torch.cos, torch.sin, torch.exp, torch.log, torch.tanh, torch.sqrt, torch.erf):
        op(one)


def cli(main) -> None:
    """Run a stage's ``main()``; a :class:`LookaheadError` prints one message and exits 2."""
    first_vector_math_call()
    try:
        main()
    except LookaheadError as err:
        kind = "params" if isinstance(err, ConfigError) else type(err).__name__
        print(f"error ({kind}): {err}", file=sys.stderr)
        sys.exit(2)


def print_config(configs: dict[str, Any]) -> None:
    """Print resolved configs (dataclasses, or plain values for single keys) as YAML (``--dry-run``)."""
    plain = {k: to_dict(v) if dataclasses.is_dataclass(v) else v for k, v in configs.items()}
    yaml.safe_dump(plain, sys.stdout, sort_keys=False)


def main(argv: list[str] | None = None) -> int:
    """``python -m lookahead.config [params.yaml]``: validate every section; one line, exit 2 on error."""
    from lookahead.sections import validate_all

    parser = argparse.ArgumentParser(description="Validate every section of a params file.")
    parser.add_argument("params", nargs="?", default="params.yaml")
    args = parser.parse_args(argv)
    try:
        validate_all(args.params)
    except ConfigError as err:
        where = f"{args.params}: " if err.key else ""  # file-level messages name the file already
        print(f"error (params): {where}{err}", file=sys.stderr)
        return 2
    print(f"{args.params}: ok")
    return 0


if __name__ == "__main__":
    # Run as ``-m``, this file is ``__main__`` while :mod:`lookahead.sections` imports it again as
    # ``lookahead.config``: two ConfigError classes. Delegate to the imported module so that its
    # ``except ConfigError`` catches what the section classes raise.
    from lookahead.config import main as _main

    sys.exit(_main())
