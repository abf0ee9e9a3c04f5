"""The real target's profile (profiles/olmo2-1b.yaml) made runnable on a CPU in a test: the hub's
models replaced by tiny ones of the same kind in a local hub cache, the sizes of the tiny profile.

- ``allenai/OLMo-2-0425-1B`` becomes a random OLMo2 with the 1B model's head layout (16 layers ×
  16 heads) at width 64, and ``Qwen/Qwen3-Embedding-0.6B`` (the context encoder) a random 2-layer
  Qwen3, both with a byte-level BPE trained on WordNet text, saved where the hub cache keeps those
  ids at revision ``main``; with ``HF_HUB_OFFLINE=1`` every ``from_pretrained(<hub id>)`` of the
  pipeline reads them there — the hub's code path, without the network.
- :func:`runnable_profile`: every count (steps, batch sizes, windows) the tiny profile sets lower,
  one seed per research stage (the tiny runs cover seeds), the modulator's windows at the context
  length, the greedy oracle on one window, two rounds: down to 254 of the 256 heads, the greedy static
  mask down to 224, every device ``cpu``;
  everything else — sources, model ids, the predictor's cascade gates, pairs' target, phase 2's
  settings, precisions, learning rates — the 1B profile's.

The same run then goes on with SmolLM2's profile (profiles/smollm2-135m.yaml) in a second repository
beside the first: its GGUF file becomes a tiny grouped Llama written as GGUF (:func:`gguf_base`: 2
layers x 4 query heads sharing 2 key/value heads, a byte-level BPE trained on WordNet text with
SmolLM2's special tokens), read through ``base.source: gguf`` with its sha256 checked;
:func:`runnable_gguf_profile` sets its counts as :func:`runnable_profile` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

BASE_ID = "allenai/OLMo-2-0425-1B"
ENCODER_ID = "Qwen/Qwen3-Embedding-0.6B"
SNAPSHOT = "0" * 40


def _smaller(real: dict, tiny: dict) -> dict:
    """``real`` with every count ``tiny`` sets lower, and ``tiny``'s seed lists."""

    def merge(a, b):
        if isinstance(a, dict):
            return {k: merge(v, b.get(k) if isinstance(b, dict) else None) for k, v in a.items()}
        if isinstance(a, int) and not isinstance(a, bool) and isinstance(b, int) and not isinstance(b, bool):
            return b if 0 < b < a else a  # a smaller count; a choice (0 = off or all, -1 = never) stays
        if isinstance(a, list) and a and all(isinstance(x, int) for x in a) and isinstance(b, list):
            return b  # seed lists
        return a

    return merge(real, tiny)


def _one_seed_on_cpu(out: dict) -> dict:
    """One seed per research stage (the tiny runs cover seeds), every device ``cpu``."""
    for section in out.values():
        if isinstance(section, dict) and isinstance(section.get("seeds"), int):
            section["seeds"] = 1

    def cpu(node):
        if isinstance(node, dict):
            return {k: "cpu" if k == "device" else cpu(v) for k, v in node.items()}
        return node

    return cpu(out)


def runnable_gguf_profile(repo_root: Path, gguf_file: Path, sha256: str) -> dict[str, Any]:
    """profiles/smollm2-135m.yaml on the tiny grouped Llama ``gguf_file``: the tiny profile's integers, one
    seed per stage, every device on the CPU; its choices (the GGUF source, query heads at half off, the
    lazy oracles, the scoring oracle's leave-one-out from the greedy search, the declared shares) kept."""
    real = yaml.safe_load((repo_root / "profiles/smollm2-135m.yaml").read_text())
    out = _smaller(real, yaml.safe_load((repo_root / "profiles/tiny.yaml").read_text()))
    out["base"].update(model=str(gguf_file), sha256=sha256)
    out["base"]["arch"]["context_length"] = 32  # the tiny profile's windows (the stand-in holds 64 positions)
    out["static_baselines"]["min_keep"] = 2  # down to 25 % of the 8 heads, as the profile's 67 of 270
    out["modulator"]["seq_len"] = 0
    return _one_seed_on_cpu(out)


def gguf_base(root: Path) -> tuple[Path, str]:
    """A tiny grouped Llama as a GGUF file at ``root`` (tests/gguf_files.py's writer): 2 layers x 4 query
    heads sharing 2 key/value heads, tied embeddings, a byte-level BPE of 1 024 tokens trained on
    WordNet text, ``<|endoftext|>`` first; (its path, its sha256)."""
    import hashlib
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from lookahead.semantics.wordnet_source import open_wordnet
    from tests.gguf_files import SPECIALS, tiny_llama, write_gguf

    synsets = list(open_wordnet(None).all_synsets())
    random.Random(0).shuffle(synsets)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((f"{s.lemmas()[0].name().replace('_', ' ')}: {s.definition()}" for s in synsets[:6000]),
                            trainer)
    root.mkdir(parents=True, exist_ok=True)
    path = write_gguf(root / "tiny-grouped-llama.gguf", tiny_llama(tok, heads=4, kv_heads=2), tok)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def runnable_profile(repo_root: Path) -> dict[str, Any]:
    """profiles/olmo2-1b.yaml with the tiny profile's integers and every device on the CPU."""
    real = yaml.safe_load((repo_root / "profiles/olmo2-1b.yaml").read_text())
    tiny = yaml.safe_load((repo_root / "profiles/tiny.yaml").read_text())

    out = _smaller(real, tiny)
    # the greedy oracle's work grows with (L·H) × the heads it removes: at 16 × 16 one window, in
    # the 1B profile's batches, two rounds (greedy, not leave-one-out alone): down to 254 of the 256
    # heads (the router keeps as many). Alone on 2 cores the oracle stage took 26 s with eight rounds
    # (keep 0.97), 13 s with two, for the same code path.
    out["oracle"].update(windows=1, rows=real["oracle"]["rows"])
    out["predictor"]["keep"] = 0.992  # round(0.992 x 256) = 254
    # the lazy greedy static mask likewise: 32 steps (down to 224 heads: the router's 254 and the
    # counts near it), where down to 0 it took 136 s of a test run, the longest stage of this run
    out["static_baselines"]["min_keep"] = 224
    out["modulator"]["seq_len"] = out["base"]["arch"]["context_length"]  # the 1B profile's 1024 > the stand-in's context
    # the 1B profile's micro-batches and checkpointing run here too, as many micro-batches as the tiny batch holds
    for name in ("phase1", "phase2"):
        train = out[name]["train"]
        train["accumulate"] = min(train["accumulate"], train["batch_size"])
    return _one_seed_on_cpu(out)


def hub_cache(root: Path) -> Path:
    """A hub cache at ``root`` holding tiny stand-ins of the profile's two hub models."""
    import random

    import torch
    from transformers import AutoTokenizer, Olmo2Config, Olmo2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from lookahead.pipeline.tokenizer import TokenizerConfig, train_bpe
    from lookahead.semantics.wordnet_source import open_wordnet

    wn = open_wordnet(None)
    synsets = list(wn.all_synsets())
    random.Random(0).shuffle(synsets)
    text = root / "wordnet.txt"
    root.mkdir(parents=True, exist_ok=True)
    text.write_text("\n".join(f"{s.lemmas()[0].name().replace('_', ' ')}: {s.definition()}" for s in synsets[:6000]))
    train_bpe(text, TokenizerConfig(vocab_size=1024, min_frequency=2)).save_pretrained(root / "tok")
    tok = AutoTokenizer.from_pretrained(root / "tok")
    special = {"pad_token_id": tok.pad_token_id, "eos_token_id": tok.eos_token_id, "bos_token_id": tok.bos_token_id}
    torch.manual_seed(0)
    models = {
        BASE_ID: Olmo2ForCausalLM(Olmo2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                              num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
                                              max_position_embeddings=256, **special)),
        ENCODER_ID: Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                                 num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                                 head_dim=16, max_position_embeddings=256, **special)),
    }
    cache = root / "hub"
    for name, model in models.items():
        repo = cache / f"models--{name.replace('/', '--')}"
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(SNAPSHOT)
        model.eval().save_pretrained(repo / "snapshots" / SNAPSHOT)
        tok.save_pretrained(repo / "snapshots" / SNAPSHOT)
    return cache
