"""The sections of params.yaml and the dataclass each loads into (docs/troubleshooting.md).

:func:`validate_all` checks a whole params file at once — unknown sections included — before any
work: ``make repro`` runs it (``python -m lookahead.tools.params params.yaml``), and each stage validates
its own sections again when it starts. Adding a stage adds a line here, and no stage depends on
this module, so that reruns nothing.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

from lookahead.core.config import load_section, read_params
from lookahead.core.errors import ConfigError

# section -> "module:Class"; strings, so that validating imports only what it needs
SECTIONS: dict[str, str] = {
    "launch": "lookahead.tools.launch:LaunchConfig",
    "corpus": "lookahead.pipeline.corpus:CorpusConfig",
    "wordnet": "lookahead.pipeline.wordnet:WordNetConfig",
    "tokenizer": "lookahead.pipeline.tokenizer:TokenizerConfig",
    "base": "lookahead.pipeline.base:BaseConfig",
    "probe": "lookahead.pipeline.probe.build:ProbeConfig",
    "init": "lookahead.pipeline.init:InitConfig",
    "modulator": "lookahead.pipeline.modulator.config:ModulatorConfig",
    "predictor": "lookahead.graph.predictor:PredictorConfig",
    "runtime": "lookahead.graph.runtime:RuntimeConfig",
    "contexts": "lookahead.pipeline.contexts:ContextsConfig",
    "oracle": "lookahead.pipeline.oracle:OracleConfig",
    "phase1": "lookahead.pipeline.phase1.config:Phase1Config",
    "pairs": "lookahead.pipeline.pairs:PairsConfig",
    "diffusion": "lookahead.pipeline.diffusion.config:DiffusionConfig",
    "phase2": "lookahead.pipeline.phase2.config:Phase2Config",
    "decoder_inputs": "lookahead.pipeline.phase2.config:DecoderInputs",
    "static_baselines": "lookahead.pipeline.static_baselines:StaticBaselinesConfig",
    "windows": "lookahead.artifacts.val_scores:WindowsConfig",
    "scoring": "lookahead.artifacts.val_scores:ScoringConfig",
    "evaluate": "lookahead.pipeline.evaluate.config:EvaluateConfig",
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


def main(argv: list[str] | None = None) -> int:
    """``python -m lookahead.tools.params [params.yaml]``: validate every section; one line, exit 2 on error."""
    parser = argparse.ArgumentParser(description="Validate every section of a params file.")
    parser.add_argument("params", nargs="?", default="params.yaml")
    parser.add_argument("--estimate", action="store_true",
                        help="also print each stage's parameters, tokens, GPU memory and time (lookahead.tools.estimate)")
    parser.add_argument("--tflops", type=float, default=989.0, help="--estimate: the GPU's peak TFLOP/s (H100 bf16)")
    parser.add_argument("--mfu", type=float, default=0.4, help="--estimate: the share of the peak a stage reaches")
    parser.add_argument("--json", action="store_true", help="--estimate: one JSON object instead of the table")
    parser.add_argument("--forward-seconds", type=float, default=None,
                        help="--estimate: measured seconds of one base.arch.context_length-token forward (batch 1) "
                             "on the machine that will run it: hours on that machine, in place of --tflops/--mfu")
    args = parser.parse_args(argv)
    if args.tflops <= 0 or not 0 < args.mfu <= 1:
        parser.error("--tflops must be > 0 and --mfu in (0, 1]")
    if args.forward_seconds is not None and args.forward_seconds <= 0:
        parser.error("--forward-seconds must be > 0")
    try:
        configs = validate_all(args.params)
    except ConfigError as err:
        where = f"{args.params}: " if err.key else ""  # file-level messages name the file already
        print(f"error (params): {where}{err}", file=sys.stderr)
        return 2
    if args.estimate:
        from lookahead.tools.estimate import main_estimate

        print(main_estimate(configs, args.tflops, args.mfu, args.json, args.forward_seconds))
        return 0
    print(f"{args.params}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
