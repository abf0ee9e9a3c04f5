"""Sampling speed of the diffusion head against the phase-1 predictor's sampler (docs/development.md).

For the default profile's graph (4 × 4 heads, 17 nodes) and the OLMo-2-1B graph (16 × 16, 257
nodes), in one process: a randomly initialised diffusion head of the params' ``diffusion.denoiser``
shape draws ``--graphs`` topologies with ``diffusion.sample_steps`` ancestral steps, and a randomly
initialised predictor of the params' ``predictor`` shape draws as many with its own noise (one
forward). Both include the cascade to the executed graph; neither runs the LM. The cost does not
depend on the weights, so random ones time the trained modules. Prints one JSON line: graphs/s of
each sampler per graph size, their ratio, and the denoiser's parameter count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from lookahead.core.config import load_section
from lookahead.graph.denoiser import Denoiser
from lookahead.graph.nodes import n_edges
from lookahead.graph.predictor import PredictorConfig, StructurePredictor
from lookahead.graph.sampling import sample_topologies
from lookahead.pipeline.diffusion.build import DiffusionConfig


def timed(fn, rounds: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(rounds):
        tic = time.perf_counter()
        fn()
        times.append(time.perf_counter() - tic)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--graphs", type=int, default=1024, help="topologies per timed call")
    parser.add_argument("--context-dim", type=int, default=384, help="context embedding width (MiniLM: 384)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cfg = load_section(args.params, "diffusion", DiffusionConfig)
    pcfg = load_section(args.params, "predictor", PredictorConfig)
    torch.manual_seed(0)
    out = {"graphs": args.graphs, "sample_steps": cfg.sample_steps, "threads": torch.get_num_threads()}
    for layers, heads in ((4, 4), (16, 16)):
        e = n_edges(layers, heads)
        denoiser = Denoiser(cfg.denoiser, layers, heads, args.context_dim, 0, torch.full((e,), 0.2)).eval()
        predictor = StructurePredictor(PredictorConfig(**{**pcfg.__dict__, "geo_features": False}), layers, heads,
                                       args.context_dim)
        graphs = args.graphs if layers == 4 else max(1, args.graphs // 16)  # 16 x 16 graphs are 280 x bigger
        contexts = torch.randn(graphs, args.context_dim)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            diffusion_s = timed(lambda: denoiser.executed(denoiser.sample(contexts, None, cfg.sample_steps, gen)),
                                args.rounds)
            predictor_s = timed(lambda: sample_topologies(predictor, contexts, None, 0.0, gen), args.rounds)
        tag = f"{layers}x{heads}"
        out[f"{tag}_graphs"] = graphs
        out[f"{tag}_diffusion_graphs_per_s"] = round(graphs / diffusion_s, 1)
        out[f"{tag}_predictor_graphs_per_s"] = round(graphs / predictor_s, 1)
        out[f"{tag}_predictor_over_diffusion"] = round(diffusion_s / predictor_s, 1)
        out[f"{tag}_denoiser_parameters"] = sum(p.numel() for p in denoiser.parameters())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
