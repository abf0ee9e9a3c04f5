"""DVC stage `phase2`: continued pretraining of the base LM with per-token topologies (the phase-1
predictor trained jointly, or diffusion samples), every seed's model kept; its dense control is the
`control` stage, and `score_phase2` scores all three."""

from lookahead.artifacts.phase2 import write_pruning
from lookahead.core.cli import cli, parse_stage_args, print_config
from lookahead.core.config import load_section, to_dict
from lookahead.core.inputs import check_inputs
from lookahead.core.report import write_report
from lookahead.core.tracking import stage_run
from lookahead.pipeline.phase2.build import train_phase2_seeds
from lookahead.pipeline.phase2.config import DecoderInputs, Phase2Config, check_decoder_inputs
from lookahead.pipeline.phase2.plots import write_phase2_reports


def main(argv: list[str] | None = None) -> None:
    args = parse_stage_args(__doc__, {
        "base": "base model directory (input)",
        "tokens": "token streams directory (input: stream and replay windows)",
        "contexts": "context cache directory (input)",
        "init": "init safetensors (input)",
        "heads": "probe head statistics (input: importance, for shared_heads)",
        "predictor": "phase-1 predictor safetensors (input)",
        "predictor-seeds": "phase 1's other seeds' routers (input: phase 2's seed i starts from phase 1's seed i)",
        "diffusion": "decoder diffusion: the diffusion head directory (input: dvc.yaml passes decoder_inputs.weights)",
        "out": "phase-2 directory: lm/, predictor.safetensors, config.json (output)",
        "seeds-dir": "the other seeds' models, seed<i>/ as --out (output: what scoring reads)",
        "pruning": "the final active-head fraction and skip mode the static control matches, json (output)",
        "training": "every seed's training figures, json (output: the scoring stage merges them)",
        "checkpoints": "resumable checkpoints directory (not a DVC output)",
        "train-curve": "training curves csv (output: plot)",
        "eval-curve": "validation curves csv (output: plot)",
        "figure": "curves png (output)",
    }, argv)
    cfg = load_section(args.params, "phase2", Phase2Config)
    check_decoder_inputs(cfg.decoder, load_section(args.params, "decoder_inputs", DecoderInputs))
    if args.dry_run:
        return print_config({"phase2": cfg})
    check_inputs(args.inputs)
    with stage_run("phase2", {"phase2": to_dict(cfg)}) as run:
        training, result = train_phase2_seeds(cfg, args.base, args.tokens, args.contexts, args.init, args.predictor,
                                              args.diffusion, args.out, args.seeds_dir, args.checkpoints, tracker=run,
                                              heads_file=args.heads, predictor_seeds=args.predictor_seeds)
        write_phase2_reports(result, args.outputs)
        write_pruning(args.out, args.pruning)
        write_report(training, args.training, run)
        run.log_artifact(args.figure)


if __name__ == "__main__":
    cli(main)
