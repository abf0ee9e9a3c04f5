"""DVC stage `phase2`: continued pretraining of the base LM with per-token topologies (the phase-1
predictor trained jointly, or diffusion samples); its dense control is the `control` stage."""

from lookahead.artifacts.phase2 import write_pruning
from lookahead.artifacts.val_scores import ScoringConfig
from lookahead.core.cli import cli, parse_stage_args, print_config
from lookahead.core.config import load_section, to_dict
from lookahead.core.inputs import check_inputs
from lookahead.core.report import write_metrics
from lookahead.core.tracking import stage_run
from lookahead.pipeline.phase2.build import HEADLINE, build_phase2_seeds
from lookahead.pipeline.phase2.config import DecoderInputs, Phase2Config, check_decoder_inputs
from lookahead.pipeline.phase2.plots import write_phase2_reports


def main(argv: list[str] | None = None) -> None:
    args = parse_stage_args(__doc__, {
        "base": "base model directory (input)",
        "tokens": "token streams directory (input: stream and replay windows, the scoring set's val windows)",
        "contexts": "context cache directory (input)",
        "init": "init safetensors (input)",
        "heads": "probe head statistics (input: importance, for shared_heads)",
        "predictor": "phase-1 predictor safetensors (input)",
        "predictor-seeds": "phase 1's other seeds' routers (input: phase 2's seed i starts from phase 1's seed i)",
        "diffusion": "decoder diffusion: the diffusion head directory (input: dvc.yaml passes decoder_inputs.weights)",
        "out": "phase-2 directory: lm/, predictor.safetensors, config.json (output)",
        "seeds-dir": "the other seeds' models, seed<i>/ as --out (output: what scoring reads)",
        "scores": "per-position val NLLs on the scoring set, every seed, safetensors (output)",
        "pruning": "the final active-head fraction and skip mode the static control matches, json (output)",
        "metrics": "headline metrics json",
        "report": "full report json",
        "checkpoints": "resumable checkpoints directory (not a DVC output)",
        "train-curve": "training curves csv (output: plot)",
        "eval-curve": "validation curves csv (output: plot)",
        "figure": "curves png (output)",
    }, argv)
    cfg = load_section(args.params, "phase2", Phase2Config)
    scoring = load_section(args.params, "scoring", ScoringConfig)
    check_decoder_inputs(cfg.decoder, load_section(args.params, "decoder_inputs", DecoderInputs))
    if args.dry_run:
        return print_config({"phase2": cfg, "scoring": scoring})
    check_inputs(args.inputs)
    with stage_run("phase2", {"phase2": to_dict(cfg), "scoring": to_dict(scoring)}) as run:
        report, result = build_phase2_seeds(cfg, args.base, args.tokens, args.contexts, args.init, args.predictor,
                                            args.diffusion, args.out, args.checkpoints, tracker=run, heads_file=args.heads,
                                            scoring=scoring, scores_file=args.scores,
                                            predictor_seeds=args.predictor_seeds, seeds_dir=args.seeds_dir)
        write_phase2_reports(result, args.outputs)
        write_pruning(args.out, args.pruning)
        write_metrics(report, HEADLINE, args.metrics, args.report, run)
        run.log_artifact(args.figure)


if __name__ == "__main__":
    cli(main)
