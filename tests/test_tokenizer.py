"""The byte-level BPE tokenizer and the token streams."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer

from lookahead.pipeline.tokenizer import EOS, PAD, TokenizerConfig, build_tokenizer, train_bpe


@pytest.mark.parametrize(
    "text",
    ["alpha beta gamma", "  leading and trailing spaces  ", "unseen words: zyxwvut, 12345!", "naïve café — 東京 🙂", "tabs\tand\nnewlines"],
)
def test_round_trip_is_exact(tiny_tokenizer, text):
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tiny_tokenizer.decode(ids) == text


def test_special_tokens(tiny_tokenizer):
    assert tiny_tokenizer.eos_token == EOS and tiny_tokenizer.bos_token == EOS and tiny_tokenizer.pad_token == PAD
    assert tiny_tokenizer.eos_token_id == 0 and tiny_tokenizer.pad_token_id == 1
    assert tiny_tokenizer.unk_token is None
    assert 258 < len(tiny_tokenizer) <= 320  # 256 bytes + 2 specials + merges, capped by vocab_size
    # special tokens are atomic, and plain text never produces them
    assert tiny_tokenizer(EOS, add_special_tokens=False)["input_ids"] == [0]
    assert 0 not in tiny_tokenizer("alpha beta", add_special_tokens=False)["input_ids"]


def test_words_inside_a_line_carry_the_leading_space_marker(tiny_tokenizer):
    tokens = tiny_tokenizer.convert_ids_to_tokens(tiny_tokenizer("alpha beta", add_special_tokens=False)["input_ids"])
    assert tokens == ["alpha", "Ġbeta"]


def test_streams_are_documents_followed_by_eos(tmp_path, tiny_tokenizer):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.txt").write_text("alpha beta\ngamma delta epsilon\n", encoding="utf-8")
    (corpus / "val.txt").write_text("zeta eta\n", encoding="utf-8")
    metrics = build_tokenizer(tiny_tokenizer, corpus, tmp_path / "tok", tmp_path / "tokens", batch_lines=1)
    train = np.load(tmp_path / "tokens" / "train.npy")
    assert train.dtype == np.uint16
    eos = tiny_tokenizer.eos_token_id
    docs = tiny_tokenizer.decode(train.tolist()).split(EOS)
    assert docs == ["alpha beta", "gamma delta epsilon", ""]
    # the stream's ids are the tokenizer's own call's (encoded in its backend's batch call: lm.tokens.encode_each)
    own = tiny_tokenizer(["alpha beta", "gamma delta epsilon"], add_special_tokens=False)["input_ids"]
    assert train.tolist() == own[0] + [eos] + own[1] + [eos]
    assert int((train == eos).sum()) == 2 and train[-1] == eos
    assert metrics["train_tokens"] == len(train) and metrics["val_tokens"] == len(np.load(tmp_path / "tokens" / "val.npy"))
    reloaded = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert reloaded("gamma delta")["input_ids"] == tiny_tokenizer("gamma delta")["input_ids"]


def test_training_is_deterministic(tmp_path):
    text = "\n".join(f"the quick brown fox {i} jumps over the lazy dog" for i in range(300))
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    a = train_bpe(tmp_path / "t.txt", TokenizerConfig(vocab_size=300))
    b = train_bpe(tmp_path / "t.txt", TokenizerConfig(vocab_size=300))
    assert a.get_vocab() == b.get_vocab()
