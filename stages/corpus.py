"""DVC stage `corpus`: one document per line, deterministically split into train and val."""

from lookahead.config import cli, load_section, parse_stage_args, print_config, to_dict
from lookahead.corpus import HEADLINE, CorpusConfig, build_corpus
from lookahead.inputs import check_inputs
from lookahead.report import write_metrics
from lookahead.tracking import stage_run
from lookahead.wordnet_data import WordNetSource


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
