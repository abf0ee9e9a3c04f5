"""Tiny GGUF files the tests write themselves, as llama.cpp's converter (convert_hf_to_gguf.py) writes a
Llama: the `gguf` package's writer, the query and key projections permuted into llama.cpp's rotary
layout, 1-D tensors in F32, the matrices in F32 or Q8_0 (rows a multiple of 32 wide), tied embeddings
by leaving the output tensor out, and a byte-level BPE vocabulary (`tokenizer.ggml.model: gpt2`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "the quick brown fox jumps over the lazy dog",
         "words and more words, numbers 12345", "end of text"] * 4
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def byte_level_tokenizer(vocab_size: int = 300):
    """A trained byte-level BPE (GPT-2's split), its three special tokens first (``<|endoftext|>`` = 0)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TEXTS, trainer)
    return tok


def tiny_llama(tok, heads: int = 4, kv_heads: int = 2, tied: bool = True, seed: int = 0):
    """A random LlamaForCausalLM over ``tok``'s vocabulary: 2 layers, hidden 64, head_dim 16, MLP 96,
    RoPE θ = 100 000, random norm weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=16, max_position_embeddings=64,
                         rope_theta=100_000.0, rms_norm_eps=1e-5, tie_word_embeddings=tied, bos_token_id=1,
                         eos_token_id=2, pad_token_id=2)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    return model


def permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary layout of a query or key projection (``heads`` its heads: key/value heads for k)."""
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def write_gguf(path: Path, model, tok, quantization: str = "F32") -> Path:
    """``model`` and ``tok`` as a GGUF file at ``path``; matrices in ``quantization`` (``F32`` or ``Q8_0``)."""
    import gguf

    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if quantization == "F32" else gguf.LlamaFileType.MOSTLY_Q8_0)

    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda item: item[1])]
    import json

    merges = [" ".join(m) if isinstance(m, (list, tuple)) else m
              for m in json.loads(tok.to_str())["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab["<|im_start|>"])
    writer.add_eos_token_id(vocab["<|im_end|>"])
    writer.add_pad_token_id(vocab["<|im_end|>"])

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    qtype = {"F32": gguf.GGMLQuantizationType.F32, "Q8_0": gguf.GGMLQuantizationType.Q8_0}[quantization]
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # tied: llama.cpp writes no output tensor
        data = tensor.detach().float().numpy().copy()
        if name.startswith("model.layers."):
            layer, rest = name[len("model.layers."):].split(".", 1)
            stem, kind = rest.rsplit(".", 1)
            out = f"blk.{layer}.{per_layer[stem]}.{kind}"
            if stem == "self_attn.q_proj":
                data = permute(data, cfg.num_attention_heads)
            elif stem == "self_attn.k_proj":
                data = permute(data, cfg.num_key_value_heads)
        else:
            out = names[name]
        if data.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(out, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(out, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
