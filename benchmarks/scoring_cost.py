"""What the scoring set costs each stage (issue 41): the final figures of phase 1, phase 2 and both
controls score ``windows.per_role`` test windows (256 at the default: 32 768 positions) instead of
the context cache's 32, every seed. One process, the default run's outputs (``dvc repro`` first),
side by side: each stage's final-scoring passes timed on the scoring set and on 32 windows, times
the stage's seeds. Prints one JSON line: seconds per stage on each set and the difference.

    python benchmarks/scoring_cost.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from lookahead.artifacts.contexts import ContextCache
from lookahead.artifacts.probe_heads import head_importance
from lookahead.artifacts.val_scores import batches, load_scoring, scoring_windows
from lookahead.core.config import load_section
from lookahead.graph.nodes import static_topology
from lookahead.graph.plan import execute
from lookahead.graph.predictor import load_init, load_predictor
from lookahead.graph.router_inputs import router_context
from lookahead.graph.scoring import GeoLookup
from lookahead.lm.nll import token_nll
from lookahead.pipeline.phase1.config import Phase1Config
from lookahead.pipeline.phase2.config import Phase2Config
from lookahead.pipeline.phase2.static_mask import static_mask

OLD_WINDOWS = 32  # the context cache's val windows, what the final figures scored before


def load_lm(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.no_grad()
def dense(lm, bs):
    for w in bs:
        token_nll(lm(input_ids=w[:, :-1]).logits, w[:, 1:])


@torch.no_grad()
def routed(lm, predictor, skip, geo, bs):
    for w in bs:
        ids = w[:, :-1]
        adjacency, gates = predictor(router_context(predictor.cfg.input, lm, ids, None),
                                     geo(ids) if predictor.geo_dim else None, hard=True)
        token_nll(execute(lm, ids, adjacency, gates, skip), w[:, 1:])


@torch.no_grad()
def static(lm, topology, skip, bs):
    adjacency, gates = topology
    for w in bs:
        token_nll(execute(lm, w[:, :-1], adjacency, gates, skip), w[:, 1:])


def timed(fn, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="timings per pass (the fastest is kept)")
    args = parser.parse_args()
    torch.manual_seed(0)
    scoring = load_scoring("params.yaml")
    phase1_seeds = load_section("params.yaml", "phase1", Phase1Config).seeds
    phase2_seeds = load_section("params.yaml", "phase2", Phase2Config).seeds
    base, lm2 = load_lm("models/base"), load_lm("models/phase2/lm")
    control, static_lm = load_lm("models/control"), load_lm("models/static_control")
    p1, meta1 = load_predictor("models/phase1/predictor.safetensors")
    p2, meta2 = load_predictor("models/phase2/predictor.safetensors")
    skip1, skip2 = meta1["runtime"]["skip"], meta2["runtime"]["skip"]
    mask = static_mask("data/static_baselines", "metrics/phase2_pruning.json")
    importance = head_importance("data/probe/heads.safetensors")
    tensors, _ = load_init("models/init/init.safetensors")
    geo = GeoLookup(tensors["geo_table"].float(), tensors["geo_mask"].float())
    context_length = json.loads(Path("models/base/lookahead_config.json").read_text())["arch"]["context_length"]
    windows = scoring_windows("data/tokens", scoring, context_length, cache=ContextCache("data/contexts"))
    sets = {"scoring": batches(windows, scoring.batch_size, "cpu"),
            "old": batches(windows[:OLD_WINDOWS], scoring.batch_size, "cpu")}
    with torch.no_grad():
        ids = windows[:2, :-1]
        _, gates = p1(router_context(p1.cfg.input, base, ids, None), geo(ids) if p1.geo_dim else None, hard=True)
    phase1_static = static_topology(importance, float(gates[..., 1:].mean()), skip1)
    control_static = static_topology(mask.importance, mask.fraction, mask.skip)
    out = {"scoring_windows": scoring.roles.per_role, "old_windows": OLD_WINDOWS,
           "positions": int(windows[:, 1:].numel()), "rounds": args.rounds}
    for name, bs in sets.items():
        out[f"phase1_s_{name}"] = (timed(lambda: dense(base, bs), args.rounds)
                                   + timed(lambda: static(base, phase1_static, skip1, bs), args.rounds)
                                   + phase1_seeds * timed(lambda: routed(base, p1, skip1, geo, bs), args.rounds))
        out[f"phase2_s_{name}"] = phase2_seeds * (timed(lambda: dense(lm2, bs), args.rounds)
                                                  + timed(lambda: routed(lm2, p2, skip2, geo, bs), args.rounds))
        out[f"control_s_{name}"] = phase2_seeds * timed(lambda: dense(control, bs), args.rounds)
        out[f"static_control_s_{name}"] = phase2_seeds * (timed(lambda: dense(static_lm, bs), args.rounds)
                                                          + timed(lambda: static(static_lm, control_static, mask.skip, bs),
                                                                  args.rounds))
    for stage in ("phase1", "phase2", "control", "static_control"):
        out[f"{stage}_added_s"] = out[f"{stage}_s_scoring"] - out[f"{stage}_s_old"]
    out["added_s_total"] = sum(out[f"{s}_added_s"] for s in ("phase1", "phase2", "control", "static_control"))
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}))


if __name__ == "__main__":
    main()
