"""Strict configuration: every bad value is an error naming its key (docs/troubleshooting.md, STYLE 2)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lookahead.core.config import from_dict, load_section, to_dict
from lookahead.core.errors import ConfigError
from lookahead.lm.source import ModelSource
from lookahead.pipeline.base import BaseConfig
from lookahead.tools.params import SECTIONS, section_class, validate_all


def write_params(tmp_path, params):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params), encoding="utf-8")
    return path


@pytest.fixture
def default_params(repo_root):
    return yaml.safe_load((repo_root / "params.yaml").read_text())


def test_every_profile_validates(repo_root):
    for profile in sorted((repo_root / "profiles").glob("*.yaml")) + [repo_root / "params.yaml"]:
        configs = validate_all(profile)
        assert set(configs) == {"launch", "corpus", "wordnet", "tokenizer", "base", "probe", "init", "modulator",
                                "predictor", "runtime", "contexts", "oracle", "phase1", "pairs", "diffusion", "phase2",
                                "decoder_inputs", "static_baselines", "windows", "scoring", "evaluate"}


def test_default_profile_is_params_yaml(repo_root):
    default = yaml.safe_load((repo_root / "profiles" / "default.yaml").read_text())
    assert default == yaml.safe_load((repo_root / "params.yaml").read_text())


@pytest.mark.parametrize("section", list(SECTIONS))
def test_a_dataclass_default_is_the_default_profile(repo_root, section):
    # A section loaded from nothing (every key at its dataclass default) is the default profile's:
    # another profile that leaves a key out gets what the default pipeline runs with, not an old value.
    profile = validate_all(repo_root / "profiles" / "default.yaml")[section]
    assert to_dict(from_dict(section_class(section), {})) == to_dict(profile)


def test_embedded_default_is_at_least_4x4_olmo2(repo_root):
    base = load_section(repo_root / "params.yaml", "base", BaseConfig)
    assert base.source == "scratch"
    assert base.arch.n_layers >= 4 and base.arch.n_heads >= 4


@pytest.mark.parametrize(
    "edit, key, fragment",
    [
        (lambda p: p["base"]["train"].update(lr_typo=1e-3), "base.train.lr_typo", "unknown key"),
        (lambda p: p["base"]["arch"].update(n_heads=5), "base.arch.n_heads", "must divide hidden_size (128)"),
        (lambda p: p["base"]["arch"].update(n_layers="four"), "base.arch.n_layers", "must be an integer"),
        (lambda p: p["base"]["train"].update(steps=0), "base.train.steps", "must be >= 1"),
        (lambda p: p["base"]["train"].update(device="tpu"), "base.train.device", "'auto', 'cpu', 'cuda'"),
        (lambda p: p["base"].update(source="scratch", model="x"), "base.model", "must be null"),
        (lambda p: p["base"].update(source="path", model=None), "base.model", "must name a directory"),
        (lambda p: p["corpus"].update(val_fraction=1.5), "corpus.val_fraction", "must be in (0, 1)"),
        (lambda p: p["corpus"].update(source="web"), "corpus.source", "'wordnet', 'files', 'hf:<dataset id>'"),
        (lambda p: p["corpus"].update(source="files", files=[]), "corpus.files", "at least one file"),
        (lambda p: p["tokenizer"].update(vocab_size=100), "tokenizer.vocab_size", "must be in [300"),
        (lambda p: p["base"]["train"].update(grad_clip=True), "base.train.grad_clip", "must be a number"),
        (lambda p: p.update(phase9={}), "phase9", "unknown section"),
        (lambda p: p["wordnet"].update(n_anchors=1), "wordnet.n_anchors", "must be >= 2"),
        (lambda p: p["init"].update(softmax_temp=0), "init.softmax_temp", "must be > 0"),
        (lambda p: p["predictor"].update(rank=0), "predictor.rank", "must be >= 1"),
        (lambda p: p["probe"].update(seeds=[1, 1]), "probe.seeds", "distinct seeds"),
        (lambda p: p["wordnet"].update(path=""), "wordnet.path", "must be null or a directory"),
        (lambda p: p["base"]["arch"].pop("n_layers") and p["base"].pop("arch") and p.pop("base"), "base", "section missing"),
        (lambda p: p["contexts"].update(window=0), "contexts.window", "must be >= 1"),
        (lambda p: p["contexts"].update(encoder=" "), "contexts.encoder", "`minilm`, `base`"),
        (lambda p: p["phase1"].update(tau_end=2.0), "phase1.tau_end", "must be in (0, tau_start"),
        (lambda p: p["phase1"].update(lambda_head=-0.1), "phase1.lambda_head", "finite number >= 0"),
        (lambda p: p["phase1"].update(hard_from_step=10**6), "phase1.hard_from_step", "must be -1 (never)"),
        (lambda p: p["pairs"].update(keep=99), "pairs.keep", "must be <= samples"),
    ],
)
def test_bad_values_name_their_key(tmp_path, default_params, edit, key, fragment):
    edit(default_params)
    path = write_params(tmp_path, default_params)
    with pytest.raises(ConfigError) as info:
        validate_all(path)
    assert info.value.key == key
    assert fragment in str(info.value)


def test_numeric_strings_are_read_as_floats(tmp_path, default_params):
    # PyYAML reads `3e-4` (no dot) as a string; it is still a valid float.
    default_params["base"]["train"]["lr"] = "3e-4"
    cfg = load_section(write_params(tmp_path, default_params), "base", BaseConfig)
    assert cfg.train.lr == pytest.approx(3e-4)


def test_partial_view_reads_only_its_keys(tmp_path, default_params):
    default_params["base"]["arch"]["hidden_size"] = 130  # invalid for BaseConfig, not for the view
    source = load_section(write_params(tmp_path, default_params), "base", ModelSource, partial=True)
    assert source.source == "scratch"
    with pytest.raises(ConfigError):
        load_section(write_params(tmp_path, default_params), "base", BaseConfig)


def test_dry_run_prints_resolved_config_and_does_no_work(repo_root, tmp_path):
    out = subprocess.run(
        [sys.executable, str(repo_root / "stages" / "base.py"), "--dry-run"],
        cwd=repo_root, capture_output=True, text=True, check=True,
    ).stdout
    printed = yaml.safe_load(out)
    assert printed["base"]["arch"]["n_layers"] == load_section(repo_root / "params.yaml", "base", BaseConfig).arch.n_layers
    assert printed["base"]["train"]["lr"] == pytest.approx(3e-3)


def test_stage_rejects_bad_params_before_work(repo_root, tmp_path, default_params):
    default_params["base"]["arch"]["n_heads"] = 3
    path = write_params(tmp_path, default_params)
    proc = subprocess.run(
        [sys.executable, str(repo_root / "stages" / "base.py"), "--params", str(path), "--tokenizer", "t", "--tokens", "t",
         "--out", str(tmp_path / "b"), "--metrics", "m", "--report", "r", "--train-curve", "a", "--val-curve", "b", "--figure", "f",
         "--checkpoints", "c"],
        cwd=tmp_path, capture_output=True, text=True,
    )
    assert proc.returncode != 0
    assert proc.returncode == 2
    assert "base.arch.n_heads" in proc.stderr and "must divide hidden_size" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("edit, key", [
    (lambda p: p["phase1"]["train"].__setitem__("lr", -1), "phase1.train.lr"),
    (lambda p: p["base"]["arch"].__setitem__("n_heads", 3), "base.arch.n_heads"),
    (lambda p: p.__setitem__("bogus", {}), "bogus"),
])
def test_validate_command_prints_one_line_and_exits_2(repo_root, tmp_path, default_params, edit, key):
    # `python -m` runs lookahead.tools.params as __main__: the ConfigError the section classes raise
    # must still be caught (it once escaped as a traceback)
    edit(default_params)
    path = write_params(tmp_path, default_params)
    proc = subprocess.run([sys.executable, "-m", "lookahead.tools.params", str(path)], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith(f"error (params): {path}: {key}:")


def test_validate_command_names_a_broken_file(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("corpus: [1\n")
    proc = subprocess.run([sys.executable, "-m", "lookahead.tools.params", str(path)], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "not valid YAML (line 2" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_make_repro_refuses_bad_params_before_dvc_runs(repo_root, tmp_path, default_params):
    # `make repro` = set-up, `check-params`, `dvc repro`; the check stops it with the one-line error.
    # The set-up is already done here (this venv): -o keeps make from redoing it.
    default_params["base"]["arch"]["n_heads"] = 3
    path = write_params(tmp_path, default_params)
    venv = Path(sys.executable).parent.parent
    proc = subprocess.run(
        ["make", "-s", "--no-print-directory", "-n", "repro", f"VENV={venv}", f"PARAMS={path}"],
        cwd=repo_root, capture_output=True, text=True, check=True,
    )
    recipe = proc.stdout.splitlines()
    check = next(i for i, line in enumerate(recipe) if "-m lookahead.tools.params" in line)
    assert any("dvc repro" in line for line in recipe[check + 1:])  # the check comes first
    proc = subprocess.run(["make", "-s", "--no-print-directory", "check-params", f"VENV={venv}", f"PARAMS={path}",
                           "-o", f"{venv}/.installed"], cwd=repo_root, capture_output=True, text=True)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert f"error (params): {path}: base.arch.n_heads: must divide hidden_size" in proc.stderr


def test_the_estimate_counts_what_a_hugging_face_model_holds_and_runs():
    """lookahead.tools.estimate against references: the parameters of a stock OLMo2 model, and the
    matmul FLOPs torch's FlopCounterMode counts in its forward (attention's own FLOPs aside)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import Olmo2Config, Olmo2ForCausalLM

    from lookahead.tools.estimate import Arch

    arch = Arch(layers=2, heads=4, hidden=64, ffn=96, vocab=300)
    model = Olmo2ForCausalLM(Olmo2Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False))
    assert arch.params == sum(p.numel() for p in model.parameters())
    t = 32
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, t, dtype=torch.long))
    attention = sum(n for op, n in counter.get_flop_counts()["Global"].items() if "attention" in str(op))
    linear = counter.get_total_flops() - attention
    ours = arch.forward_flops(t) * t - 2 * arch.layers * t * arch.hidden * t  # our attention term aside
    assert abs(ours - linear) / linear < 0.01, (ours, linear)  # the norms' weights: counted as parameters only


def test_the_estimate_of_the_real_target_prints_every_stage(capsys, repo_root):
    from lookahead.tools.params import main

    assert main([str(repo_root / "profiles/olmo2-1b.yaml"), "--estimate", "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    stages = {r["stage"]: r for r in est["stages"]}
    assert list(stages) == list(yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"])  # every stage, in order
    assert 1.4e9 < est["params"] < 1.6e9 and est["arch"]["heads"] == est["arch"]["layers"] == 16
    assert stages["phase2"]["optimiser_gib"] * 2**30 == pytest.approx(12 * stages["phase2"]["params_trained"])
    assert stages["phase1"]["flops"] > 2 * 2 * 1e9 * stages["phase1"]["train_tokens"]  # a forward + activation grads of 1B+
    assert est["total_hours"] == pytest.approx(sum(r["hours"] for r in est["stages"]))
    assert main([str(repo_root / "profiles/olmo2-1b.yaml"), "--estimate"]) == 0
    table = capsys.readouterr().out
    assert "phase2" in table and "GPU-hours" in table


def test_the_smollm2_profile_is_costed_from_one_measured_forward(capsys, repo_root):
    """FORWARD_S: the stages' hours at the rate one measured context-length forward reached; the base
    stage (a loaded model measured on eval_tokens) then costs eval_tokens / T such forwards exactly."""
    from lookahead.tools.params import main

    profile = str(repo_root / "profiles/smollm2-135m.yaml")
    assert main([profile, "--estimate", "--json", "--forward-seconds", "0.59"]) == 0
    est = json.loads(capsys.readouterr().out)
    a, stages = est["arch"], {r["stage"]: r for r in est["stages"]}
    assert (a["layers"], a["heads"], a["kv_heads"], a["hidden"], a["vocab"]) == (30, 9, 3, 576, 49152)  # its header
    tokens = yaml.safe_load(Path(profile).read_text())["base"]["eval_tokens"]
    assert stages["base"]["hours"] * 3600 == pytest.approx(tokens / 128 * 0.59)
    assert main([profile, "--estimate", "--forward-seconds", "0.59"]) == 0
    assert "hours on the measured machine" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([profile, "--estimate", "--forward-seconds", "0"])


@pytest.mark.parametrize("per_round,candidates", [(1, 0), (2, 0), (1, 4), (2, 4), (3, 300)])
def test_the_estimate_counts_the_oracles_trials_as_the_oracle_runs_them(repo_root, per_round, candidates):
    """The estimate writes greedy_trials out to keep torch out of `make estimate`: its count of trial
    forwards is the oracle's own (lookahead.graph.oracle.greedy_trials), for exact and lazy searches."""
    from lookahead.graph.oracle import greedy_trials
    from lookahead.tools.estimate import estimate
    from lookahead.tools.params import validate_all

    configs = validate_all(repo_root / "profiles/olmo2-1b.yaml")
    configs["oracle"] = dataclasses.replace(configs["oracle"], per_round=per_round, candidates=candidates)
    oracle = next(r for r in estimate(configs)["stages"] if r["stage"] == "oracle")
    keep = round(configs["predictor"].keep * 256)
    assert f": {greedy_trials(256, keep, per_round, candidates)} forwards per window" in oracle["note"]
