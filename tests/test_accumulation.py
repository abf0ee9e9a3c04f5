"""Gradient accumulation (``train.accumulate``) and activation checkpointing
(``train.checkpoint_activations``) change the memory a step needs, not the step: every training
stage's loss on the tiny model, k = 4 micro-batches against one pass (the gradients before clipping
and the weights after three AdamW steps), and the same gradients with every layer checkpointed,
through the head-graph runtime, the execution plan and the stock forward. fp32 throughout.

Not exact by design, and so not compared here (lookahead.train.loop.step_gradients): noise a
router draws in its forward pass (each micro-batch draws its own: the same distribution, other
draws; the tests run the routers in eval mode), phase 1's ``balance`` term and phase 2's
``refresh_every`` (refused under accumulation, tested below)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from lookahead.artifacts.contexts import ContextCache
from lookahead.core.config import from_dict, to_dict
from lookahead.core.errors import ConfigError
from lookahead.graph.nodes import allowed_mask, n_nodes
from lookahead.graph.plan import execute
from lookahead.graph.predictor import PredictorConfig, StructurePredictor, load_predictor
from lookahead.graph.runtime import forward_with_topology
from lookahead.graph.scoring import GeoLookup
from lookahead.pipeline.phase1.config import Phase1Config
from lookahead.pipeline.phase1.module import Phase1Module
from lookahead.pipeline.phase2.config import Phase2Config
from lookahead.pipeline.phase2.control import ControlModule, StaticMask
from lookahead.pipeline.phase2.model import Phase2Model
from lookahead.pipeline.phase2.module import Phase2Module
from lookahead.train import data
from lookahead.core.checkpointing import activation_checkpointing, saved_tensor_bytes
from lookahead.train.loop import TrainConfig, lr_lambda, step_gradients

STEPS = 3


def run(module, cfg: TrainConfig) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The loop's own step (``step_gradients``, then clip, AdamW and the schedule) for ``STEPS``
    steps from ``module.model`` as it is now: (the first step's gradients before clipping, the
    weights after the last step). Every module in eval mode: no forward-pass noise."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=cfg.accumulate)
    model = module.model.eval()
    for frozen in (getattr(module, "lm", None),):
        if frozen is not None:
            frozen.eval()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    first = {}
    for step in range(STEPS):
        step_gradients(accelerator, model, module, module.batch(step), cfg, "test", step, lambda: 0.0)
        if step == 0:
            first = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    return first, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def assert_same_step(make, cfg: TrainConfig, **changes) -> None:
    """``make(cfg)`` trained as one pass and with ``changes`` (micro-batches, checkpointing): the
    same first gradients (≤ 1e-6) and the same weights after ``STEPS`` steps."""
    grads, weights = run(make(cfg), cfg)
    other = TrainConfig(**{**to_dict(cfg), **changes})
    grads_k, weights_k = run(make(other), other)
    assert grads.keys() == grads_k.keys() and grads
    for name in grads:
        assert (grads[name] - grads_k[name]).abs().max().item() <= 1e-6, name
    # AdamW divides by √v: an entry whose gradient is near its eps (1e-8) moves by an amount that
    # rounding in the gradient's last digits changes; within 5 % of one step's lr still
    for name in weights:
        assert (weights[name] - weights_k[name]).abs().max().item() <= 0.05 * cfg.lr, name


def train_cfg(batch_size: int = 4, lr: float = 1e-3) -> TrainConfig:
    return TrainConfig(steps=STEPS, batch_size=batch_size, lr=lr, warmup_steps=1, grad_clip=1.0, device="cpu")


def test_the_base_lm_and_the_controls_step_the_same_over_micro_batches(phase_inputs, downstream_inputs):
    from lookahead.pipeline.base import BaseConfig, LMTrainModule
    from lookahead.train.data import load_stream

    stream = load_stream(phase_inputs["tokens"], "train")
    cache = ContextCache(phase_inputs["contexts"])

    def base(cfg):
        lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"])
        bcfg = BaseConfig(train=cfg)
        bcfg.arch.context_length = 16
        return LMTrainModule(lm, stream, data.eval_windows(stream, 16, 32), bcfg)

    assert_same_step(base, train_cfg(), accumulate=4, checkpoint_activations=True)

    p2 = from_dict(Phase2Config, {"windows": "cache", "replay": True, "distill": 0.0, "train": to_dict(train_cfg())})

    def control(cfg, mask=None):
        lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"])
        return ControlModule(lm, cache, from_dict(Phase2Config, {**to_dict(p2), "train": to_dict(cfg)}), stream, mask)

    assert_same_step(control, p2.train, accumulate=4, checkpoint_activations=True)
    mask = StaticMask(torch.tensor([[0.3, 0.1], [0.05, 0.2]]), 0.5, "query")
    assert_same_step(lambda cfg: control(cfg, mask), p2.train, accumulate=4, checkpoint_activations=True)


def phase1(phase_inputs, cfg: TrainConfig, predictor_cfg: PredictorConfig, **changes) -> Phase1Module:
    cache = ContextCache(phase_inputs["contexts"])
    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"])
    init = load_file(str(phase_inputs["init"]))
    torch.manual_seed(0)
    width = cache.dim if predictor_cfg.input == "cache" else 2 * lm.config.hidden_size
    predictor = StructurePredictor.from_init(predictor_cfg, phase_inputs["init"], width)
    torch.nn.init.normal_(predictor.to_v.weight if predictor_cfg.gate == "cascade" else predictor.to_gate.weight, std=0.5)
    return Phase1Module(predictor, lm, cache, GeoLookup(init["geo_table"], init["geo_mask"]),
                        load_file(str(phase_inputs["heads"]))["importance"],
                        Phase1Config(**changes, train=cfg), "query")


def test_phase1_steps_the_same_over_micro_batches(phase_inputs):
    # the 1B profile's: the soft cascade trained on the LM's NLL (the head-graph runtime)
    cascade = PredictorConfig.cascade(rank=2, hidden=8, init_bias=1.0)
    assert_same_step(lambda cfg: phase1(phase_inputs, cfg, cascade), train_cfg(), accumulate=4, checkpoint_activations=True)
    # the default's: head gates under a top-K budget, distilled from the oracle, with the z-loss
    heads = PredictorConfig(rank=2, hidden=8, gate="head", budget="topk", keep=0.5, input="lm", noise="none")
    assert_same_step(lambda cfg: phase1(phase_inputs, cfg, heads, nll_weight=0.5, distill=1.0, z_loss=1e-3),
                     train_cfg(), accumulate=4, checkpoint_activations=True)


def test_phase2_steps_the_same_over_micro_batches(downstream_inputs):
    from lookahead.train.data import load_stream

    cache = ContextCache(downstream_inputs["contexts"])
    stream = load_stream(downstream_inputs["tokens"], "train")
    init = load_file(str(downstream_inputs["init"]))

    def make(cfg):
        lm = AutoModelForCausalLM.from_pretrained(downstream_inputs["base"])
        router, _ = load_predictor(downstream_inputs["predictor"])
        p2 = from_dict(Phase2Config, {"windows": "cache", "replay": True, "hard_from_step": 1, "predictor_lr_scale": 30,
                                      "train": to_dict(cfg)})
        return Phase2Module(Phase2Model(lm, router, "query"), cache, GeoLookup(init["geo_table"], init["geo_mask"]), p2,
                            stream=stream)

    assert_same_step(make, train_cfg(lr=1e-4), accumulate=4, checkpoint_activations=True)


def test_the_diffusion_head_steps_the_same_over_micro_batches(downstream_inputs):
    from lookahead.pipeline.diffusion.build import DiffusionConfig, build_model
    from lookahead.pipeline.diffusion.module import DiffusionModule, PairFeatures
    from lookahead.artifacts.pairs import load_pairs

    cache = ContextCache(downstream_inputs["contexts"])
    pairs = load_pairs(downstream_inputs["root"] / "pairs", cache.context_length, 0.25, 0)

    def make(cfg):
        dcfg = from_dict(DiffusionConfig, {"denoiser": {"hidden": 8, "layers": 1, "rank": 2, "cond_hidden": 8},
                                           "geo_features": False, "heldout_fraction": 0.25, "val_pairs": 16,
                                           "train": to_dict(cfg)})
        features = PairFeatures(cache, None, "cache", None)
        return DiffusionModule(build_model(dcfg, pairs, features, 0), pairs, features, dcfg)

    assert_same_step(make, train_cfg(batch_size=8), accumulate=4, checkpoint_activations=True)


def test_checkpointed_layers_give_the_same_gradients_on_every_path(phase_inputs):
    """The head-graph runtime (soft per-position gates and edges: gradients reach them and the LM),
    the execution plan (hard gates, gradients to the LM's weights, both skip modes, shared and per
    position) and the stock forward (trained, and frozen in eval mode with gradients through it)."""
    lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"]).eval()
    n_layers, n_heads = lm.config.num_hidden_layers, lm.config.num_attention_heads
    n = n_nodes(n_layers, n_heads)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, lm.config.vocab_size, (2, 12), generator=gen)
    soft_a = (torch.rand(2, 12, n, n, generator=gen) * allowed_mask(n_layers, n_heads)).requires_grad_()
    soft_g = torch.rand(2, 12, n, generator=gen).requires_grad_()
    hard_g = (torch.rand(2, 12, n, generator=gen) > 0.4).float()
    hard_g[..., 0] = 1
    shared_g = torch.tensor([1.0, 1, 0, 0, 1])
    head_graph = lambda g: allowed_mask(n_layers, n_heads) * g[..., :, None]  # noqa: E731
    scale = torch.randn(lm.config.vocab_size, generator=gen)
    paths = {
        "runtime": lambda: forward_with_topology(lm, ids, soft_a, soft_g, skip="query"),
        "runtime full": lambda: forward_with_topology(lm, ids, soft_a, soft_g, skip="full"),
        "plan per position query": lambda: execute(lm, ids, head_graph(hard_g), hard_g, "query"),
        "plan shared full": lambda: execute(lm, ids, head_graph(shared_g), shared_g, "full"),
        "stock": lambda: lm(input_ids=ids).logits,
    }
    inputs = [soft_a, soft_g, *lm.parameters()]
    for name, forward in paths.items():
        plain = saved_tensor_bytes(forward, (lm,))[0]
        with activation_checkpointing(True, lm):
            assert saved_tensor_bytes(forward, (lm,))[0] < plain, name  # it does checkpoint that path
        grads = []
        for on in (False, True):
            for x in inputs:
                x.grad = None
            with activation_checkpointing(on, lm):
                ((forward() * scale).sum() / 1000).backward()
            grads.append([None if x.grad is None else x.grad.clone() for x in inputs])
        assert any(g is not None for g in grads[0]), name
        for plain, checkpointed in zip(*grads):
            assert (plain is None) == (checkpointed is None), name
            if plain is not None:
                assert (plain - checkpointed).abs().max().item() <= 1e-6, name
    # off again: the layers' own forward, nothing left wrapped
    assert "forward" not in vars(lm.model.layers[0])


def test_accumulation_that_cannot_hold_is_refused_with_the_key():
    with pytest.raises(ConfigError, match="accumulate"):
        TrainConfig(batch_size=6, accumulate=4, checkpoint_activations=True)
    with pytest.raises(ConfigError, match="balance"):
        Phase1Config(balance=0.1, train=TrainConfig(batch_size=8, accumulate=2))
    with pytest.raises(ConfigError, match="refresh_every"):
        from_dict(Phase2Config, {"refresh_every": 2, "predictor_lr_scale": 0, "train": {"accumulate": 2}})
    # default-valued, the new keys stay out of saved configs: outputs that embed them are unchanged
    assert "accumulate" not in to_dict(TrainConfig()) and "checkpoint_activations" not in to_dict(TrainConfig())
    assert to_dict(TrainConfig(accumulate=2))["accumulate"] == 2



def test_the_modulator_steps_the_same_over_micro_batches(phase_inputs):
    """The modulator's loss runs the frozen LM's stock forward (eval mode) with gradients through it."""
    from lookahead.pipeline.modulator.build import ModulatorModule
    from lookahead.pipeline.modulator.config import ModulatorConfig
    from lookahead.pipeline.modulator.model import GeometricModulator

    stream = data.load_stream(phase_inputs["tokens"], "train")

    def make(cfg):
        lm = AutoModelForCausalLM.from_pretrained(phase_inputs["base"]).eval()
        vocab, width = lm.config.vocab_size, lm.config.hidden_size
        mcfg = from_dict(ModulatorConfig, {"seq_len": 16, "alpha_init": 0.1, "train": to_dict(cfg)})
        g = torch.Generator().manual_seed(1)
        modulator = GeometricModulator(torch.randn(vocab, 4, generator=g), (torch.rand(vocab, generator=g) > 0.4).float(),
                                       torch.randn(4, width, generator=g), torch.randn(width, generator=g), 1.7, [0, 1],
                                       mcfg)
        return ModulatorModule(modulator, lm, stream, torch.zeros(2, 17, dtype=torch.long), mcfg)

    assert_same_step(make, train_cfg(lr=0.05), accumulate=4, checkpoint_activations=True)
