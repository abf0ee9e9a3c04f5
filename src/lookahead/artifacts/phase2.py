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


