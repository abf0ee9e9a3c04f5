"""DVC stage `diffusion`: train the conditional discrete diffusion head on the (context, topology)
pairs, then judge its samples against the phase-1 predictor's own sampler on held-out contexts."""

from lookahead.core.cli import cli, parse_stage_args, print_config
from lookahead.core.config import load_section, to_dict
from lookahead.core.inputs import check_inputs
from lookahead.core.report import write_metrics
from lookahead.core.tracking import stage_run
from lookahead.pipeline.diffusion.build import DiffusionConfig, build_diffusion_seeds, headline
from lookahead.pipeline.diffusion.plots import write_diffusion_reports


def main(argv: list[str] | None = None) -> None:
    args = parse_stage_args(__doc__, {
        "base": "base model directory (input)",
        "contexts": "context cache directory (input)",
        "init": "init safetensors (input)",
        "predictor": "phase-1 predictor safetensors (input)",
        "pairs": "pairs directory (input)",
        "out": "diffusion head directory (output)",
        "metrics": "headline metrics json",
        "report": "full report json",
        "checkpoints": "resumable checkpoints directory (not a DVC output)",
        "train-curve": "training curve csv (output: plot)",
        "eval-curve": "held-out BCE curve csv (output: plot)",
        "samplers": "samplers side by side csv (output: plot)",
        "figure": "training curves png (output)",
        "comparison-figure": "samplers comparison png (output)",
    }, argv)
    cfg = load_section(args.params, "diffusion", DiffusionConfig)
    if args.dry_run:
        return print_config({"diffusion": cfg})
    check_inputs(args.inputs)
    with stage_run("diffusion", {"diffusion": to_dict(cfg)}) as run:
        report, result, _ = build_diffusion_seeds(cfg, args.base, args.contexts, args.init, args.predictor, args.pairs,
                                                  args.out, args.checkpoints, tracker=run)
        write_diffusion_reports(result, report, args.outputs)
        write_metrics(report, headline(args.pairs), args.metrics, args.report, run,
                      declared=("ci",))  # the decoders' claims: pairs.target eps_good only
        run.log_artifact(args.figure)
        run.log_artifact(args.comparison_figure)


if __name__ == "__main__":
    cli(main)
