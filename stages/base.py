"""DVC stage `base`: pretrain a scratch OLMo2 (or snapshot a hub/local model) into a
`save_pretrained` directory, with held-out metrics and training curves."""

from transformers import AutoTokenizer

from lookahead.core.atomic import write_csv
from lookahead.core.cli import cli, parse_stage_args, print_config
from lookahead.core.config import load_section, to_dict
from lookahead.core.inputs import check_inputs
from lookahead.core.report import write_metrics
from lookahead.core.tracking import stage_run
from lookahead.pipeline.base import HEADLINE, BaseConfig, build_base
from lookahead.train.figures import plot_training_curves


def main(argv: list[str] | None = None) -> None:
    args = parse_stage_args(__doc__, {
        "tokenizer": "tokenizer directory (input)",
        "tokens": "token streams directory (input)",
        "out": "model directory (output)",
        "metrics": "headline metrics json",
        "report": "full report json",
        "train-curve": "training curve csv (plot)",
        "val-curve": "validation curve csv (plot)",
        "figure": "curves png",
        "checkpoints": "resumable checkpoints directory (not a DVC output)",
    }, argv)
    cfg = load_section(args.params, "base", BaseConfig)
    if args.dry_run:
        return print_config({"base": cfg})
    check_inputs(args.inputs)
    with stage_run("base", {"base": to_dict(cfg)}) as run:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        metrics, result = build_base(cfg, tokenizer, args.tokens, args.out, args.checkpoints, tracker=run)
        # A snapshotted model has no training curve: its val curve is the one final point.
        train_curve = result.train_curve if result else []
        val_curve = result.eval_curve if result else [{"step": 0, "val_nll": metrics["val_nll"]}]
        write_csv(args.train_curve, train_curve, fieldnames=["step", "loss", "lr", "grad_norm"])
        write_csv(args.val_curve, val_curve)
        plot_training_curves(train_curve, val_curve, args.figure, title=f"base ({cfg.source})",
                             reference={"val unigram NLL": metrics["val_unigram_nll"], "final val NLL": metrics["val_nll"]})
        write_metrics(metrics, HEADLINE, args.metrics, args.report, run)
        run.log_artifact(args.figure)


if __name__ == "__main__":
    cli(main)
