"""The tested environment: constraints.txt pins what the suite runs with (make lock, make setup), and
every run records its library versions and CPU (lookahead.core.environment)."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib

from packaging.requirements import Requirement

from lookahead.core import environment
from lookahead.tools import lock
from tests.conftest import REPO


def test_the_suite_runs_with_the_versions_constraints_txt_pins():
    """`make setup` installed with the lock: every pinned version is the installed one, so the suite's
    verdict is the lock's (a dependency changed without `make lock` fails here)."""
    pinned = lock.read(REPO / "constraints.txt")
    assert lock.differences(pinned, lock.installed()) == []
    assert {"torch", "transformers", "numpy", "dvc", "mlflow"} <= set(pinned)


def test_every_dependency_is_pinned_inside_its_range():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pinned = lock.read(REPO / "constraints.txt")
    for line in [*project["dependencies"], *project["optional-dependencies"]["dev"]]:
        req = Requirement(line)
        name = lock.normalise(req.name)
        assert name in pinned, f"{name} is not pinned: run `make lock`"
        assert req.specifier.contains(pinned[name], prereleases=True), (line, pinned[name])


def test_a_pin_with_a_local_label_admits_both_builds(tmp_path):
    path = tmp_path / "constraints.txt"
    lock.write(path, {"torch": "2.13.0", "Some_Pkg": "1.0"})
    assert lock.read(path) == {"torch": "2.13.0", "some-pkg": "1.0"}
    assert re.search(r"^torch==2\.13\.0$", path.read_text(), re.M)
    assert lock.PIN.match("torch==2.13.0+cpu").group(2) == "2.13.0"  # freeze's CPU build, as pinned
    assert lock.differences({"torch": "2.13.0"}, {"torch": "2.14.1"}) == ["torch: pinned 2.13.0, installed 2.14.1"]


def test_the_cpu_record_names_its_instruction_sets(tmp_path):
    """Read from /proc/cpuinfo's text: an AVX2 machine without AVX-512 (the one that trained another base
    LM) is told apart from an AVX-512 one."""
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Test CPU @ 2.0GHz\nflags\t\t: fpu sse4_2 avx avx2 fma\n\n"
                    "processor\t: 1\nmodel name\t: Test CPU @ 2.0GHz\nflags\t\t: fpu sse4_2 avx avx2 fma\n")
    cpu = environment.cpu(info)
    assert cpu["model"] == "Test CPU @ 2.0GHz" and cpu["flags"] == "sse4_2 avx avx2 fma"
    info.write_text("model name\t: Other\nflags\t\t: avx avx2 avx512f avx512bw avx512vl\n")
    assert "avx512f" in environment.cpu(info)["flags"].split()


def test_the_record_flattens_to_tags():
    env = environment.environment()
    assert env["libraries"]["transformers"] == importlib.metadata.version("transformers")
    tags = environment.as_tags(env)
    assert tags["env.libraries.numpy"] == importlib.metadata.version("numpy")
    assert tags["env.cpu.torch_capability"] == env["cpu"]["torch_capability"]


def test_the_record_does_not_load_torch_into_a_stage_that_never_does():
    """corpus, tokenizer and wordnet never import torch: the record names torch's kernels only where the
    process already loaded it, rather than add torch's import to those stages' start-up."""
    probe = ("import sys\nfrom lookahead.core.environment import environment\nenv = environment()\n"
             "assert 'torch' not in sys.modules, 'torch imported'\nprint(env['cpu']['torch_capability'])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "torch not loaded"
