"""Fault injection, bad params (issue 17, first part): every key of every section of a profile is
given values of the wrong type, out of range, empty, huge, NaN and inf, plus an unknown key per
section, an unknown section and a few incompatible combinations; each edited profile goes through
the same check `make repro` and every stage run first (`python -m lookahead.config`: each section
into its dataclass). A fault is
*refused cleanly* when that check raises ConfigError naming the edited key; accepted values and
any other exception are failures, named in the JSON line.

    python benchmarks/faults.py [--profile profiles/tiny.yaml]

Prints one JSON line: faults_injected, faults_survived (= refused cleanly), bad_inputs_tried,
clear_errors, per-kind counts and the failures list. The other fault kinds of issue 17 (kills,
corrupt inputs, resources, remotes) are not in it yet.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import tempfile
from pathlib import Path

import yaml

from lookahead.config import ConfigError, from_dict
from lookahead.sections import SECTIONS, section_class, validate_all

HUGE_INT, HUGE_FLOAT = 10**12, 1e30


def leaves(tree: dict, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], object]]:
    """(path, value) of every non-mapping value of a params tree."""
    out = []
    for key, value in tree.items():
        if isinstance(value, dict):
            out += leaves(value, prefix + (key,))
        else:
            out.append((prefix + (key,), value))
    return out


def bad_values(value) -> dict[str, object]:
    """The bad values tried for a key whose profile value is ``value``, by kind."""
    if isinstance(value, bool):
        return {"wrong_type": "yes", "empty": None}
    if isinstance(value, (int, float)):
        return {"wrong_type": "abc", "empty": None, "out_of_range": -10**6,
                "huge": HUGE_INT if isinstance(value, int) else HUGE_FLOAT, "nan": math.nan, "inf": math.inf}
    if isinstance(value, str):
        return {"wrong_type": 12345, "empty": ""}
    if isinstance(value, list):
        return {"wrong_type": "not a list", "empty": [], "item_wrong_type": [{"x": 1}]}
    return {"wrong_type": {"unexpected": "mapping"}}  # null-able keys (null in the profile)


def edited(params: dict, path: tuple[str, ...], value) -> dict:
    out = copy.deepcopy(params)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def check(params: dict, key: str, tmp: Path) -> tuple[bool, str]:
    """(refused cleanly, what happened) for one edited params tree: the edited section is loaded as
    `python -m lookahead.config` loads it (a whole file only for an unknown section, where that
    check is the file-level one)."""
    section = key.split(".")[0]
    try:
        if section in SECTIONS:
            try:
                from_dict(section_class(section), params[section])
            except ConfigError as err:
                raise err.under(section) from None
        else:
            path = tmp / "params.yaml"
            path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
            validate_all(path)
    except ConfigError as err:
        return (err.key == key or err.key.startswith(key + ".") or err.key.startswith(key + "[")), f"ConfigError({err.key})"
    except Exception as err:  # noqa: BLE001 - any other exception is an unclear error
        return False, f"{type(err).__name__}: {str(err)[:120]}"
    return False, "accepted"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="profiles/tiny.yaml")
    args = parser.parse_args()
    params = yaml.safe_load(Path(args.profile).read_text(encoding="utf-8"))
    validate_all(args.profile)  # the profile itself is valid

    cases: list[tuple[str, str, dict]] = []  # (kind, key, params)
    for path, value in leaves(params):
        key = ".".join(path)
        for kind, bad in bad_values(value).items():
            if bad == value:  # not a fault for this key
                continue
            cases.append((kind, key, edited(params, path, bad)))
    for section in params:
        cases.append(("unknown_key", f"{section}.no_such_key", edited(params, (section, "no_such_key"), 1)))
    cases.append(("unknown_section", "no_such_section", {**params, "no_such_section": {}}))
    incompatible = {
        "phase1.tau_end": {"phase1": {**params["phase1"], "tau_start": 0.5, "tau_end": 1.0}},
        "phase1.hard_from_step": {"phase1": {**params["phase1"], "hard_from_step": params["phase1"]["train"]["steps"]}},
        "phase2.tau_end": {"phase2": {**params["phase2"], "tau_start": 0.5, "tau_end": 1.0}},
    }
    for key, change in incompatible.items():
        cases.append(("incompatible", key, {**params, **change}))

    by_kind: dict[str, dict[str, int]] = {}
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, key, case in cases:
            ok, what = check(case, key, Path(tmp))
            counts = by_kind.setdefault(kind, {"tried": 0, "refused": 0})
            counts["tried"] += 1
            counts["refused"] += ok
            if not ok:
                failures.append(f"{key} ({kind}): {what}")
    tried = len(cases)
    clear = tried - len(failures)
    print(json.dumps({"profile": args.profile, "faults_injected": tried, "faults_survived": clear,
                      "bad_inputs_tried": tried, "clear_errors": clear, "keys": len(leaves(params)),
                      "by_kind": by_kind, "failures": failures}))


if __name__ == "__main__":
    main()
