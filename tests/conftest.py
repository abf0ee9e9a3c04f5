"""Shared fixtures: the repository root, a seed, tiny tokenizers and token streams."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(items):
    """The reliability suite last: it starts from the tiny pipeline run the pipeline tests make."""
    items.sort(key=lambda item: "reliability" in item.path.parts)


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


def save_tiny_lm(path, tokenizer, hidden: int = 32, n_layers: int = 2, n_heads: int = 2, seed: int = 0):
    """A tiny random OLMo2 causal LM saved with ``tokenizer`` as an HF model directory."""
    from transformers import Olmo2Config, Olmo2ForCausalLM

    torch.manual_seed(seed)
    cfg = Olmo2Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=48, num_hidden_layers=n_layers,
                      num_attention_heads=n_heads, num_key_value_heads=n_heads, max_position_embeddings=256,
                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                      bos_token_id=tokenizer.bos_token_id)
    Olmo2ForCausalLM(cfg).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def phase_inputs(tiny_tokenizer, tmp_path_factory):
    """The inputs of phase 1 and pairs for a tiny random 2 x 2-head LM: model directory, token
    streams, a context cache (the `base` encoder), an init file and head statistics."""
    from safetensors.torch import save_file

    from lookahead.contexts import ContextsConfig, build_contexts
    from lookahead.graph import n_nodes

    d = tmp_path_factory.mktemp("phase_inputs")
    base = save_tiny_lm(d / "base", tiny_tokenizer)
    rng = np.random.default_rng(0)
    (d / "tokens").mkdir()
    np.save(d / "tokens" / "train.npy", rng.integers(2, len(tiny_tokenizer), 4000).astype(np.uint16))
    np.save(d / "tokens" / "val.npy", rng.integers(2, len(tiny_tokenizer), 1000).astype(np.uint16))
    cfg = ContextsConfig(encoder="base", train_sequences=12, val_sequences=4, batch_size=4, device="cpu")
    build_contexts(cfg, 12, tiny_tokenizer, d / "tokens", base, d / "contexts")
    gen = torch.Generator().manual_seed(0)
    vocab, n = len(tiny_tokenizer), n_nodes(2, 2)
    save_file({"geo_table": torch.randn(vocab, 4, generator=gen), "geo_mask": (torch.rand(vocab, generator=gen) > 0.5).float(),
               "U0": 0.3 * torch.randn(n, 2, generator=gen), "V0": 0.3 * torch.randn(n, 2, generator=gen)},
              str(d / "init.safetensors"), metadata={"config": '{"n_layers": 2}'})
    save_file({"importance": torch.tensor([[0.3, 0.1], [0.05, 0.2]])}, str(d / "heads.safetensors"))
    return {"base": base, "tokens": d / "tokens", "contexts": d / "contexts", "init": d / "init.safetensors",
            "heads": d / "heads.safetensors", "root": d}


def sh(cmd: list[str], cwd: Path, env: dict, check: bool = True) -> str:
    """Run a command; its stdout + stderr, or an AssertionError showing them when it fails."""
    from lookahead.faults import run

    try:
        return run(cmd, cwd, env, check)
    except RuntimeError as err:
        raise AssertionError(str(err)) from None


@pytest.fixture(scope="session")
def pipeline_repo(tmp_path_factory):
    """A fresh git + DVC repository holding the project's files, with the tiny profile as params:
    (path, env). Shared by the pipeline and sharing tests (one tiny `dvc repro` per session)."""
    from lookahead.faults import scratch_repo

    return scratch_repo(REPO, tmp_path_factory.mktemp("pipeline") / "repo")


@pytest.fixture(scope="session")
def downstream_inputs(phase_inputs, tmp_path_factory):
    """What phase 2 and evaluate read besides ``phase_inputs``: a phase-1 predictor (init bias 1: a
    mix of heads on and off) and a diffusion head trained for a few steps on its pairs."""
    from lookahead.config import from_dict
    from lookahead.contexts import ContextCache
    from lookahead.diffusion_train import DiffusionConfig, build_diffusion
    from lookahead.pairs import PairsConfig, build_pairs
    from lookahead.predictor import PredictorConfig, StructurePredictor, save_predictor

    d = tmp_path_factory.mktemp("downstream")
    cache = ContextCache(phase_inputs["contexts"])
    torch.manual_seed(0)
    predictor = StructurePredictor.from_init(PredictorConfig(rank=2, hidden=8, init_bias=1.0), phase_inputs["init"],
                                             cache.dim)
    torch.nn.init.normal_(predictor.to_v.weight, std=0.5)  # as if trained: the topology depends on the context
    save_predictor(predictor, d / "predictor.safetensors")
    build_pairs(PairsConfig(sequences=6, samples=4, keep=2, batch_size=3, approx_positions=0, device="cpu"),
                phase_inputs["base"], phase_inputs["contexts"], phase_inputs["init"], d / "predictor.safetensors",
                d / "pairs")
    cfg = from_dict(DiffusionConfig, {
        "denoiser": {"hidden": 8, "layers": 1, "rank": 2, "cond_hidden": 8}, "sample_steps": 2, "eval_samples": 2,
        "heldout_fraction": 0.25, "eval_batch_size": 2, "val_pairs": 16,
        "train": {"steps": 2, "batch_size": 8, "warmup_steps": 1, "eval_every": 2, "log_every": 1,
                  "checkpoint_every": 0, "device": "cpu"}})
    build_diffusion(cfg, phase_inputs["base"], phase_inputs["contexts"], phase_inputs["init"],
                    d / "predictor.safetensors", d / "pairs", d / "diffusion")
    return {**phase_inputs, "predictor": d / "predictor.safetensors", "diffusion": d / "diffusion", "root": d}


@pytest.fixture(scope="session")
def phase2_run(downstream_inputs, tmp_path_factory):
    """The phase-2 stage (decoder mlp) and its dense control on the tiny inputs: (config, phase-2
    report, its training result, its output directory, the control's report, its LM directory, root)."""
    from lookahead.config import from_dict
    from lookahead.phase2 import Phase2Config, build_control, build_phase2

    d = tmp_path_factory.mktemp("phase2")
    cfg = from_dict(Phase2Config, {
        "hard_from_step": 1, "eval_batch_size": 2,
        "train": {"steps": 3, "batch_size": 2, "lr": 1e-3, "warmup_steps": 1, "eval_every": 2, "log_every": 1,
                  "checkpoint_every": 2, "device": "cpu"}})
    i = downstream_inputs
    report, result = build_phase2(cfg, i["base"], i["tokens"], i["contexts"], i["init"], i["predictor"], i["diffusion"],
                                  d / "out", d / "ckpt")
    control, _ = build_control(cfg, i["base"], i["tokens"], i["contexts"], d / "control", d / "ckpt")
    return {"cfg": cfg, "report": report, "result": result, "out": d / "out", "control": control,
            "control_dir": d / "control", "root": d}


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """An OpenSSH server on 127.0.0.1:<free port> accepting one generated key; yields
    (port, key file, a refused key file, home with known_hosts). `make setup` installs openssh-server."""
    from lookahead.faults import start_sshd

    proc, port, key, stranger, home = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield port, key, stranger, home
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def reproduced(pipeline_repo, tmp_path_factory):
    """A private copy of the tiny pipeline repository after `dvc repro` (a no-op when the pipeline
    tests ran first), everything committed: the state a fault starts from and must come back to."""
    path, env = pipeline_repo
    sh(["dvc", "repro"], path, env)
    dest = tmp_path_factory.mktemp("reproduced") / "repo"
    shutil.copytree(path, dest, symlinks=True)
    sh(["git", "add", "-A"], dest, env)
    sh(["git", "commit", "-qm", "reproduced", "--allow-empty"], dest, env)
    return dest, env
