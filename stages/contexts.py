"""DVC stage `contexts`: per-position context embeddings of seeded train and val windows from the
frozen context encoder, cached as a few big fp16 files for phase 1 and the pairs stage."""

from transformers import AutoTokenizer

from lookahead.artifacts.contexts import read_context_length
from lookahead.core.cli import cli, parse_stage_args, print_config
from lookahead.core.config import load_section, to_dict
from lookahead.core.inputs import check_inputs
from lookahead.core.report import write_metrics
from lookahead.core.tracking import stage_run
from lookahead.pipeline.contexts import HEADLINE, ContextsConfig, build_contexts


def main(argv: list[str] | None = None) -> None:
    args = parse_stage_args(__doc__, {
        "tokenizer": "tokenizer directory (input)",
        "tokens": "token streams directory (input)",
        "base": "base model directory (input; the `base` encoder)",
        "out": "context cache directory (output)",
        "metrics": "headline metrics json",
        "report": "full report json",
    }, argv)
    cfg = load_section(args.params, "contexts", ContextsConfig)
    context_length = read_context_length(args.params)
    if args.dry_run:
        return print_config({"contexts": cfg, "base.arch.context_length": context_length})
    check_inputs(args.inputs)
    with stage_run("contexts", {"contexts": to_dict(cfg), "base.arch": {"context_length": context_length}}) as run:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        metrics = build_contexts(cfg, context_length, tokenizer, args.tokens, args.base, args.out)
        write_metrics(metrics, HEADLINE, args.metrics, args.report, run)


if __name__ == "__main__":
    cli(main)
