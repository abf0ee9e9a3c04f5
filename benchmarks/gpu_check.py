"""What a lent GPU should measure, in one prepared run (``make gpu-check``; ≤ 5 min on one H100).

Needs torch and transformers alone (no DVC, MLflow, nltk or network; run from the repository root
with ``PYTHONPATH=src``: ``core.tracking`` is never imported). Prints one JSON line and writes it to
``benchmarks/results/gpu.json`` (``--out``), which the results page reads where present:

- ``exactness``: the execution plan against the plain per-head reference (tests/reference_head_graph.py)
  and FlexAttention against SDPA, per-token topologies, both skip modes, in fp32 and bf16, each
  with its max abs logit difference and the tolerance it is held to (:data:`TOLERANCE`);
- ``runtime``: ``benchmarks/runtime.py`` on CUDA in bf16 at T = 2048 and 8192, both skip modes and
  both attention backends, against the FLOP ideal, on random models at the default architecture
  and at the 1B shape (trained weights are DVC outputs that do not travel); at the 1B shape also
  the compiled decode step (``lookahead.graph.decode``, CUDA graphs: ``mode="reduce-overhead"``)
  at 50 % off, batch 4, against stock decoding compiled the same way (``decode_T<T>_B4_...``);
- ``training``: one optimiser step of phase 1 and of phase 2 at the 1B shape with random weights
  (``from_config``, no download), with the 1B profile's micro-batches and checkpointing, bf16
  autocast: peak memory (``torch.cuda.max_memory_allocated``) beside ``make estimate``'s figure.

``--dry-run`` runs the same plan at toy sizes on whatever device there is (the CPU in CI: a test
keeps the script from rotting); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from benchmarks.activation_memory import lm_of, stage_loss  # noqa: E402
from lookahead.tools.estimate import Arch  # noqa: E402

TOLERANCE = {"float32": 1e-4, "bfloat16": 0.1}
"""Max abs logit difference allowed against the reference: fp32 summation order; bf16's 8-bit
mantissa over a few layers (logits of order 1–10)."""
PROFILE = ROOT / "profiles" / "olmo2-1b.yaml"
SHAPE_1B = "16,16,2048,8192"


def exactness(device, positions: int = 24) -> dict:
    """Plan vs the plain reference and Flex vs SDPA, per-token gates, both skip modes, fp32 and bf16,
    on 2 windows of ``positions`` tokens."""
    from lookahead.graph import flex
    from lookahead.graph.nodes import allowed_mask, n_nodes
    from lookahead.graph.plan import gated_forward
    from tests.reference_head_graph import reference_forward

    out = {}
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        lm = lm_of(Arch(layers=2, heads=4, hidden=64, ffn=128, vocab=256), device=device, dtype=dtype).eval()
        ids = torch.randint(0, 256, (2, positions), generator=gen).to(device)
        n = n_nodes(2, 4)
        gates = (torch.rand(2, positions, n, generator=gen) > 0.5).float().to(device)
        gates[..., 0] = 1
        adjacency = allowed_mask(2, 4).to(device).float() * gates[..., :, None]
        for skip in ("full", "query"):
            with torch.no_grad():
                plan = gated_forward(lm, ids, gates.to(dtype), skip).logits.float()
                # the reference in fp32, on the same (for bf16: bf16-rounded) weights
                reference = reference_forward(copy.deepcopy(lm).float(), ids, adjacency, gates, skip)
                row = {"plan_vs_reference": (plan - reference).abs().max().item()}
                if flex.available(device):
                    with flex.use("flex"):
                        flexed = gated_forward(lm, ids, gates.to(dtype), skip).logits.float()
                    with flex.use("sdpa"):
                        sdpa = gated_forward(lm, ids, gates.to(dtype), skip).logits.float()
                    row["flex_vs_sdpa"] = (flexed - sdpa).abs().max().item()
                else:
                    row["flex_vs_sdpa"] = None  # FlexAttention does not compile here
            row["tolerance"] = TOLERANCE[name]
            row["ok"] = all(v is None or v <= TOLERANCE[name] for k, v in row.items() if k.endswith(("reference", "sdpa")))
            out[f"{name}_{skip}"] = row
    return out


def runtime(device: str, dry: bool) -> dict:
    """``benchmarks/runtime.py`` at the default architecture and the 1B shape, bf16 (in its own process)."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())["base"]["arch"]
    default = f"{params['n_layers']},{params['n_heads']},{params['hidden_size']},{params['intermediate_size']}"
    out = {}
    for label, arch in (("default", default),) if dry else (("default", default), ("1b", SHAPE_1B)):
        if dry:  # the compiled decode step is left to tests/test_decode.py on the CPU: its compilation is the cost
            args = ["--arch", "2,2,32,64", "--seqs", "32", "--tokens", "64", "--gen-batch", "1", "--new", "2", "--rounds", "1",
                    "--system-malloc", "--decode-batches", ""]  # no re-execution: the toy run's timings mean nothing
        else:  # the compiled decode step (CUDA graphs) against compiled stock decoding at the 1B shape only
            args = ["--arch", arch, "--seqs", "2048,8192", "--tokens", "8192", "--gen-batch", "4", "--new", "8",
                    "--rounds", "3", "--decode-batches", "4" if label == "1b" else "", "--decode-fractions", "50"]
        dtype = "float32" if dry and device == "cpu" else "bfloat16"
        cmd = [sys.executable, str(ROOT / "benchmarks" / "runtime.py"), *args, "--device", device, "--dtype", dtype]
        tic = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        if proc.returncode != 0:
            out[label] = {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
            continue
        out[label] = {"arch": arch, "seconds": round(time.perf_counter() - tic, 1),
                      **json.loads(proc.stdout.strip().splitlines()[-1])}
    return out


def training(device, dry: bool) -> dict:
    """One optimiser step of phase 1 and of phase 2 at the 1B shape (random weights), with the 1B
    profile's micro-batches and checkpointing: peak memory beside the estimate's. Each stage's loss
    is the one ``benchmarks/activation_memory.py`` measures (``stage_loss``), at the profile's router."""
    from lookahead.core.checkpointing import activation_checkpointing
    from lookahead.tools.estimate import GIB, PUBLISHED

    profile = yaml.safe_load(PROFILE.read_text())
    arch = Arch(**PUBLISHED[profile["base"]["model"]])
    context = profile["base"]["arch"]["context_length"]
    # (the training loop's config, lookahead.train.loop.TrainConfig, would bring the tracking modules)
    p1, p2 = (SimpleNamespace(**{"accumulate": 1, "checkpoint_activations": False, **profile[name]["train"]})
              for name in ("phase1", "phase2"))
    if dry:  # toy sizes, the same code
        arch, context = Arch(layers=2, heads=2, hidden=32, ffn=64, vocab=256), 16
        p1 = SimpleNamespace(batch_size=2, accumulate=2, checkpoint_activations=False, precision="bf16")
        p2 = SimpleNamespace(batch_size=4, accumulate=2, checkpoint_activations=True, precision="bf16")
    estimate = _estimate()
    router = (profile["predictor"]["rank"], profile["predictor"]["hidden"])
    out = {}
    for stage, cfg in (("phase1", p1), ("phase2", p2)):
        micro = cfg.batch_size // cfg.accumulate
        # the context cache's features: the Qwen3 embedding's 1024
        loss, modules = stage_loss(stage, arch, micro, context, device, context_dim=1024, router=router)
        trained = [p for m in modules for p in m.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trained, lr=1e-5)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        tic = time.perf_counter()
        with activation_checkpointing(cfg.checkpoint_activations, *modules):
            for _ in range(cfg.accumulate):  # the same windows each time: memory, not learning, is measured
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
                    value = loss()
                (value / cfg.accumulate).backward()
                del value
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        row = {"micro_batch": micro, "accumulate": cfg.accumulate, "checkpoint_activations": cfg.checkpoint_activations,
               "step_seconds": round(time.perf_counter() - tic, 2), "estimated_gib": round(estimate[stage], 2)}
        if device.type == "cuda":
            row["peak_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 2)
            row["peak_over_estimate"] = round(row["peak_gib"] / estimate[stage], 3)
        out[stage] = row
        del loss, modules, optimizer, trained
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def _estimate() -> dict[str, float]:
    """``make estimate``'s memory per stage for the 1B profile (its published shape)."""
    from lookahead.tools.estimate import estimate
    from lookahead.tools.params import validate_all

    est = estimate(validate_all(PROFILE))
    return {row["stage"]: row["memory_gib"] for row in est["stages"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="toy sizes on any device (CI: the CPU)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu.json"),
                        help="where the JSON line is written ('-': nowhere)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.dry_run:
        raise SystemExit("gpu_check: no CUDA device here; --dry-run runs the plan at toy sizes on the CPU")
    tic = time.perf_counter()
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "dry_run": args.dry_run,
              "torch": torch.__version__, "exactness": exactness(device, 8 if args.dry_run else 24),
              "runtime": runtime(device.type, args.dry_run), "training": training(device, args.dry_run)}
    result["seconds"] = round(time.perf_counter() - tic, 1)
    line = json.dumps(result)
    print(line)
    if args.out != "-" and not args.dry_run:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(line + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
