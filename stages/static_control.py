"""DVC stage `static_control`: the base LM trained with phase 2's optimiser, steps and windows (in
the same order) under static pruning at phase 2's final active-head fraction (the stronger static baseline there) — the fair
baseline of learned per-token routing: "static pruning + continued pretraining"; every seed's LM kept
for `score_phase2`."""

from lookahead.core.cli import cli, parse_stage_args, print_config
from lookahead.core.config import load_section
from lookahead.core.inputs import check_inputs
from lookahead.core.report import write_report
from lookahead.core.tracking import stage_run
from lookahead.pipeline.phase2.config import Phase2Config
from lookahead.pipeline.phase2.control import control_config, train_control_seeds, write_control_reports
from lookahead.pipeline.phase2.static_mask import static_mask


def main(argv: list[str] | None = None) -> None:
    args = parse_stage_args(__doc__, {
        "base": "base model directory (input)",
        "tokens": "token streams directory (input: the train stream)",
        "contexts": "context cache directory (input: its val windows)",
        "static-baselines": "the static baselines' masks (input: the stronger on selection at phase 2's fraction)",
        "pruning": "phase 2's final active-head fraction and skip mode, json (input)",
        "out": "static-control LM directory (output)",
        "seeds-dir": "the other seeds' models, seed<i>/ as --out (output: what scoring reads)",
        "training": "every seed's training figures, json (output: the scoring stage merges them)",
        "train-curve": "training curve csv (plot)",
        "eval-curve": "validation curve csv (plot)",
        "checkpoints": "resumable checkpoints directory (not a DVC output)",
    }, argv)
    cfg = load_section(args.params, "phase2", Phase2Config)
    if args.dry_run:
        return print_config({"phase2 (the keys the static control reads)": control_config(cfg)})
    check_inputs(args.inputs)
    mask = static_mask(args.static_baselines, args.pruning)
    with stage_run("static_control", {"phase2": control_config(cfg, mask)}) as run:
        training, result = train_control_seeds(cfg, args.base, args.tokens, args.contexts, args.out, args.seeds_dir,
                                               args.checkpoints, tracker=run, mask=mask)
        write_control_reports(result, {"train_curve": args.train_curve, "eval_curve": args.eval_curve})
        write_report(training, args.training, run)


if __name__ == "__main__":
    cli(main)
