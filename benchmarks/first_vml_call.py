"""How often a process's first LM forward gives other floats than its second, with and without
`lookahead.core.cli.first_vector_math_call()` made first (every stage makes it, through `cli`).

Each child process loads the pipeline's base LM as phase 1 does, makes one small matmul (phase 1's
predictor makes its first product there), then runs the same val batch of the context cache twice and
reports whether the two logits are bitwise equal. Children of both kinds alternate, so machine load
falls on both alike. Needs `models/base` and `data/contexts` (`dvc repro contexts` or `dvc pull`).
Prints one JSON line; ~6 s per child.

    python benchmarks/first_vml_call.py [--children 16]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def child(warm: bool) -> None:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from lookahead.artifacts.contexts import ContextCache
    from lookahead.core.cli import first_vector_math_call

    lm = AutoModelForCausalLM.from_pretrained("models/base", dtype=torch.float32).eval().requires_grad_(False)
    if warm:
        first_vector_math_call()
    _ = torch.randn(17, 4) @ torch.randn(4, 17)
    windows, _ = ContextCache("data/contexts").batch("val", np.arange(8))
    with torch.no_grad():
        first = lm(input_ids=windows[:, :-1]).logits
        second = lm(input_ids=windows[:, :-1]).logits
    print(json.dumps({"differ": int((first != second).sum())}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=16, help="child processes of each kind (default 16)")
    parser.add_argument("--child", choices=["cold", "warm"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child == "warm")
    if args.children < 1:
        parser.error("--children must be at least 1")
    counts = {"cold": 0, "warm": 0}
    for _ in range(args.children):
        for kind in counts:
            out = subprocess.run([sys.executable, __file__, "--child", kind], check=True, capture_output=True, text=True)
            counts[kind] += json.loads(out.stdout.strip().splitlines()[-1])["differ"] > 0
    print(json.dumps({
        "children_per_kind": args.children,
        "first_forward_differs_without_first_call": counts["cold"],
        "first_forward_differs_with_first_call": counts["warm"],
    }))


if __name__ == "__main__":
    main()
