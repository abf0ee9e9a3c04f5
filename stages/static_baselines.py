"""DVC stage `static_baselines`: the strongest static head masks on held-out text — importance
ranked on the val stream's fit windows and a greedy static mask searched on them — and which of the
two is the stronger at each head count on the selection windows. Only the static baselines read it
(phase 1's static pruning, the static control's mask, evaluate's static rows)."""

from lookahead.artifacts.contexts import read_context_length
from lookahead.artifacts.val_scores import WindowsConfig
from lookahead.core.cli import cli, parse_stage_args, print_config
from lookahead.core.config import load_section, to_dict
from lookahead.core.inputs import check_inputs
from lookahead.core.report import write_metrics
from lookahead.core.tracking import stage_run
from lookahead.graph.runtime import RuntimeConfig
from lookahead.pipeline.static_baselines import HEADLINE, StaticBaselinesConfig, build_static_baselines


def main(argv: list[str] | None = None) -> None:
    args = parse_stage_args(__doc__, {
        "base": "base model directory (input)",
        "tokens": "token streams directory (input: the fit and selection windows)",
        "out": "static baselines directory (output)",
        "metrics": "headline metrics json",
        "report": "full report json",
        "checkpoints": "the greedy search's checkpoints directory, to resume a killed run (not a DVC output)",
    }, argv)
    configs = {"static_baselines": load_section(args.params, "static_baselines", StaticBaselinesConfig),
               "windows": load_section(args.params, "windows", WindowsConfig)}
    context_length = read_context_length(args.params)
    unit = load_section(args.params, "runtime", RuntimeConfig).unit
    if args.dry_run:
        return print_config({**configs, "base.arch.context_length": context_length, "runtime.unit": unit})
    check_inputs(args.inputs)
    params = {k: to_dict(v) for k, v in configs.items()} | {"base.arch": {"context_length": context_length}}
    if unit != "head":
        params["runtime.unit"] = unit
    with stage_run("static_baselines", params) as run:
        report = build_static_baselines(configs["static_baselines"], configs["windows"], context_length, args.base,
                                        args.tokens, args.out, unit, args.checkpoints)
        write_metrics(report, HEADLINE, args.metrics, args.report, run)


if __name__ == "__main__":
    cli(main)
