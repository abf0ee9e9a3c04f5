"""Small shared helpers of `lookahead.core` and `lookahead.lm.nll` that several stages now use."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lookahead.core.cli import parse_stage_args
from lookahead.core.devices import eval_mode
from lookahead.core.errors import LookaheadError
from lookahead.core.inputs import MissingRecord, read_safetensors, recorded
from lookahead.lm.nll import PositionTotals, causal_lm_nll, token_nll


def test_stage_args_split_into_inputs_and_outputs_by_their_help():
    args = parse_stage_args("d", {"base": "base model (input)", "metrics": "headline json",
                                  "train-curve": "csv (output: plot)", "out": "model (output)"},
                            ["--base", "b", "--metrics", "m", "--train-curve", "c", "--out", "o"])
    assert args.inputs == {"base": "b"}
    assert args.outputs == {"train_curve": "c", "out": "o"}


def test_recorded_reads_nested_keys_and_names_the_stage_to_rerun():
    meta = {"config": {"window": 16}}
    assert recorded(meta, "config", "window", stage="contexts", source="meta.json") == 16
    with pytest.raises(MissingRecord, match=r"meta.json has no 'config.trust_remote_code'.*`dvc repro contexts`"):
        recorded(meta, "config", "trust_remote_code", stage="contexts", source="meta.json")
    assert issubclass(MissingRecord, LookaheadError)


def test_read_safetensors_refuses_missing_and_garbled_files_with_the_fix(tmp_path):
    class Oops(LookaheadError):
        pass

    with pytest.raises(Oops, match="not found: run `x`"):
        read_safetensors(tmp_path / "none.safetensors", "np", "config", Oops, "run `x`")
    (tmp_path / "bad.safetensors").write_bytes(b"garbage")
    with pytest.raises(Oops, match="is not readable .*: run `x`"):
        read_safetensors(tmp_path / "bad.safetensors", "np", "config", Oops, "run `x`")


def test_eval_mode_restores_the_mode_it_found():
    model = torch.nn.Dropout(0.5).train()
    with eval_mode(model):
        assert not model.training
    assert model.training
    with pytest.raises(RuntimeError), eval_mode(model):
        raise RuntimeError
    assert model.training


def test_position_totals_are_per_position_means():
    rng = np.random.default_rng(0)
    batches = [rng.random((2, 5)), rng.random((3, 5))]
    totals = PositionTotals()
    for b in batches:
        totals.add(b.size, nll=float(b.sum()), below=int((b < 0.5).sum()))
    every = np.concatenate([b.ravel() for b in batches])
    assert totals.positions == every.size
    assert totals.mean("nll") == pytest.approx(every.mean(), rel=1e-12)
    assert totals.mean("below") == pytest.approx((every < 0.5).mean(), rel=1e-12)


def test_the_nll_functions_are_log_softmax_of_the_target():
    torch.manual_seed(0)
    logits, targets = torch.randn(2, 4, 7), torch.randint(0, 7, (2, 4))
    reference = -torch.log_softmax(logits.double(), -1).gather(-1, targets[..., None])[..., 0]
    assert torch.allclose(token_nll(logits, targets).double(), reference, atol=1e-6)

    class Model(torch.nn.Module):
        def forward(self, input_ids):
            return type("Out", (), {"logits": F.one_hot(input_ids, 7).float() * 3.0})()

    windows = torch.tensor([[1, 2, 3, 3]])
    manual = -torch.log_softmax(F.one_hot(windows[:, :-1], 7).double() * 3.0, -1).gather(-1, windows[:, 1:, None])
    assert causal_lm_nll(Model(), windows).item() == pytest.approx(manual.mean().item(), rel=1e-6)
