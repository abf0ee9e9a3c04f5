"""What evaluate compares, loaded once: the LMs (the base, phase 2's, both controls'), the routers and the
diffusion head (:class:`Decoders`), with the static control's head fraction."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from lookahead.artifacts.contexts import ContextCache
from lookahead.graph.connectivity import CONNECTIVITY_FILE, load_connectivity
from lookahead.graph.router_inputs import check_context_dim
from lookahead.graph.runtime import recorded_skip, recorded_unit
from lookahead.lm.adapters import VALUE_RESIDUAL_FILE, load_value_residual
from lookahead.pipeline.evaluate.config import EvaluateConfig, EvaluateError
from lookahead.pipeline.evaluate.rows import (Shapes, Topologies, connected_topologies, diffusion_topologies,
                                             predictor_topologies)


def _static_fraction(static_control_dir) -> float:
    """The phase-2 active-head fraction the static control was trained at (its saved config)."""
    path = Path(static_control_dir) / "lookahead_config.json"
    if not path.is_file():
        raise EvaluateError(f"static control {path} not found (run `dvc repro static_control`)")
    return float(json.loads(path.read_text(encoding="utf-8"))["static_control"]["mask"]["active_head_fraction"])


def _load_lm(path, device):
    from transformers import AutoModelForCausalLM

    if not (Path(path) / "config.json").is_file():
        raise EvaluateError(f"model directory {path} not found or incomplete (run `dvc repro` up to its stage)")
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().requires_grad_(False).to(device)


@dataclasses.dataclass
class Decoders:
    """The LMs and decoders the rows are built from (loaded and checked against each other)."""

    base: object
    lm2: object  # the phase-2 LM
    control: object
    static_control: object
    static_fraction: float  # the phase-2 fraction the static control was trained at (its mask: the nearest head count)
    shapes: Shapes
    predictor1: object
    denoiser: object
    steps: int  # the denoiser's sampling settings
    temperature: float
    decoder: str  # phase 2's: mlp or diffusion
    predictor2: object | None  # phase 2's predictor (decoder mlp)
    phase2_hard: Topologies | None  # the phase-2 row's (None: the stock forward, value residual's)
    skip: str = "full"  # the runtime's skip mode phase 1 trained under
    gate_kind: str = "cascade"  # how sampled bits execute (lookahead.graph.sampling)
    tau1: float | None = None  # the soft rows' edge temperatures: those phase 1 and phase 2 evaluated at
    tau2: float | None = None
    phase2_graph: Topologies | None = None  # the phase-2 router's graph (times its connectivity): causality, explainer
    connectivity: object | None = None  # phase 2's free connectivity (lookahead.graph.connectivity), if it trained one
    value_residual: bool = False  # phase 2 trained with value residual: its row runs the stock forward with it
    unit: str = "head"  # what a node is (runtime.unit), as phase 1 trained


def load_decoders(cfg: EvaluateConfig, cache: ContextCache, base_dir, predictor_file, diffusion_dir, phase2_dir,
                  control_dir, static_control_dir, device) -> Decoders:
    """Load every LM and decoder; refuse shapes or context sizes that do not fit together."""
    from lookahead.artifacts.phase2 import LM_DIR, PREDICTOR_FILE, load_phase2
    from lookahead.graph.denoiser import denoiser_input, load_denoiser, sampling_settings
    from lookahead.graph.router_inputs import input_dim
    from lookahead.graph.predictor import load_predictor

    phase2 = load_phase2(phase2_dir)
    base, lm2, control, static_control = (_load_lm(p, device) for p in (base_dir, Path(phase2_dir) / LM_DIR, control_dir,
                                                                          static_control_dir))
    static_fraction = _static_fraction(static_control_dir)
    predictor1, meta = load_predictor(predictor_file)
    unit = recorded_unit(meta)
    s = Shapes.of(base, unit)
    if (phase2["n_layers"], phase2["n_heads"]) != (s.n_layers, s.n_heads):
        raise EvaluateError(f"base model ({s.n_layers} x {s.n_heads} {unit}s) and phase 2 ({phase2['n_layers']} x "
                            f"{phase2['n_heads']}) disagree: rerun `dvc repro`")
    denoiser, dmeta = load_denoiser(diffusion_dir)
    check_context_dim(predictor1, meta, cache.dim, base, EvaluateError, predictor_file)
    wanted = input_dim(denoiser_input(dmeta), cache.dim, base.config.hidden_size, base.config.num_hidden_layers)
    if dmeta["context_dim"] != wanted:
        raise EvaluateError(f"the diffusion head takes {dmeta['context_dim']}-dim contexts but its input "
                            f"({denoiser_input(dmeta)}) gives {wanted}-dim ones here: rerun `dvc repro`")
    skip, gate_kind = recorded_skip(meta), predictor1.cfg.gate
    predictor1.to(device).eval()
    denoiser.to(device).eval()
    steps, temperature = sampling_settings(dmeta, diffusion_dir)

    predictor2, tau2, connectivity, value_residual = None, None, None, bool(phase2.get("value_residual"))
    if phase2["decoder"] == "mlp":
        predictor2, meta2 = load_predictor(Path(phase2_dir) / PREDICTOR_FILE)
        tau2 = meta2.get("phase2", {}).get("tau_end")
        predictor2.to(device).eval()
        if (Path(phase2_dir) / CONNECTIVITY_FILE).is_file():
            connectivity = load_connectivity(Path(phase2_dir) / CONNECTIVITY_FILE).to(device)
        if value_residual:  # the stock forward with its hooks (the rows' other runs of lm2 go without)
            load_value_residual(Path(phase2_dir) / VALUE_RESIDUAL_FILE).to(device).attach(lm2)
        phase2_graph = connected_topologies(predictor_topologies(predictor2, hard=True, lm=lm2), connectivity,
                                            predictor2.cfg.input, lm2)
        phase2_hard = None if value_residual else phase2_graph
    else:
        phase2_hard = diffusion_topologies(denoiser, 1, steps, temperature, cfg.seed + 1, device, gate_kind=gate_kind,
                                           lm=lm2)
        phase2_graph = phase2_hard
    return Decoders(base, lm2, control, static_control, static_fraction, s, predictor1, denoiser, steps, temperature, phase2["decoder"], predictor2,
                    phase2_hard, skip, gate_kind, meta.get("phase1", {}).get("tau_end"), tau2, phase2_graph, connectivity,
                    value_residual, unit)
