"""Read side of the phase-2 stage's output directory: its file names and its config.json."""

from __future__ import annotations

import json
from pathlib import Path

from lookahead.core.errors import LookaheadError


class Phase2OutputError(LookaheadError, ValueError):
    """The phase-2 output is missing or incomplete."""


LM_DIR = "lm"  # the save_pretrained directory inside the stage's output
PREDICTOR_FILE = "predictor.safetensors"  # decoder mlp: the co-trained predictor
CONFIG_FILE = "config.json"  # decoder, shapes, the phase2 config


def load_phase2(phase2_dir) -> dict:
    """The stage's config.json (decoder, shapes)."""
    path = Path(phase2_dir) / CONFIG_FILE
    if not path.is_file():
        raise Phase2OutputError(f"phase-2 output not found or incomplete: {path} (run `dvc repro phase2`)")
    return json.loads(path.read_text(encoding="utf-8"))





def write_pruning(phase2_dir, path) -> None:
    """The pruning the static control matches (``path``, a small json: DVC reruns the static control
    only when it changes): the phase-2 run's final active-head fraction and its skip mode."""
    from lookahead.core.atomic import write_json

    config = load_phase2(phase2_dir)
    write_json(path, {"active_head_fraction": config["active_head_fraction"], "skip": config["skip"]})


def phase2_pruning(path) -> tuple[float, str]:
    """(final active-head fraction, runtime skip mode) of the phase-2 run, from :func:`write_pruning`'s file."""
    path = Path(path)
    if not path.is_file():
        raise Phase2OutputError(f"phase-2 pruning file {path} not found: run `dvc repro phase2`")
    data = json.loads(path.read_text(encoding="utf-8"))
    return float(data["active_head_fraction"]), str(data["skip"])
