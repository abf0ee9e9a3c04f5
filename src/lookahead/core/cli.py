"""The command line every stage script shares: its path options, ``--params`` and ``--dry-run``,
and :func:`cli`, which runs a stage's ``main()`` and turns a :class:`LookaheadError` into one line."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

import yaml

from lookahead.core.config import to_dict
from lookahead.core.errors import ConfigError, LookaheadError


def parse_stage_args(description: str, paths: dict[str, str], argv: list[str] | None = None) -> argparse.Namespace:
    """The shared command line of a stage script: ``--params``, ``--dry-run`` and its paths.

    ``paths`` maps each path option (without ``--``) to its help text. dvc.yaml passes them all;
    they may be left out only with ``--dry-run``. A help text that says "(input" puts the path in
    ``args.inputs`` (checked before any work), one that says "(output" in ``args.outputs``.
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
    # the paths whose help says "(input": the stage checks them (lookahead.core.inputs) once its params are valid
    args.inputs = {n: getattr(args, n.replace("-", "_")) for n, help_text in paths.items() if "(input" in help_text}
    # the paths whose help says "(output": what the stage's writers write, by attribute name (dashes as `_`)
    args.outputs = {n.replace("-", "_"): getattr(args, n.replace("-", "_"))
                    for n, help_text in paths.items() if "(output" in help_text}
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
