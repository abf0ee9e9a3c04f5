"""``make estimate``'s memory against counts and measurements: weights and optimiser bytes counted
from a model, the activation term against what autograd saves on a shape its constants were not
fitted on (benchmarks/activation_memory.py), and the GPU check's plan run at toy sizes on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from benchmarks.activation_memory import CHECK, DOCS, FIT_SHAPES, STAGES, compare, lm_of, table
from lookahead.tools.estimate import Arch


def test_weights_and_optimiser_bytes_are_the_models_own():
    arch = Arch(layers=2, heads=4, hidden=64, ffn=160, vocab=300)
    lm = lm_of(arch)
    params = list(lm.parameters())
    assert sum(p.numel() * p.element_size() for p in params) == 4 * arch.params  # fp32 weights
    lm(input_ids=torch.randint(0, 300, (1, 8))).logits.sum().backward()
    optimizer = torch.optim.AdamW(params)
    optimizer.step()
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if t.dim() > 0)
    grads = sum(p.grad.numel() * p.grad.element_size() for p in params)
    assert state + grads == 12 * arch.params  # AdamW's two moments and the gradient, fp32


def test_the_activation_estimate_is_within_a_quarter_of_what_autograd_saves():
    """Every training stage, with and without checkpointing, in the 1B profile's settings, on a
    shape none of the fitted ones share a width, depth, head count, MLP ratio, vocabulary or context with."""
    a = CHECK["arch"]
    for shape in FIT_SHAPES:
        b = shape["arch"]
        assert a.hidden != b.hidden and a.layers != b.layers and a.heads != b.heads and a.vocab != b.vocab
        assert a.ffn / a.hidden != b.ffn / b.hidden and CHECK["context"] != shape["context"]
    figures = compare(CHECK)
    assert set(figures) == {f"{s}{c}" for s in STAGES for c in ("", " checkpointed")}
    for name, row in figures.items():
        assert 0.75 <= row["ratio"] <= 1.25, (name, row)
    for stage in STAGES:  # checkpointing keeps far less
        assert figures[f"{stage} checkpointed"]["measured_mib"] < 0.5 * figures[stage]["measured_mib"]
    # docs/scaling.md's table is this measurement (python benchmarks/activation_memory.py --write-docs)
    assert table(figures) in DOCS.read_text(encoding="utf-8")


@pytest.mark.slow  # a subprocess and the runtime benchmark's own: kept out of `make test-fast`
def test_the_gpu_check_runs_its_plan_without_dvc_mlflow_or_nltk(repo_root, tmp_path):
    """``--dry-run`` at toy sizes on the CPU, with DVC, MLflow, nltk and the tracking module unimportable."""
    runner = tmp_path / "run.py"
    runner.write_text(textwrap.dedent(f"""
        import runpy, sys
        for name in ("mlflow", "dvc", "nltk", "lookahead.core.tracking"):
            sys.modules[name] = None
        sys.argv = ["gpu_check.py", "--dry-run", "--out", "-"]
        runpy.run_path({str(repo_root / "benchmarks" / "gpu_check.py")!r}, run_name="__main__")
    """))
    env = {**os.environ, "PYTHONPATH": str(repo_root / "src")}
    proc = subprocess.run([sys.executable, str(runner)], cwd=repo_root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["dry_run"] and all(row["ok"] for row in result["exactness"].values()), result["exactness"]
    assert set(result["exactness"]) == {"float32_full", "float32_query", "bfloat16_full", "bfloat16_query"}
    assert "error" not in result["runtime"]["default"] and "generate_T32_full_50off_over_dense" in result["runtime"]["default"]
    assert {"phase1", "phase2"} == set(result["training"])
    assert result["training"]["phase2"]["checkpoint_activations"] and result["training"]["phase2"]["accumulate"] == 2
    # the results page shows a committed record (benchmarks/results/gpu.json) where there is one
    from lookahead.tools.results_runtime import gpu_section

    (tmp_path / "gpu.json").write_text(proc.stdout.strip().splitlines()[-1] + "\n")
    page = "\n".join(gpu_section(tmp_path / "gpu.json"))
    assert page.startswith("## On a GPU") and "`bfloat16_query`" in page and "| phase2 | 2 × 2 | yes |" in page
    assert gpu_section(tmp_path / "absent.json") == []
