"""DVC stage `pairs`: (context, topology) pairs for the structure decoders — every position's ε-good
keep sets by KL to dense (pairs.target eps_good), or predictor samples that beat the dense NLL
(beats_dense)."""

from lookahead.core.cli import cli, parse_stage_args, print_config
from lookahead.core.config import load_section, to_dict
from lookahead.core.inputs import check_inputs
from lookahead.core.report import write_metrics
from lookahead.core.tracking import stage_run
from lookahead.pipeline.pairs import PairsConfig, build_pairs_seeds, headline


def main(argv: list[str] | None = None) -> None:
    args = parse_stage_args(__doc__, {
        "base": "base model directory (input)",
        "contexts": "context cache directory (input)",
        "init": "init safetensors (input)",
        "predictor": "phase-1 predictor safetensors (input)",
        "out": "pairs directory (output)",
        "metrics": "headline metrics json",
        "report": "full report json",
        "checkpoints": "pairs.target eps_good: each batch's keep-set search, to resume a killed run (not a DVC output)",
    }, argv)
    cfg = load_section(args.params, "pairs", PairsConfig)
    if args.dry_run:
        return print_config({"pairs": cfg})
    check_inputs(args.inputs)
    with stage_run("pairs", {"pairs": to_dict(cfg)}) as run:
        metrics = build_pairs_seeds(cfg, args.base, args.contexts, args.init, args.predictor, args.out, args.checkpoints)
        write_metrics(metrics, headline(cfg), args.metrics, args.report, run,
                      declared=("sd",))  # the spreads of pairs.target beats_dense


if __name__ == "__main__":
    cli(main)
