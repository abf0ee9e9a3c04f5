"""How dvc.yaml starts the training stages (docs/scaling.md).

``launch.train`` is interpolated into the command of every training stage (``${launch.train}
stages/base.py …``): ``python`` runs one process; ``accelerate launch --multi_gpu --num_processes N``
runs N data-parallel processes — one per GPU, or N CPU processes over gloo where there is no GPU.
The training loop (:mod:`lookahead.train.loop`) splits each global batch between the processes, so
results do not depend on N beyond floating-point summation order.
"""

from __future__ import annotations

import dataclasses

from lookahead.core.errors import require

LAUNCHERS = ("python", "accelerate launch", "torchrun")


@dataclasses.dataclass
class LaunchConfig:
    """The command that runs a training stage's script."""

    train: str = "python"
    """`python`, or `accelerate launch --multi_gpu --num_processes N [options]` (or `torchrun …`)."""

    def __post_init__(self) -> None:
        words = self.train.split()
        require(any(words[: len(p.split())] == p.split() for p in LAUNCHERS), "train",
                f"must start with one of {', '.join(repr(p) for p in LAUNCHERS)}; got {self.train!r}")
        if words[:1] == ["python"]:
            require(words == ["python"], "train", f"runs the stage script itself: just 'python'; got {self.train!r}")
        if words[:2] == ["accelerate", "launch"] and "--num_processes" in words:
            i = words.index("--num_processes")
            n = words[i + 1] if i + 1 < len(words) else ""
            require(n.isdigit() and int(n) >= 1, "train", f"--num_processes needs a count >= 1; got {n!r}")
            require(int(n) == 1 or "--multi_gpu" in words, "train",
                    f"accelerate launch starts a single process without --multi_gpu (on CPU too, where it "
                    f"uses gloo): add it to run {n}; got {self.train!r}")
