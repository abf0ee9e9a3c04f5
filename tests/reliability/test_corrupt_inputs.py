"""Corrupt inputs: truncated or garbled safetensors, `.npy`, JSON and checkpoint files, an output
deleted under a clean-looking lock file, a WordNet directory with a file missing. Each is either
repaired by DVC (`dvc repro` restores what its lock file records) or stops the stage before work
with one line naming the file and the fix, no traceback, no new output, dvc.lock unchanged."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from lookahead.core.inputs import CorruptInput, check_input
from lookahead.semantics import wordnet_source as wordnet_data
from lookahead.tools.faults import flip_bit, truncate
from lookahead.train.checkpoints import CHECKPOINT_FILE, CheckpointError
from lookahead.train.loop import TrainConfig, train
from tests.conftest import sh
from tests.reliability.conftest import assert_up_to_date, lock_outs
from tests.test_trainer import Interrupted, lm_module

LOCK = """schema: '2.0'
stages:
  make:
    cmd: python make.py
    outs:
    - path: out
      hash: md5
      md5: 0123456789abcdef0123456789abcdef.dir
"""


@pytest.fixture
def outputs(tmp_path, monkeypatch):
    """A stage output directory `out` recorded in a dvc.lock, with one file of each checked kind."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dvc.lock").write_text(LOCK)
    out = tmp_path / "out"
    out.mkdir()
    save_file({"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(5)}, str(out / "model.safetensors"),
              metadata={"config": "{}"})
    np.save(out / "tokens.npy", np.arange(1000, dtype=np.uint16))
    (out / "meta.json").write_text(json.dumps({"n": 3}))
    (out / "notes.txt").write_text("anything")
    check_input("out")  # all whole
    return out


@pytest.mark.parametrize("damage, file, says", [
    (lambda p: truncate(p, 0.6), "model.safetensors", "is truncated"),
    (lambda p: truncate(p, 0.001), "model.safetensors", "is truncated"),
    (lambda p: flip_bit(p, 8, 1), "model.safetensors", "garbled header"),  # the header's opening brace
    (lambda p: flip_bit(p, 0, 4), "model.safetensors", "garbled header"),  # the header length: 16 bytes more
    (lambda p: flip_bit(p, 5, 0), "model.safetensors", "truncated or garbled"),  # the header length: 2**40 bytes more
    (lambda p: p.write_bytes(p.read_bytes() + b"\0" * 16), "model.safetensors", "longer than its header says"),
    (lambda p: truncate(p, 0.5), "tokens.npy", "is truncated"),
    (lambda p: flip_bit(p, 1, 0), "tokens.npy", "garbled header"),  # the magic string
    (lambda p: truncate(p, 0.5), "meta.json", "is not valid JSON"),
    (lambda p: p.unlink(), "meta.json", None),  # a file of the directory gone: the reader's error, see below
])
def test_damaged_input_is_named_with_the_fix(outputs, damage, file, says):
    damage(outputs / file)
    if says is None:
        check_input("out")  # a missing member file is not detectable from the directory alone ...
        with pytest.raises(CorruptInput, match=r"--meta out/meta.json does not exist: restore it with "
                                               r"`dvc checkout --force out`"):
            check_input("out/meta.json", "--meta")  # ... but a named input is
        return
    with pytest.raises(CorruptInput) as err:
        check_input("out", "--model")
    message = str(err.value)
    assert message.startswith(f"--model out/{file} ") and says in message.split(":")[0], message
    assert message.endswith("restore it with `dvc checkout --force out`, or rebuild it with `dvc repro -f make`"), message


def test_hidden_temporaries_of_a_killed_writer_are_not_inputs(outputs):
    (outputs / ".model.safetensors.abcdefgh.tmp").write_bytes(b"half")
    check_input("out")


def test_unreadable_checkpoint_is_named_with_the_fix(tiny_tokenizer, tmp_path):
    cfg = TrainConfig(steps=6, batch_size=2, eval_every=3, checkpoint_every=2, device="cpu")
    with pytest.raises(Interrupted):
        train(lm_module(tiny_tokenizer, cfg, interrupt_at=3), cfg, stage="test", checkpoint_dir=tmp_path)
    truncate(tmp_path / CHECKPOINT_FILE, 0.5)
    with pytest.raises(CheckpointError, match=rf"test: checkpoint {tmp_path / CHECKPOINT_FILE} cannot be read .*"
                                               rf"delete it to train from step 0: rm -r {tmp_path}"):
        train(lm_module(tiny_tokenizer, cfg), cfg, stage="test", checkpoint_dir=tmp_path)


def test_wordnet_with_a_file_missing(tmp_path, monkeypatch):
    debian = wordnet_data.debian_wordnet_dir()
    assert debian is not None, "make setup installs wordnet-base"
    # an explicit directory (wordnet.path) missing a file: named, with the install routes
    partial = tmp_path / "partial"
    partial.mkdir()
    for name in wordnet_data.REQUIRED_FILES:
        if name != "index.sense":
            (partial / name).symlink_to(debian / name)
    with pytest.raises(wordnet_data.WordNetMissing, match=r"missing index.sense"):
        wordnet_data.open_wordnet(partial, root=tmp_path)
    # the project-local copy missing a file: copied again from the Debian package
    local = wordnet_data.assemble(debian, tmp_path / wordnet_data.LOCAL_DATA_DIR) / "corpora" / "wordnet"
    (local / "index.sense").unlink()
    wn = wordnet_data.open_wordnet(root=tmp_path)
    assert (local / "index.sense").is_file() and wn.synset("dog.n.01").lemma_names()[0] == "dog"
    # ... and where the Debian package is gone too: named, with the reinstall command
    (local / "index.noun").unlink()
    monkeypatch.setattr(wordnet_data, "debian_wordnet_dir", lambda: None)
    with pytest.raises(wordnet_data.WordNetMissing,
                       match=r"missing index.noun\. Reinstall WordNet \(apt-get install --reinstall"):
        wordnet_data.open_wordnet(root=tmp_path)


@pytest.mark.slow
def test_truncated_input_stops_the_stage_and_the_fix_works(reproduced):
    repo, env = reproduced
    lock, reference = (repo / "dvc.lock").read_bytes(), lock_outs(repo)
    truncate(repo / "models" / "init" / "init.safetensors", 0.7)
    proc = sh(["dvc", "repro", "-s", "modulator"], repo, env, check=False)
    line = next(x for x in proc.splitlines() if x.startswith("error ("))
    assert line.startswith("error (CorruptInput): --init models/init/init.safetensors is truncated"), proc
    assert line.endswith("restore it with `dvc checkout --force models/init/init.safetensors`, or rebuild it with "
                         "`dvc repro -f init`"), line
    assert "Traceback" not in proc and "Running stage 'modulator'" in proc
    assert (repo / "dvc.lock").read_bytes() == lock
    assert not (repo / "models" / "modulator").exists()  # DVC removed it before the run; nothing new written
    sh(["dvc", "checkout", "--force", "models/init/init.safetensors"], repo, env)  # the fix the message names
    assert "Running stage" not in sh(["dvc", "repro"], repo, env)  # the modulator's outputs come back from the cache
    assert_up_to_date(repo, env)
    assert lock_outs(repo) == reference


@pytest.mark.slow
def test_flipped_bit_and_deleted_output_are_restored_by_dvc(reproduced):
    repo, env = reproduced
    reference = lock_outs(repo)
    contexts = repo / "data" / "contexts" / "train_contexts.npy"
    good = contexts.read_bytes()
    flip_bit(contexts, -5, 3)  # inside the float data: passes any header check
    predictor = repo / "models" / "phase1" / "predictor.safetensors"
    predictor.unlink()  # dvc.lock still records it
    status = sh(["dvc", "status"], repo, env)
    assert "modified:           data/contexts" in status and "deleted:            models/phase1" in status, status
    out = sh(["dvc", "repro"], repo, env)
    assert "Running stage" not in out, out  # restored from the cache, nothing recomputed
    assert contexts.read_bytes() == good and predictor.is_file()
    assert lock_outs(repo) == reference
    assert_up_to_date(repo, env)
    assert load_file(str(predictor))  # whole again
