"""The base stage's model: OLMo2 from params, and snapshotting an existing HF directory."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, Olmo2Config, Olmo2ForCausalLM

from lookahead.core.errors import ConfigError
from lookahead.lm.nll import causal_lm_nll
from lookahead.lm.olmo2 import ArchConfig, olmo2_config
from lookahead.pipeline.base import CONFIG_FILE, BaseConfig, build_base
from lookahead.train.loop import TrainConfig


def write_streams(tmp_path, vocab, n=3000):
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    rng = np.random.default_rng(0)
    np.save(tokens / "train.npy", rng.integers(0, vocab, size=n).astype(np.uint16))
    np.save(tokens / "val.npy", rng.integers(0, vocab, size=n // 3).astype(np.uint16))
    return tokens


def test_olmo2_config_from_params(tiny_tokenizer):
    arch = ArchConfig(n_layers=3, n_heads=4, hidden_size=32, intermediate_size=48, context_length=16, rope_theta=500.0)
    cfg = olmo2_config(arch, tiny_tokenizer)
    assert isinstance(cfg, Olmo2Config)
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (3, 4, 4)
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.max_position_embeddings) == (32, 48, 16)
    assert cfg.vocab_size == len(tiny_tokenizer) and cfg.eos_token_id == tiny_tokenizer.eos_token_id
    assert cfg.rope_parameters["rope_theta"] == 500.0


def test_nll_matches_a_manual_log_softmax(seed, tiny_tokenizer):
    model = Olmo2ForCausalLM(olmo2_config(ArchConfig(n_layers=1, n_heads=2, hidden_size=16, intermediate_size=16, context_length=8), tiny_tokenizer))
    windows = torch.randint(0, len(tiny_tokenizer), (3, 9))
    logp = torch.log_softmax(model(windows[:, :-1]).logits, dim=-1)
    manual = -logp.gather(-1, windows[:, 1:, None]).mean()
    assert causal_lm_nll(model, windows).item() == pytest.approx(manual.item(), rel=1e-6)


def test_scratch_build_saves_a_loadable_model_with_its_config(tmp_path, tiny_tokenizer):
    tokens = write_streams(tmp_path, len(tiny_tokenizer))
    cfg = BaseConfig(
        arch=ArchConfig(n_layers=1, n_heads=2, hidden_size=16, intermediate_size=16, context_length=8),
        train=TrainConfig(steps=4, batch_size=2, eval_every=2, device="cpu"),
        eval_tokens=400, periodic_eval_tokens=64,
    )
    metrics, result = build_base(cfg, tiny_tokenizer, tokens, tmp_path / "base", checkpoint_root=tmp_path / "ckpt")
    assert (tmp_path / "base" / "model.safetensors").is_file()
    saved = json.loads((tmp_path / "base" / CONFIG_FILE).read_text())
    assert saved["arch"]["hidden_size"] == 16 and saved["train"]["steps"] == 4
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    assert isinstance(reloaded, Olmo2ForCausalLM)
    assert metrics["val_ppl"] == pytest.approx(np.exp(metrics["val_nll"]))
    assert metrics["val_tokens_scored"] == 400
    assert metrics["train_tokens_per_s"] > 0 and [r["step"] for r in result.eval_curve] == [2, 4]


def test_path_source_snapshots_an_existing_model(tmp_path, tiny_tokenizer, seed):
    # a tiny "pretrained" HF model directory, saved as a user would have it
    src_model = Olmo2ForCausalLM(olmo2_config(ArchConfig(n_layers=2, n_heads=2, hidden_size=16, intermediate_size=32, context_length=8), tiny_tokenizer))
    src_model.save_pretrained(tmp_path / "hf-model")
    tiny_tokenizer.save_pretrained(tmp_path / "hf-model")
    tokens = write_streams(tmp_path, len(tiny_tokenizer))
    cfg = BaseConfig(source="path", model=str(tmp_path / "hf-model"), arch=ArchConfig(context_length=8), eval_tokens=200)
    metrics, result = build_base(cfg, tiny_tokenizer, tokens, tmp_path / "base")
    assert result is None and metrics["train_tokens_per_s"] is None
    copied = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    for (name, a), (_, b) in zip(src_model.state_dict().items(), copied.state_dict().items()):
        assert torch.equal(a, b), name
    assert (tmp_path / "base" / "model.safetensors").is_file()
    assert metrics["n_layers"] == 2


def test_a_loaded_bases_replicate_moves_one_ulp_in_a_share_of_its_weights(tmp_path, tiny_tokenizer):
    """``base.init_perturbation`` on a loaded base (the replicate of a pretrained LM): that share of the
    loaded weights, each by exactly one float32 ulp; every other entry the file's bytes."""
    src_model = Olmo2ForCausalLM(olmo2_config(ArchConfig(n_layers=2, n_heads=2, hidden_size=16, intermediate_size=32,
                                                         context_length=8), tiny_tokenizer))
    src_model.save_pretrained(tmp_path / "hf-model")
    tiny_tokenizer.save_pretrained(tmp_path / "hf-model")
    tokens = write_streams(tmp_path, len(tiny_tokenizer))
    cfg = BaseConfig(source="path", model=str(tmp_path / "hf-model"), arch=ArchConfig(context_length=8), eval_tokens=200,
                     init_perturbation=0.25)
    build_base(cfg, tiny_tokenizer, tokens, tmp_path / "base")
    moved, total = 0, 0
    for (name, a), (_, b) in zip(src_model.state_dict().items(),
                                 AutoModelForCausalLM.from_pretrained(tmp_path / "base").state_dict().items()):
        differ = a != b
        assert torch.equal(b[differ], torch.nextafter(a[differ], b[differ])), name  # one ulp, no more
        assert torch.equal(torch.nextafter(b[differ], a[differ]), a[differ]), name
        moved, total = moved + int(differ.sum()), total + a.numel()
    assert 0.2 < moved / total < 0.3


def test_path_source_missing_directory_is_a_config_error(tmp_path, tiny_tokenizer):
    tokens = write_streams(tmp_path, len(tiny_tokenizer))
    cfg = BaseConfig(source="path", model=str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="base.model: directory .* not found"):
        build_base(cfg, tiny_tokenizer, tokens, tmp_path / "base")
    assert not (tmp_path / "base").exists()
