"""DVC stage `wordnet`: WordNet lemmas matched to single tokens, the anchor x anchor Wu-Palmer
matrix (exactly nltk's values) and seeded evaluation pairs with their path similarity."""

from transformers import AutoTokenizer

from lookahead.core.cli import cli, parse_stage_args, print_config
from lookahead.core.config import load_section, to_dict
from lookahead.core.inputs import check_inputs
from lookahead.core.report import write_metrics
from lookahead.core.tracking import stage_run
from lookahead.pipeline.wordnet import HEADLINE, WordNetConfig, build_wordnet


def main(argv: list[str] | None = None) -> None:
    args = parse_stage_args(__doc__, {
        "tokenizer": "tokenizer directory (input)",
        "out": "wordnet directory (output)",
        "metrics": "headline metrics json",
        "report": "full report json",
    }, argv)
    cfg = load_section(args.params, "wordnet", WordNetConfig)
    if args.dry_run:
        return print_config({"wordnet": cfg})
    check_inputs(args.inputs)
    with stage_run("wordnet", {"wordnet": to_dict(cfg)}) as run:
        metrics = build_wordnet(cfg, AutoTokenizer.from_pretrained(args.tokenizer), args.out)
        write_metrics(metrics, HEADLINE, args.metrics, args.report, run)


if __name__ == "__main__":
    cli(main)
