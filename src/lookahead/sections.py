"""The sections of params.yaml and the dataclass each loads into (DESIGN §10).

:func:`validate_all` checks a whole params file at once — unknown sections included — before any
work: ``make repro`` runs it (``python -m lookahead.config params.yaml``), and each stage validates
its own sections again when it starts. Adding a stage adds a line here, and no stage depends on
this module, so that reruns nothing.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from lookahead.config import ConfigError, load_section, read_params

# section -> "module:Class"; strings, so that validating imports only what it needs
SECTIONS: dict[str, str] = {
    "launch": "lookahead.launch:LaunchConfig",
    "corpus": "lookahead.corpus:CorpusConfig",
    "wordnet": "lookahead.wordnet:WordNetConfig",
    "tokenizer": "lookahead.tokenizer:TokenizerConfig",
    "base": "lookahead.base:BaseConfig",
    "probe": "lookahead.probe:ProbeConfig",
    "init": "lookahead.init:InitConfig",
    "modulator": "lookahead.modulator:ModulatorConfig",
    "predictor": "lookahead.predictor:PredictorConfig",
    "contexts": "lookahead.contexts:ContextsConfig",
    "phase1": "lookahead.phase1:Phase1Config",
    "pairs": "lookahead.pairs:PairsConfig",
    "diffusion": "lookahead.diffusion_train:DiffusionConfig",
    "phase2": "lookahead.phase2:Phase2Config",
    "evaluate": "lookahead.evaluate:EvaluateConfig",
}


def section_class(section: str) -> type:
    module, _, name = SECTIONS[section].partition(":")
    return getattr(importlib.import_module(module), name)


def validate_all(path: str | Path) -> dict[str, Any]:
    """Validate every section of a params file; return {section: config}."""
    params = read_params(path)
    unknown = sorted(set(params) - set(SECTIONS))
    if unknown:
        raise ConfigError(unknown[0], f"unknown section in {path}; allowed sections are {', '.join(SECTIONS)}")
    missing = [s for s in SECTIONS if s not in params]
    if missing:
        raise ConfigError(missing[0], f"section missing from {path}")
    return {section: load_section(path, section, section_class(section)) for section in SECTIONS}
