"""DVC stage `corpus`: one document per line, deterministically split into train and val."""

from lookahead.core.cli import cli, parse_stage_args, print_config
from lookahead.core.config import load_section, to_dict
from lookahead.core.inputs import check_inputs
from lookahead.core.report import write_metrics
from lookahead.core.tracking import stage_run
from lookahead.pipeline.corpus import HEADLINE, CorpusConfig, build_corpus
from lookahead.semantics.wordnet_source import WordNetSource


def main(argv: list[str] | None = None) -> None:
    args = parse_stage_args(__doc__, {
        "out": "corpus directory (train.txt, val.txt)",
        "metrics": "headline metrics json",
        "report": "full report json",
    }, argv)
    configs = {
        "corpus": load_section(args.params, "corpus", CorpusConfig),
        "wordnet": load_section(args.params, "wordnet", WordNetSource, partial=True),
    }
    if args.dry_run:
        return print_config(configs)
    check_inputs(args.inputs)
    with stage_run("corpus", {k: to_dict(v) for k, v in configs.items()}) as run:
        metrics = build_corpus(configs["corpus"], args.out, wordnet_path=configs["wordnet"].path)
        write_metrics(metrics, HEADLINE, args.metrics, args.report, run)


if __name__ == "__main__":
    cli(main)
