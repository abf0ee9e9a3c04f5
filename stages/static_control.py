"""DVC stage `static_control`: the base LM trained with phase 2's optimiser, steps and windows (in
the same order) under static importance pruning at phase 2's final active-head fraction — the fair
baseline of learned per-token routing: "static pruning + continued pretraining"."""

from lookahead.artifacts.val_scores import ScoringConfig
from lookahead.core.cli import cli, parse_stage_args, print_config
from lookahead.core.config import load_section, to_dict
from lookahead.core.inputs import check_inputs
from lookahead.core.report import write_metrics
from lookahead.core.tracking import stage_run
from lookahead.pipeline.phase2.config import Phase2Config
from lookahead.pipeline.phase2.control import (STATIC_HEADLINE, build_control_seeds, control_config, static_mask,
                                              write_control_reports)


def main(argv: list[str] | None = None) -> None:
    args = parse_stage_args(__doc__, {
        "base": "base model directory (input)",
        "tokens": "token streams directory (input: the train stream, the scoring set's val windows)",
        "contexts": "context cache directory (input: its val windows)",
        "heads": "probe head statistics safetensors (input: importance)",
        "pruning": "phase 2's final active-head fraction and skip mode, json (input)",
        "out": "static-control LM directory (output)",
        "seeds-dir": "the other seeds' models, seed<i>/ as --out (output: what scoring reads)",
        "scores": "per-position val NLLs on the scoring set, every seed, safetensors (output)",
        "metrics": "headline metrics json",
        "report": "full report json",
        "train-curve": "training curve csv (plot)",
        "eval-curve": "validation curve csv (plot)",
        "checkpoints": "resumable checkpoints directory (not a DVC output)",
    }, argv)
    cfg = load_section(args.params, "phase2", Phase2Config)
    scoring = load_section(args.params, "scoring", ScoringConfig)
    if args.dry_run:
        return print_config({"phase2 (the keys the static control reads)": control_config(cfg), "scoring": scoring})
    check_inputs(args.inputs)
    mask = static_mask(args.heads, args.pruning)
    with stage_run("static_control", {"phase2": control_config(cfg, mask), "scoring": to_dict(scoring)}) as run:
        report, result = build_control_seeds(cfg, args.base, args.tokens, args.contexts, args.out, args.checkpoints,
                                             tracker=run, mask=mask, scoring=scoring, scores_file=args.scores,
                                             seeds_dir=args.seeds_dir)
        write_control_reports(result, {"train_curve": args.train_curve, "eval_curve": args.eval_curve})
        write_metrics(report, STATIC_HEADLINE, args.metrics, args.report, run)


if __name__ == "__main__":
    cli(main)
