"""Bad params, fuzzed: every key of every section of a params file gets values of the wrong type,
empty, out of range, huge, NaN and inf, plus unknown keys and sections and incompatible pairs; each
must be refused by the check every stage runs before work, with the key named."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
import yaml

from lookahead.tools.faults import leaves, param_faults, refused_cleanly
from tests.conftest import REPO


@pytest.mark.parametrize("params_file", ["profiles/tiny.yaml", "params.yaml"])
def test_every_bad_value_of_every_key_is_refused_naming_the_key(params_file):
    params = yaml.safe_load((REPO / params_file).read_text(encoding="utf-8"))
    cases = param_faults(params)
    kinds = Counter(kind for kind, _, _ in cases)
    # every key is tried (one wrong type each), numbers with every numeric kind
    assert kinds["wrong_type"] == len(leaves(params)) >= 150
    assert kinds["nan"] == kinds["inf"] == kinds["huge"] >= 100 and kinds["unknown_key"] == len(params)
    failures = []
    for kind, key, case in cases:
        ok, what = refused_cleanly(case, key)
        if not ok:
            failures.append(f"{key} ({kind}): {what}")
    assert not failures, failures


def test_a_fuzzed_value_stops_a_stage_before_work(tmp_path):
    """The same refusal from a stage script: one line naming the key, exit 2, nothing written."""
    params = yaml.safe_load((REPO / "profiles" / "tiny.yaml").read_text(encoding="utf-8"))
    params["init"]["softmax_temp"] = float("inf")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(REPO / "stages" / "init.py"), "--params", "params.yaml", "--base", "b", "--wordnet", "w",
         "--heads", "h", "--out", "out/init.safetensors", "--metrics", "m.json", "--report", "r.json"],
        cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error (params): init.softmax_temp: must be a finite number"), proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]
