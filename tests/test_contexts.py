"""Context encoders (docs/pipeline.md) and the context cache, on tiny models the tests make."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, Olmo2ForCausalLM

from lookahead.artifacts.contexts import ContextCache, ContextCacheError
from lookahead.core.errors import ConfigError
from lookahead.lm.encoders import (
    BaseLMContexts,
    CausalEmbedderContexts,
    EncoderError,
    MiniLMContexts,
    load_context_encoder,
    minilm_path,
)
from lookahead.pipeline.contexts import ContextsConfig, build_contexts, draw_windows
from tests.conftest import save_tiny_lm


@pytest.fixture(scope="module")
def base_dir(tiny_tokenizer, tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("base"), tiny_tokenizer)


@pytest.fixture(scope="module")
def embedder_dir(tmp_path_factory):
    """A tiny random causal 'embedding model' with a tokenizer of its own (another BPE)."""
    from lookahead.pipeline.tokenizer import TokenizerConfig, train_bpe

    d = tmp_path_factory.mktemp("embedder")
    rng = random.Random(1)
    words = ["al", "pha", "beta", "gam", "ma", "delta", "eps", "ilon", "zeta", "eta", "the", "ta", "io", "kappa"]
    text = "\n".join("".join(rng.choice(words) + rng.choice(["", " "]) for _ in range(12)) for _ in range(300))
    (d / "train.txt").write_text(text + "\n", encoding="utf-8")
    tok = train_bpe(d / "train.txt", TokenizerConfig(vocab_size=300, min_frequency=2))
    tok.save_pretrained(d / "tok")
    tok = AutoTokenizer.from_pretrained(d / "tok")
    return save_tiny_lm(d / "model", tok, hidden=24, seed=3)


def windows_pair(tokenizer, t: int, seed: int = 0):
    """Two batches of windows equal up to position t and different after it."""
    gen = torch.Generator().manual_seed(seed)
    lo = 2  # ordinary tokens (0 and 1 are <|endoftext|> and <|pad|>)
    a = torch.randint(lo, len(tokenizer), (2, 12), generator=gen)
    a[0, 3] = tokenizer.eos_token_id  # a document boundary inside a window
    b = a.clone()
    b[:, t + 1:] = torch.randint(lo, len(tokenizer), (2, 12 - t - 1), generator=gen)
    assert not torch.equal(a[:, t + 1:], b[:, t + 1:])
    return a, b


@pytest.fixture(scope="module")
def encoders(tiny_tokenizer, base_dir, embedder_dir):
    return {
        "minilm": MiniLMContexts(tiny_tokenizer, window=5),
        "base": BaseLMContexts(base_dir),
        "hf": CausalEmbedderContexts(str(embedder_dir), tiny_tokenizer),
    }


@pytest.mark.parametrize("kind", ["minilm", "base", "hf"])
def test_no_encoder_sees_tokens_after_t(kind, encoders, tiny_tokenizer):
    """The lookahead contract: change every token after t; every embedding at ≤ t is unchanged (up to float
    reassociation between batch shapes, 1e-5), while the later ones do change."""
    encoder = encoders[kind]
    t = 5
    a, b = windows_pair(tiny_tokenizer, t)
    ea, eb = encoder.encode(a), encoder.encode(b)
    assert ea.shape == (2, 12, encoder.dim)
    assert (ea[:, : t + 1] - eb[:, : t + 1]).abs().max() <= 1e-5
    assert (ea[:, t + 1:] - eb[:, t + 1:]).abs().max() > 1e-3


def test_minilm_position_is_the_sentence_embedding_of_its_window_text(encoders, tiny_tokenizer):
    """Reference: the model card's recipe on one text at a time (mean pooling, L2 normalisation)."""
    from transformers import AutoModel

    encoder = encoders["minilm"]
    ids, _ = windows_pair(tiny_tokenizer, 5)
    got = encoder.encode(ids)
    tok = AutoTokenizer.from_pretrained(minilm_path())
    model = AutoModel.from_pretrained(minilm_path()).eval()
    for b, t in ((0, 0), (0, 7), (1, 11)):
        text = tiny_tokenizer.decode(ids[b, max(0, t - 4) : t + 1].tolist())
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**enc).last_hidden_state[0]
        ref = F.normalize(hidden.mean(0), dim=-1)
        assert torch.allclose(got[b, t], ref, atol=1e-5), (b, t, text)
    assert encoder.dim == 384


def test_base_encoder_is_the_last_hidden_state_of_the_prefix(encoders, tiny_tokenizer, base_dir):
    encoder = encoders["base"]
    ids, _ = windows_pair(tiny_tokenizer, 5)
    got = encoder.encode(ids)
    lm = Olmo2ForCausalLM.from_pretrained(base_dir).eval()
    with torch.no_grad():
        for t in (0, 6, 11):
            ref = lm(ids[1:, : t + 1], output_hidden_states=True).hidden_states[-1][0, -1]
            assert torch.allclose(got[1, t], ref, atol=1e-5)


def test_hf_encoder_pools_the_last_token_of_each_base_token(encoders, tiny_tokenizer, embedder_dir):
    """Reference: one unbatched pass over the encoder tokens of base tokens ≤ t, each base token's
    text tokenized alone, last token's hidden state, L2-normalised."""
    encoder = encoders["hf"]
    ids, _ = windows_pair(tiny_tokenizer, 5)
    got = encoder.encode(ids)
    tok = AutoTokenizer.from_pretrained(embedder_dir)
    model = Olmo2ForCausalLM.from_pretrained(embedder_dir).eval()
    row = ids[0].tolist()
    for t in (2, 3, 9):
        pieces = []
        for token in row[: t + 1]:
            if token == tiny_tokenizer.eos_token_id:
                pieces += [tok.eos_token_id]
            else:
                pieces += tok(tiny_tokenizer.decode([token]), add_special_tokens=False)["input_ids"] or [tok.eos_token_id]
        with torch.no_grad():
            hidden = model(torch.tensor([pieces]), output_hidden_states=True).hidden_states[-1][0, -1]
        assert torch.allclose(got[0, t], F.normalize(hidden, dim=-1), atol=1e-5), t
    # the alignment really re-tokenizes: the encoder's ids are not the base ids
    seqs, _ = encoder.align(ids[:1])
    assert seqs[0] != row


def test_bad_encoder_specs_are_refused(tiny_tokenizer, base_dir, tmp_path):
    with pytest.raises(EncoderError, match="minilm"):
        load_context_encoder("minlm", base_dir, tiny_tokenizer, 8)
    with pytest.raises(EncoderError, match="not a causal"):
        load_context_encoder(str(minilm_path()), base_dir, tiny_tokenizer, 8)
    with pytest.raises(ConfigError, match="window"):
        ContextsConfig(window=0)


@pytest.fixture(scope="module")
def token_dir(tiny_tokenizer, tmp_path_factory):
    d = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(0)
    np.save(d / "train.npy", rng.integers(2, len(tiny_tokenizer), 3000).astype(np.uint16))
    np.save(d / "val.npy", rng.integers(2, len(tiny_tokenizer), 700).astype(np.uint16))
    return d


def test_cache_holds_seeded_windows_and_their_embeddings(tiny_tokenizer, token_dir, base_dir, tmp_path):
    cfg = ContextsConfig(encoder="base", train_sequences=6, val_sequences=4, batch_size=4, device="cpu")
    metrics = build_contexts(cfg, 16, tiny_tokenizer, token_dir, base_dir, tmp_path / "ctx")
    assert metrics["positions"] == (6 + 4) * 16 and metrics["encoder"] == "base" and metrics["positions_per_s"] > 0
    cache = ContextCache(tmp_path / "ctx")
    assert cache.dim == 32 and cache.context_length == 16
    train, val = np.load(token_dir / "train.npy"), np.load(token_dir / "val.npy")
    for w in cache.windows("train"):  # windows are pieces of the stream
        starts = [s for s in range(len(train) - 16) if (train[s : s + 17] == w).all()]
        assert starts
    val_starts = sorted(next(s for s in range(0, len(val) - 16, 16) if (val[s : s + 17] == w).all())
                        for w in cache.windows("val"))
    assert len(set(val_starts)) == 4  # distinct, non-overlapping windows (stride = T)
    windows, contexts = cache.batch("val", [1, 3])
    assert contexts.dtype == torch.float32 and cache.contexts("val").dtype == np.float16
    ref = BaseLMContexts(base_dir).encode(windows[:, :-1])
    assert torch.allclose(contexts, ref, atol=2e-3 * ref.abs().max())  # fp16 storage
    # same seed, same windows; another seed, others
    again = draw_windows(token_dir, cfg, 16)
    assert (again["train"] == cache.windows("train")).all()
    other = draw_windows(token_dir, ContextsConfig(encoder="base", train_sequences=6, val_sequences=4, seed=1), 16)
    assert not (other["train"] == cache.windows("train")).all()


def test_broken_cache_is_refused_with_the_fix(tiny_tokenizer, token_dir, base_dir, tmp_path):
    with pytest.raises(ContextCacheError, match="dvc repro contexts"):
        ContextCache(tmp_path / "nothing")
    cfg = ContextsConfig(encoder="base", train_sequences=2, val_sequences=2, device="cpu")
    build_contexts(cfg, 8, tiny_tokenizer, token_dir, base_dir, tmp_path / "ctx")
    path = tmp_path / "ctx" / "train_contexts.npy"
    path.write_bytes(path.read_bytes()[:200])  # truncated
    with pytest.raises(ContextCacheError, match="train_contexts.npy.*dvc checkout contexts"):
        ContextCache(tmp_path / "ctx")
    with pytest.raises(ConfigError, match="contexts.val_sequences"):
        build_contexts(ContextsConfig(encoder="base", val_sequences=1000), 8, tiny_tokenizer, token_dir, base_dir,
                       tmp_path / "big")
    assert not (tmp_path / "big").exists()
    meta = json.loads((tmp_path / "ctx" / "meta.json").read_text())
    assert meta["encoder"] == "base" and meta["dim"] == 32



ORDER_IN_A_FRESH_PROCESS = """
import hashlib, random
from lookahead.lm.encoders import encoding_order
rng = random.Random(0)
texts = [" ".join(rng.choice("ab cd ef gh ij".split()) for _ in range(rng.randint(2, 6))) for _ in range(500)]
print(hashlib.sha256("|".join(encoding_order(texts)).encode()).hexdigest())
"""


def test_minilm_batches_do_not_follow_the_string_hashing():
    """Each process hashes strings with its own seed, so a set of texts iterates in another order
    per run; which texts share an encoder batch (and so each text's float rounding) must not follow
    it. The seeds below give three different set orders of these texts."""
    import os
    import subprocess
    import sys

    digests = set()
    for hash_seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", ORDER_IN_A_FRESH_PROCESS], env=env, capture_output=True, text=True,
                             check=True).stdout
        digests.add(out.split()[-1])
    assert len(digests) == 1, digests
