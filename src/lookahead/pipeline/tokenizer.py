"""Byte-level BPE tokenizer and the tokenized train/val streams (docs/pipeline.md).

Special tokens of the scratch tokenizer:

- ``<|endoftext|>`` (id 0): end of every document, and also the BOS token. Documents are
  concatenated as ``doc₁ <|endoftext|> doc₂ <|endoftext|> ...`` — no separate BOS is inserted,
  as in GPT-2 and OLMo's pretraining data.
- ``<|pad|>`` (id 1): padding only; never appears in the streams and is never a training target.

Byte-level means every string encodes without unknown tokens; words inside a line carry GPT-2's
leading-space marker (``Ġ``), the first word of a line does not.

With ``base.source: hub|path`` the model's own tokenizer is used instead (saved the same way).

The streams are two ``.npy`` token arrays (``train.npy``, ``val.npy``): a few big files that
later stages memory-map, not thousands of shards.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from tqdm import tqdm

from lookahead.core.atomic import atomic_dir
from lookahead.core.errors import require
from lookahead.lm.tokens import encode_each

EOS = "<|endoftext|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = (EOS, PAD)


@dataclasses.dataclass
class TokenizerConfig:
    """Byte-level BPE trained on the train split (ignored when base.source is hub or path)."""

    vocab_size: int = 4096
    """Size of the vocabulary, special tokens and the 256 byte symbols included."""
    min_frequency: int = 2
    """A merge needs at least this many occurrences."""
    batch_lines: int = 2048
    """Lines per batch when encoding the streams."""

    def __post_init__(self) -> None:
        require(
            300 <= self.vocab_size <= 1_000_000,
            "vocab_size",
            f"must be in [300, 1000000] (256 bytes + special tokens + merges); got {self.vocab_size}",
        )
        require(self.min_frequency >= 1, "min_frequency", f"must be >= 1; got {self.min_frequency}")
        require(self.batch_lines >= 1, "batch_lines", f"must be >= 1; got {self.batch_lines}")


def train_bpe(train_file: str | Path, cfg: TokenizerConfig):
    """Train a byte-level BPE on ``train_file``; return a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(train_file)], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=PAD, unk_token=None, model_max_length=1 << 30
    )


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.uint32)


def encode_file(tok, text_file: str | Path, batch_lines: int, desc: str) -> np.ndarray:
    """All lines of ``text_file``, each followed by EOS, as one token array."""
    eos = tok.eos_token_id
    dtype = token_dtype(len(tok))
    chunks: list[np.ndarray] = []
    with open(text_file, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for start in tqdm(range(0, len(lines), batch_lines), desc=desc, unit=" batches", mininterval=2.0):
        ids = encode_each(tok, lines[start : start + batch_lines])
        for doc in ids:
            chunks.append(np.asarray(doc + [eos], dtype=dtype))
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=dtype)


# metrics/tokenizer.json (lookahead.core.report)
HEADLINE = ("vocab_size", "train_tokens", "val_tokens", "val_bytes_per_token")

def build_tokenizer(tok, corpus_dir: str | Path, tokenizer_dir: str | Path, tokens_dir: str | Path, batch_lines: int) -> dict:
    """Save ``tok`` and the encoded train/val streams; return metrics."""
    corpus_dir = Path(corpus_dir)
    metrics: dict = {"vocab_size": len(tok), "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    with atomic_dir(tokens_dir) as tmp_tokens:
        for split in ("train", "val"):
            stream = encode_file(tok, corpus_dir / f"{split}.txt", batch_lines, desc=f"encode {split}")
            if stream.size < 2:
                raise ValueError(f"the {split} split encodes to {stream.size} tokens: too short to train on")
            np.save(tmp_tokens / f"{split}.npy", stream)
            n_chars = (corpus_dir / f"{split}.txt").stat().st_size
            metrics[f"{split}_tokens"] = int(stream.size)
            metrics[f"{split}_bytes_per_token"] = round(n_chars / stream.size, 4)
        with atomic_dir(tokenizer_dir) as tmp_tok:
            tok.save_pretrained(tmp_tok)
    return metrics
