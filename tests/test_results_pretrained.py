"""The results page's section on the pretrained LM (lookahead.tools.results_pretrained): rendered from
what `make smollm2-run` commits to metrics/smollm2/, nothing before the run starts."""

from __future__ import annotations

import json
import math
from pathlib import Path

from lookahead.tools.results_pretrained import bits_per_byte, pretrained_section


def write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_the_section_shows_the_runs_progress_then_its_claims(tmp_path):
    assert pretrained_section(tmp_path) == []
    d = tmp_path / "metrics" / "smollm2"
    write(d / "run.json", {"profile": "p", "stages": {"base": {"seconds": 314.0, "calls": 1, "done": True},
                                                       "oracle": {"seconds": 3600.0, "calls": 1, "done": False}}})
    write(d / "base.json", {"val_nll": 4.6643})
    write(d / "tokenizer.json", {"val_bytes_per_token": 4.1493})
    page = "\n".join(pretrained_section(tmp_path))
    assert f"{4.6643 / math.log(2) / 4.1493:.3f} bits a byte" in page and bits_per_byte(math.log(2), 1.0) == 1.0
    assert "| `oracle` | 1.00 | started |" in page and "| `base` | 0.09 | done |" in page
    assert "claim" not in page  # no claims before they are collected
    write(d / "headline.json", {"deployed_minus_static_pruning": -0.1})
    write(d / "report.json", {"window_set": "test:32x128:abcdef012345", "claims": {
        "deployed_minus_static_pruning": {"claimed": "below 0", "per_base": {"0": {
            "mean": -0.1, "ci_low": -0.15, "ci_high": -0.05, "verdict": "holds"}}}}})
    page = "\n".join(pretrained_section(tmp_path))
    assert "| `deployed_minus_static_pruning` | below 0 | -0.100 [-0.150, -0.050] | holds |" in page
    assert "test:32x128:abcdef012345" in page
