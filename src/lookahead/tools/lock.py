"""The tested environment, pinned: `make lock` writes constraints.txt from the virtualenv the suite
passes in, and `make setup` installs with it (``pip install -c constraints.txt``), so that a fresh clone
next month trains its base LM with the committed run's libraries, not whatever the ranges in
pyproject.toml resolve to then. The CPU, which changes float results as well, cannot be pinned: every
run records it (:mod:`lookahead.core.environment`).

    python -m lookahead.tools.lock constraints.txt          # write it (make lock)
    python -m lookahead.tools.lock constraints.txt --check  # exit 1 where the installed versions differ
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from lookahead.core.atomic import atomic_file

HEADER = """\
# The versions the test suite passes with (`make lock` writes this file from the virtualenv; `make setup`
# installs with it: pip install -c constraints.txt). Local version labels are dropped: torch==2.13.0
# admits the CPU build 2.13.0+cpu and PyPI's own.
"""

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;+]+)(\+\S+)?$")


def normalise(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lines) -> dict[str, str]:
    """The plain pins (``name==version``) among ``lines``, comments dropped: name → version, local
    labels dropped. A line that is no plain pin (a direct URL) is left to pyproject.toml's ranges."""
    out = {}
    for line in lines:
        match = PIN.match(line.split("#", 1)[0].strip())
        if match:
            out[normalise(match.group(1))] = match.group(2)
    return out


def installed(python: str = sys.executable) -> dict[str, str]:
    """Every distribution of ``python``'s environment but the editable project (:func:`pins`)."""
    out = subprocess.run([python, "-m", "pip", "freeze", "--exclude-editable", "--disable-pip-version-check"],
                         capture_output=True, text=True, check=True).stdout
    return pins(out.splitlines())


def read(path: Path) -> dict[str, str]:
    """A constraints file's pins: name → version."""
    return pins(path.read_text().splitlines())


def write(path: Path, pins: dict[str, str]) -> None:
    with atomic_file(path) as tmp:
        tmp.write_text(HEADER + "".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))


def differences(pinned: dict[str, str], have: dict[str, str]) -> list[str]:
    """What the environment has that the pins do not say: another version, or a pin not installed."""
    return [f"{name}: pinned {version}, installed {have.get(name, 'nothing')}"
            for name, version in sorted(pinned.items()) if have.get(name) != version]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="the constraints file (constraints.txt)")
    parser.add_argument("--check", action="store_true", help="compare the installed versions with it instead")
    args = parser.parse_args(argv)
    have = installed()
    if args.check:
        diff = differences(read(args.path), have)
        for line in diff:
            print(line, file=sys.stderr)
        return 1 if diff else 0
    write(args.path, have)
    print(f"wrote {args.path}: {len(have)} pinned versions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
