"""Shared fixtures: the repository root, a seed, tiny tokenizers and token streams."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture
def seed() -> int:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    return 0


@pytest.fixture(scope="session")
def wn():
    """The real WordNet 3.0 (installed by `make test`'s set-up)."""
    from lookahead.wordnet_data import open_wordnet

    return open_wordnet(root=REPO)


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """A byte-level BPE trained on a small synthetic text, saved and reloaded with AutoTokenizer."""
    from transformers import AutoTokenizer

    from lookahead.tokenizer import TokenizerConfig, train_bpe

    d = tmp_path_factory.mktemp("tok")
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
    rng = random.Random(0)
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(400)]
    (d / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    tok = train_bpe(d / "train.txt", TokenizerConfig(vocab_size=320, min_frequency=2))
    tok.save_pretrained(d / "saved")
    return AutoTokenizer.from_pretrained(d / "saved")
