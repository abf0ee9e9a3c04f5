"""DVC stage `oracle`: per-position label-free oracle targets (the greedy oracle's removal order and
every head's leave-one-out KL) of train windows from the token stream, under the frozen base LM at
the configured budget and skip mode, for phase 1 to distil from."""

from lookahead.artifacts.contexts import read_context_length
from lookahead.core.cli import cli, parse_stage_args, print_config
from lookahead.core.config import load_section, to_dict
from lookahead.core.inputs import check_inputs
from lookahead.core.report import write_metrics
from lookahead.core.tracking import stage_run
from lookahead.graph.runtime import RuntimeConfig
from lookahead.pipeline.oracle import HEADLINE, OracleConfig, build_oracle, read_keep


def main(argv: list[str] | None = None) -> None:
    args = parse_stage_args(__doc__, {
        "base": "base model directory (input)",
        "tokens": "token streams directory (input)",
        "out": "oracle targets directory (output)",
        "metrics": "headline metrics json",
        "report": "full report json",
        "checkpoints": "per-window checkpoints directory, to resume a killed run (not a DVC output)",
    }, argv)
    configs = {
        "oracle": load_section(args.params, "oracle", OracleConfig),
        "runtime": load_section(args.params, "runtime", RuntimeConfig),
    }
    keep, context_length = read_keep(args.params), read_context_length(args.params)
    if args.dry_run:
        return print_config({**configs, "predictor.keep": keep, "base.arch.context_length": context_length})
    check_inputs(args.inputs)
    params = {"oracle": to_dict(configs["oracle"]), "predictor.keep": keep,
              "runtime.skip": configs["runtime"].skip, "base.arch": {"context_length": context_length}}
    if configs["runtime"].unit != "head":
        params["runtime.unit"] = configs["runtime"].unit
    with stage_run("oracle", params) as run:
        metrics = build_oracle(configs["oracle"], keep, configs["runtime"].skip, context_length,
                               args.base, args.tokens, args.out, configs["runtime"].unit, args.checkpoints)
        write_metrics(metrics, HEADLINE, args.metrics, args.report, run)


if __name__ == "__main__":
    cli(main)
