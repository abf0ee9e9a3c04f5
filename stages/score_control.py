"""DVC stage `score_control`: score the dense control — every seed's, as its training stage wrote it —
and the base LM it started from on the scoring windows: the per-position NLLs evaluate pairs (the base
LM's beside them), the headline and the report. It trains nothing and needs no router: a dense model
alone (a smaller one, docs/research/frontier.md) is scored by `dvc repro score_control`."""

from lookahead.artifacts.val_scores import load_scoring
from lookahead.core.cli import cli, parse_stage_args, print_config
from lookahead.core.config import to_dict
from lookahead.core.inputs import check_inputs
from lookahead.core.report import write_metrics
from lookahead.core.tracking import stage_run
from lookahead.pipeline.phase2.score import CONTROL_HEADLINE, read_training, score_phase2_seeds


def main(argv: list[str] | None = None) -> None:
    paths = {
        "base": "base model directory (input: the LM the control started from, scored beside it)",
        "tokens": "token streams directory (input: the scoring set's val windows)",
        "contexts": "context cache directory (input: its val windows with windows: cache)",
        "control": "the dense control's model directory (input)",
        "control-seeds": "its other seeds' models (input)",
        "control-training": "its training figures, json (input)",
        "control-scores": "per-position val NLLs on the scoring set, every seed's and the base LM's, safetensors (output)",
        "control-metrics": "headline metrics json",
        "control-report": "full report json",
    }
    args = parse_stage_args(__doc__, paths, argv)
    scoring = load_scoring(args.params)
    if args.dry_run:
        return print_config({"scoring": scoring})
    check_inputs(args.inputs)
    with stage_run("score_control", {"scoring": to_dict(scoring)}) as run:
        reports = score_phase2_seeds({"control": (args.control, args.control_seeds)},
                                     {"control": read_training(args.control_training)}, args.base, args.tokens,
                                     args.contexts, None, None, None, None, scoring, {"control": args.control_scores})
        write_metrics(reports["control"], CONTROL_HEADLINE, args.control_metrics, args.control_report)
        run.log_metrics({"control": reports["control"]})
        run.log_artifact(args.control_report)


if __name__ == "__main__":
    cli(main)
