"""DVC stage `init`: geometric token embeddings (eigendecomposition of the WordNet matrix), their
Procrustes alignment to the base model's residual stream, and the predictor's initial factors."""

from lookahead.core.cli import cli, parse_stage_args, print_config
from lookahead.core.config import load_section, to_dict
from lookahead.core.inputs import check_inputs
from lookahead.core.report import write_metrics
from lookahead.core.tracking import stage_run
from lookahead.lm.families.base import read_unit
from lookahead.pipeline.init import HEADLINE, FactorsConfig, InitConfig, build_init


def main(argv: list[str] | None = None) -> None:
    args = parse_stage_args(__doc__, {
        "base": "base model directory (input)",
        "wordnet": "wordnet stage directory (input)",
        "heads": "probe head statistics (input)",
        "out": "init safetensors (output)",
        "metrics": "headline metrics json",
        "report": "full report json",
    }, argv)
    configs = {
        "init": load_section(args.params, "init", InitConfig),
        "predictor": load_section(args.params, "predictor", FactorsConfig, partial=True),
    }
    unit = read_unit(args.params)
    if args.dry_run:
        return print_config({**configs, "runtime.unit": unit})
    check_inputs(args.inputs)
    params = {k: to_dict(v) for k, v in configs.items()} | ({"runtime.unit": unit} if unit != "head" else {})
    with stage_run("init", params) as run:
        metrics = build_init(configs["init"], configs["predictor"], args.base, args.wordnet, args.heads, args.out,
                             unit=unit)
        write_metrics(metrics, HEADLINE, args.metrics, args.report, run)


if __name__ == "__main__":
    cli(main)
