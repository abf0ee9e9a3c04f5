"""DVC stage `tokenizer`: byte-level BPE on the train split (or the base model's own tokenizer),
and the tokenized train/val streams."""

from lookahead.core.cli import cli, parse_stage_args, print_config
from lookahead.core.config import load_section, to_dict
from lookahead.core.inputs import check_inputs
from lookahead.core.report import write_metrics
from lookahead.core.tracking import stage_run
from lookahead.lm.source import ModelSource
from lookahead.pipeline.tokenizer import HEADLINE, TokenizerConfig, build_tokenizer, train_bpe


def main(argv: list[str] | None = None) -> None:
    args = parse_stage_args(__doc__, {
        "corpus": "corpus directory (input)",
        "tokenizer": "tokenizer directory (output)",
        "tokens": "token streams directory (output)",
        "metrics": "headline metrics json",
        "report": "full report json",
    }, argv)
    configs = {
        "tokenizer": load_section(args.params, "tokenizer", TokenizerConfig),
        "base": load_section(args.params, "base", ModelSource, partial=True),
    }
    if args.dry_run:
        return print_config(configs)
    check_inputs(args.inputs)
    cfg, source = configs["tokenizer"], configs["base"]
    with stage_run("tokenizer", {k: to_dict(v) for k, v in configs.items()}) as run:
        if source.source == "scratch":
            tok = train_bpe(f"{args.corpus}/train.txt", cfg)
        else:
            tok = source.load_tokenizer()
        metrics = build_tokenizer(tok, args.corpus, args.tokenizer, args.tokens, cfg.batch_lines)
        write_metrics(metrics, HEADLINE, args.metrics, args.report, run)


if __name__ == "__main__":
    cli(main)
