"""The activation term of ``make estimate`` against a measurement, per training stage.

For one micro-batch of each training stage, in the 1B profile's training settings (bf16 autocast;
phase 1 trains the soft cascade with the LM's NLL through the head-graph runtime; phase 2 routes
hard straight-through topologies of the cascade and replays as many dense windows; the static
control runs its mask through the execution plan), this measures the bytes autograd keeps for the
backward pass (``lookahead.core.checkpointing.saved_tensor_bytes``: each storage once, parameters
left out; under checkpointing the layer inputs each checkpoint holds) with and without
``train.checkpoint_activations``, on random OLMo2 models on the CPU, and prints them beside the
estimate's figure (``lookahead.tools.estimate.activation_bytes``) as one JSON line.

    python benchmarks/activation_memory.py                      # the shape the fit started from, and another
    python benchmarks/activation_memory.py --write-docs         # also the table in docs/scaling.md
    python benchmarks/activation_memory.py --fit                # refit ACTIVATION_FIT (about 2 min)

The estimate's constants (``lookahead.tools.estimate.ACTIVATION_FIT``) are what ``--fit`` prints:
non-negative least squares per stage over :data:`FIT_SHAPES` (FIT and one change of each
dimension), the weight copies held at their 2 bytes a weight. :data:`CHECK` (another width, depth,
head count, MLP ratio, vocabulary and context) is the shape the ±25 % test holds them to
(tests/test_estimate_memory.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from lookahead.tools.estimate import Arch, activation_bytes  # noqa: E402
from lookahead.core.checkpointing import activation_checkpointing, saved_tensor_bytes  # noqa: E402

FIT = {"arch": Arch(layers=4, heads=8, hidden=256, ffn=1024, vocab=2048), "context": 128, "batch": 2}
FIT_SHAPES = [FIT] + [{**FIT, "arch": dataclasses.replace(FIT["arch"], **change)}
                      for change in ({"hidden": 512}, {"ffn": 2048}, {"layers": 8}, {"heads": 16}, {"vocab": 4096})]
FIT_SHAPES.append({**FIT, "context": 256})
"""The shapes ACTIVATION_FIT was fitted on (least squares per stage, non-negative): FIT and one
change of each dimension."""
CHECK = {"arch": Arch(layers=3, heads=4, hidden=192, ffn=512, vocab=3000), "context": 96, "batch": 3}
STAGES = ("phase1", "phase2", "control", "static_control", "modulator")
CONTEXT_DIM, GEO_DIM = 64, 8  # the router's inputs (the cache's features, the geometric ones)
DOCS = ROOT / "docs" / "scaling.md"
BEGIN, END = "<!-- activation-memory:begin -->", "<!-- activation-memory:end -->"


def lm_of(arch: Arch, seed: int = 0, device="cpu", dtype=torch.float32):
    """A random OLMo2 causal LM of shape ``arch`` (``from_config``: nothing downloaded)."""
    from transformers import Olmo2Config, Olmo2ForCausalLM

    torch.manual_seed(seed)
    cfg = Olmo2Config(vocab_size=arch.vocab, hidden_size=arch.hidden, intermediate_size=arch.ffn,
                      num_hidden_layers=arch.layers, num_attention_heads=arch.heads, num_key_value_heads=arch.heads,
                      max_position_embeddings=8192, use_cache=False)
    return Olmo2ForCausalLM(cfg).to(device=device, dtype=dtype)


def cascade(arch: Arch, context_dim: int, geo_dim: int, rank: int, hidden: int):
    from lookahead.graph.predictor import PredictorConfig, StructurePredictor

    torch.manual_seed(1)
    return StructurePredictor(PredictorConfig.cascade(rank=rank, hidden=hidden, init_bias=3.0), arch.layers, arch.heads,
                              context_dim, geo_dim)


def stage_loss(stage: str, arch: Arch, batch: int, context: int, device="cpu", context_dim: int = CONTEXT_DIM,
               geo_dim: int = GEO_DIM, router: tuple[int, int] = (4, 32)):
    """(the loss of one micro-batch of ``batch`` windows as the stage computes it, the modules whose
    parameters are not activations), on ``device``; ``router``: the cascade router's rank and width
    (benchmarks/gpu_check.py builds the 1B profile's steps with it too)."""
    from lookahead.graph.gating import budget_terms
    from lookahead.lm.nll import token_nll

    lm = lm_of(arch, device=device)
    gen = torch.Generator().manual_seed(2)
    windows = torch.randint(0, arch.vocab, (batch, context + 1), generator=gen).to(device)
    replay = torch.randint(0, arch.vocab, (batch, context + 1), generator=gen).to(device)
    ids, targets = windows[:, :-1], windows[:, 1:]
    contexts = torch.randn(batch, context, context_dim, generator=gen).to(device)
    geo = torch.randn(batch, context, geo_dim, generator=gen).to(device) if geo_dim else None
    route = lambda: cascade(arch, context_dim, geo_dim, *router).to(device)  # noqa: E731

    def dense_nll(model, w):
        return token_nll(model(input_ids=w[:, :-1]).logits, w[:, 1:]).mean()

    if stage == "phase1":  # Phase1Module.loss: the soft cascade, the LM frozen, its NLL + the budget terms
        from lookahead.graph.runtime import forward_with_topology

        lm.eval().requires_grad_(False)
        predictor = route().train()

        def loss():
            adjacency, gates, _ = predictor(contexts, geo, tau=1.0, hard=False, with_logits=True)
            nll = token_nll(forward_with_topology(lm, ids, adjacency, gates, skip="full"), targets).mean()
            head, edge = budget_terms(adjacency, gates, arch.layers, arch.heads)
            return nll + 0.5 * head + edge
        return loss, (lm, predictor)
    if stage == "phase2":  # Phase2Module.loss: hard straight-through topologies, LM and router train, replay
        from lookahead.pipeline.phase2.model import Phase2Model

        model = Phase2Model(lm, route(), "full").train()

        def loss():
            logits, topology = model(ids, contexts, geo, tau=1.0, hard=True)
            head, edge = budget_terms(*topology, arch.layers, arch.heads)
            replayed = token_nll(model(replay[:, :-1], dense=True)[0], replay[:, 1:]).mean()
            return (token_nll(logits, targets).mean() + replayed) / 2 + 0.5 * head + edge
        return loss, (model,)
    if stage == "control":  # ControlModule.loss: the stock forward, and replay
        lm.train()
        return (lambda: (dense_nll(lm, windows) + dense_nll(lm, replay)) / 2), (lm,)
    if stage == "static_control":  # the static mask through the execution plan, and replay
        from lookahead.pipeline.phase2.control import StaticMask, StaticPruned

        importance = torch.rand(arch.layers, arch.heads, generator=gen).to(device)
        model = StaticPruned(lm.train(), StaticMask(importance, 0.5, "full"))

        def loss():
            nll = token_nll(model(ids), targets).mean()
            return (nll + token_nll(model(replay[:, :-1], dense=True), replay[:, 1:]).mean()) / 2
        return loss, (model,)
    if stage == "modulator":  # ModulatorModule.loss: the frozen LM's stock forward, modulated
        from lookahead.core.config import from_dict
        from lookahead.pipeline.modulator.config import ModulatorConfig
        from lookahead.pipeline.modulator.model import GeometricModulator, ModulatedLM

        lm.eval().requires_grad_(False)
        g = torch.Generator().manual_seed(3)
        modulator = GeometricModulator(torch.randn(arch.vocab, 4, generator=g), torch.ones(arch.vocab),
                                       torch.randn(4, arch.hidden, generator=g), torch.zeros(arch.hidden), 1.0,
                                       list(range(arch.layers)), from_dict(ModulatorConfig, {"alpha_init": 0.1}))
        modulated = ModulatedLM(lm, modulator)
        return (lambda: dense_nll(modulated, windows)), (lm, modulator)
    raise ValueError(stage)


def measure(stage: str, arch: Arch, batch: int, context: int, checkpointing: bool) -> int:
    loss, params = stage_loss(stage, arch, batch, context)
    with activation_checkpointing(checkpointing, *params), torch.autocast("cpu", dtype=torch.bfloat16):
        return saved_tensor_bytes(loss, params)[0]


def compare(shape: dict, stages=STAGES) -> dict:
    """Per stage and checkpointing: measured and estimated bytes, and estimate / measured."""
    arch, batch, context = shape["arch"], shape["batch"], shape["context"]
    out = {}
    for stage in stages:
        for ckpt in (False, True):
            measured = measure(stage, arch, batch, context, ckpt)
            estimated = activation_bytes(stage, arch, batch * context, 2, ckpt)
            out[f"{stage}{' checkpointed' if ckpt else ''}"] = {
                "measured_mib": round(measured / 2**20, 3), "estimated_mib": round(estimated / 2**20, 3),
                "ratio": round(estimated / measured, 3)}
    return out


def fit() -> dict[str, dict[bool, dict[str, float]]]:
    """ACTIVATION_FIT refitted: per stage and checkpointing, the non-negative coefficients of the
    per-token terms of ``lookahead.tools.estimate._stage_bytes`` (a: L·d, b: L·ffn, g: L·H·d, v: V,
    e: d, n: N²) that best explain the bytes measured on :data:`FIT_SHAPES`, the bf16 weight copies
    (2 bytes a weight; the LM head's alone when checkpointed) taken off first."""
    import numpy as np
    from scipy.optimize import nnls

    out: dict[str, dict[bool, dict[str, float]]] = {}
    for stage in STAGES:
        graph = stage in ("phase1", "phase2")
        for ckpt in (False, True):
            names = ["a", *([] if ckpt else ["b"]), *(["g", "n"] if graph else []), "v",
                     *(["e"] if ckpt or not graph else [])]
            rows, ys = [], []
            for shape in FIT_SHAPES:
                a, tokens = shape["arch"], shape["batch"] * shape["context"]
                n = 1 + a.layers * a.heads
                term = {"a": a.layers * a.hidden, "b": a.layers * a.ffn, "g": a.layers * a.heads * a.hidden,
                        "n": n * n, "v": a.vocab, "e": a.hidden}
                rows.append([tokens * term[k] for k in names])
                copies = 2.0 * ((0 if ckpt else a.body) + a.vocab * a.hidden)
                ys.append(measure(stage, a, shape["batch"], shape["context"], ckpt) - copies)
            coef, _ = nnls(np.array(rows, float), np.array(ys, float))
            out.setdefault(stage, {})[ckpt] = {k: round(float(c), 1) for k, c in zip(names, coef) if round(c, 1)}
    return out


def table(figures: dict) -> str:
    rows = ["| stage | measured MiB | estimated MiB | estimate / measured | measured, checkpointed | "
            "estimated, checkpointed | estimate / measured |", "|---|---:|---:|---:|---:|---:|---:|"]
    for stage in STAGES:
        a, b = figures[stage], figures[f"{stage} checkpointed"]
        rows.append(f"| {stage} | {a['measured_mib']:.2f} | {a['estimated_mib']:.2f} | {a['ratio']:.2f} | "
                    f"{b['measured_mib']:.2f} | {b['estimated_mib']:.2f} | {b['ratio']:.2f} |")
    return "\n".join(rows)


def shape_text(shape: dict) -> str:
    a = shape["arch"]
    return (f"{a.layers} layers x {a.heads} heads, hidden {a.hidden}, ffn {a.ffn}, vocab {a.vocab}; "
            f"{shape['batch']} windows of {shape['context']} tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write-docs", action="store_true", help="rewrite the table in docs/scaling.md")
    parser.add_argument("--fit", action="store_true", help="print ACTIVATION_FIT refitted on FIT_SHAPES instead")
    args = parser.parse_args()
    if args.fit:
        print(json.dumps({stage: {str(k).lower(): v for k, v in rows.items()} for stage, rows in fit().items()}))
        return
    torch.set_num_threads(max(1, torch.get_num_threads()))
    result = {"fit": {"shape": shape_text(FIT), **compare(FIT)}, "check": {"shape": shape_text(CHECK), **compare(CHECK)}}
    print(json.dumps(result))
    if args.write_docs:
        text = DOCS.read_text(encoding="utf-8")
        block = (f"{BEGIN}\nThe shape the fit started from ({result['fit']['shape']}):\n\n"
                 f"{table(result['fit'])}\n\nAnother shape ({result['check']['shape']}):\n\n"
                 f"{table(result['check'])}\n{END}")
        DOCS.write_text(re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S),
                        encoding="utf-8")


if __name__ == "__main__":
    main()
