"""Batches as pure functions of the step, evaluation windows, the unigram reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lookahead.train import data


def test_train_batches_depend_only_on_seed_step_and_salt():
    stream = np.arange(10_000, dtype=np.uint16)
    a = data.train_batch(stream, step=7, batch_size=4, seq_len=16, seed=3)
    b = data.train_batch(stream, step=7, batch_size=4, seq_len=16, seed=3)
    assert torch.equal(a, b) and a.shape == (4, 17) and a.dtype == torch.int64
    # windows are contiguous slices of the stream
    assert torch.equal(a[:, 1:] - a[:, :-1], torch.ones(4, 16, dtype=torch.int64))
    assert not torch.equal(a, data.train_batch(stream, step=8, batch_size=4, seq_len=16, seed=3))
    assert not torch.equal(a, data.train_batch(stream, step=7, batch_size=4, seq_len=16, seed=4))
    assert not torch.equal(a, data.train_batch(stream, step=7, batch_size=4, seq_len=16, seed=3, salt=40))


def test_processes_share_the_global_batch():
    from lookahead.train.loop import rank_rows

    windows = torch.arange(8 * 5).view(8, 5)
    batch = {"windows": windows, "tau": 0.5, "pair": (windows, torch.zeros(3)), "rows": np.arange(8) * 3}
    shares = [rank_rows(batch, r, 2, rows=8) for r in range(2)]
    assert torch.equal(torch.cat([s["windows"] for s in shares]), windows)  # disjoint, in order, complete
    assert shares[1]["rows"].tolist() == [12, 15, 18, 21]  # row indices (numpy) split with their rows
    assert shares[1]["tau"] == 0.5 and torch.equal(shares[1]["pair"][0], windows[4:])
    assert torch.equal(shares[0]["pair"][1], torch.zeros(3))  # not a batch-rows tensor: whole
    assert rank_rows(batch, 0, 1, rows=8) is batch


def test_eval_windows_score_every_target_once():
    stream = np.arange(1000, dtype=np.uint16)
    w = data.eval_windows(stream, seq_len=10, max_tokens=0)
    assert w.shape == (99, 11)
    targets = w[:, 1:].flatten()
    assert torch.equal(targets, torch.arange(1, 991))
    assert data.eval_windows(stream, seq_len=10, max_tokens=100).shape == (10, 11)


def test_too_short_streams_are_errors():
    with pytest.raises(ValueError, match="shorter than one window"):
        data.train_batch(np.arange(10), 0, 2, 16, 0)
    with pytest.raises(ValueError, match="shorter than one window"):
        data.eval_windows(np.arange(10), 16, 0)


def test_unigram_nll_closed_form():
    train = np.array([0, 0, 0, 1])  # add-one counts: 4, 2, 1 over vocab 3 -> p = 4/7, 2/7, 1/7
    targets = np.array([0, 1, 2])
    expected = -(np.log(4 / 7) + np.log(2 / 7) + np.log(1 / 7)) / 3
    assert data.unigram_nll(train, targets, vocab_size=3) == pytest.approx(expected)
