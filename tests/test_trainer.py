"""The shared training loop: schedule, NaN guard, exact checkpoint/resume."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lookahead.lm.olmo2 import ArchConfig, olmo2_config
from lookahead.pipeline.base import BaseConfig, LMTrainModule
from lookahead.train import data
from lookahead.train.checkpoints import CHECKPOINT_FILE
from lookahead.train.loop import NonFiniteLoss, TrainConfig, lr_lambda, train


def test_schedule_is_linear_warmup_then_cosine():
    cfg = TrainConfig(steps=110, warmup_steps=10, min_lr_ratio=0.1)
    f = lr_lambda(cfg)
    assert [f(s) for s in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    assert f(9) == pytest.approx(1.0) and f(10) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(110) == pytest.approx(0.1)


class Interrupted(RuntimeError):
    pass


def lm_module(tiny_tokenizer, train_cfg, interrupt_at=None):
    cfg = BaseConfig(arch=ArchConfig(n_layers=2, n_heads=2, hidden_size=16, intermediate_size=32, context_length=8), train=train_cfg)
    stream = np.random.default_rng(0).integers(2, len(tiny_tokenizer), size=2000).astype(np.uint16)
    torch.manual_seed(train_cfg.seed)
    from transformers import Olmo2ForCausalLM

    model = Olmo2ForCausalLM(olmo2_config(cfg.arch, tiny_tokenizer))
    module = LMTrainModule(model, stream, data.eval_windows(stream, 8, 64), cfg)
    if interrupt_at is not None:
        batch = module.batch

        def interrupting(step):
            if step == interrupt_at:
                raise Interrupted(f"killed at step {step}")
            return batch(step)

        module.batch = interrupting
    return module


def test_interrupted_and_resumed_run_ends_with_the_same_weights(tiny_tokenizer, tmp_path):
    cfg = TrainConfig(steps=12, batch_size=4, lr=1e-2, warmup_steps=2, eval_every=5, log_every=1, checkpoint_every=4, device="cpu")
    straight = lm_module(tiny_tokenizer, cfg)
    reference = train(straight, cfg, stage="test", checkpoint_dir=tmp_path / "a")

    interrupted = lm_module(tiny_tokenizer, cfg, interrupt_at=10)
    with pytest.raises(Interrupted):
        train(interrupted, cfg, stage="test", checkpoint_dir=tmp_path / "b")
    assert (tmp_path / "b" / CHECKPOINT_FILE).is_file()  # step-8 checkpoint survives the crash

    resumed_module = lm_module(tiny_tokenizer, cfg)  # a fresh process: new random init
    resumed = train(resumed_module, cfg, stage="test", checkpoint_dir=tmp_path / "b")
    assert resumed.resumed_from == 8
    for (name, a), (_, b) in zip(straight.model.state_dict().items(), resumed_module.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert [r["loss"] for r in resumed.train_curve] == [r["loss"] for r in reference.train_curve]
    assert resumed.eval_curve == reference.eval_curve
    assert not (tmp_path / "b").exists()  # removed after success
    # training did something: final loss well below the initial ln(V)
    assert reference.train_curve[-1]["loss"] < reference.train_curve[0]["loss"]


def test_checkpoint_of_another_config_is_refused(tiny_tokenizer, tmp_path):
    cfg = TrainConfig(steps=6, batch_size=2, eval_every=3, checkpoint_every=2, device="cpu")
    with pytest.raises(Interrupted):
        train(lm_module(tiny_tokenizer, cfg, interrupt_at=3), cfg, stage="test", checkpoint_dir=tmp_path)
    other = TrainConfig(steps=6, batch_size=2, eval_every=3, checkpoint_every=2, device="cpu", lr=5e-3)
    with pytest.raises(RuntimeError, match="another config"):
        train(lm_module(tiny_tokenizer, other), other, stage="test", checkpoint_dir=tmp_path)


def test_nan_loss_stops_with_the_stage_and_step(tiny_tokenizer):
    cfg = TrainConfig(steps=10, batch_size=2, eval_every=5, device="cpu")
    module = lm_module(tiny_tokenizer, cfg)
    loss = module.loss

    def poisoned(model, batch):
        value = loss(model, batch)
        return value * float("nan") if module.calls == 3 else value

    module.calls = 0
    batch = module.batch

    def counting(step):
        module.calls = step
        return batch(step)

    module.batch, module.loss = counting, poisoned
    with pytest.raises(NonFiniteLoss, match=r"test: training loss is nan at step 3"):
        train(module, cfg, stage="test")


def test_a_learning_rate_scale_is_an_adamw_group_at_that_rate(tiny_tokenizer):
    # every parameter at scale 0.25 trains exactly as every parameter at lr × 0.25 (same AdamW steps)
    base = TrainConfig(steps=4, batch_size=2, lr=1e-2, warmup_steps=1, eval_every=4, device="cpu")
    scaled = lm_module(tiny_tokenizer, base)
    scaled.lr_scale = lambda name: 0.25
    train(scaled, base, stage="test")
    plain_cfg = TrainConfig(steps=4, batch_size=2, lr=1e-2 * 0.25, warmup_steps=1, eval_every=4, device="cpu")
    plain = lm_module(tiny_tokenizer, plain_cfg)
    train(plain, plain_cfg, stage="test")
    for (name, a), (_, b) in zip(scaled.model.state_dict().items(), plain.model.state_dict().items()):
        assert torch.equal(a, b), name


def test_a_stop_reason_ends_training_after_that_evaluation_and_resumes_to_the_same_stop(tiny_tokenizer, tmp_path):
    cfg = TrainConfig(steps=12, batch_size=2, lr=1e-2, warmup_steps=1, eval_every=3, log_every=1, checkpoint_every=2,
                      device="cpu")

    def stopping(module):
        module.stop_reason = lambda curve: "two evaluations" if len(curve) == 2 else None
        return module

    straight = stopping(lm_module(tiny_tokenizer, cfg))
    result = train(straight, cfg, stage="test", checkpoint_dir=tmp_path / "a")
    assert (result.stopped_at, result.stop_reason) == (6, "two evaluations")
    assert [r["step"] for r in result.eval_curve] == [3, 6] and result.train_curve[-1]["step"] == 6
    assert not (tmp_path / "a").exists()  # a run that stopped early is done: no checkpoint left
    with pytest.raises(Interrupted):
        train(stopping(lm_module(tiny_tokenizer, cfg, interrupt_at=5)), cfg, stage="test", checkpoint_dir=tmp_path / "b")
    resumed = stopping(lm_module(tiny_tokenizer, cfg))
    again = train(resumed, cfg, stage="test", checkpoint_dir=tmp_path / "b")
    assert again.resumed_from == 4 and again.stopped_at == 6 and again.eval_curve == result.eval_curve
    for (name, a), (_, b) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), name
