"""DVC stage `phase1`: train the lookahead structure predictor (every seed's, and each seed's static
twin) on the cached contexts with the LM and the encoder frozen; the `score_phase1` stage scores them."""

from lookahead.core.cli import cli, parse_stage_args, print_config
from lookahead.core.config import load_section, to_dict
from lookahead.core.inputs import check_inputs
from lookahead.core.report import write_report
from lookahead.core.tracking import stage_run
from lookahead.graph.predictor import PredictorConfig
from lookahead.graph.runtime import RuntimeConfig
from lookahead.pipeline.phase1.build import train_phase1_seeds
from lookahead.pipeline.phase1.config import Phase1Config, without_scoring
from lookahead.pipeline.phase1.plots import write_phase1_reports


def main(argv: list[str] | None = None) -> None:
    args = parse_stage_args(__doc__, {
        "base": "base model directory (input)",
        "contexts": "context cache directory (input)",
        "init": "init safetensors (input)",
        "heads": "probe head statistics (input)",
        "oracle": "oracle targets directory (input: the train windows and distillation targets)",
        "out": "predictor safetensors (output)",
        "seeds-dir": "the other seeds' routers, predictor_seed<i>.safetensors (output: phase 2's seed i reads seed i's)",
        "twins-dir": "every seed's static twin, twin_seed<i>.safetensors (output: empty without phase1.static_twin)",
        "training": "every seed's training figures, json (output: the scoring stage merges them)",
        "checkpoints": "resumable checkpoints directory (not a DVC output)",
        "train-curve": "training curve csv (output: plot)",
        "eval-curve": "evaluation curve csv (output: plot)",
        "pareto": "NLL vs active-head fraction csv (output: plot)",
        "layers": "active-head fraction per layer csv (output: plot)",
        "figure": "curves png (output)",
        "pareto-figure": "Pareto png (output)",
    }, argv)
    configs = {
        "phase1": without_scoring(load_section(args.params, "phase1", Phase1Config)),  # the scoring keys: score_phase1's
        "predictor": load_section(args.params, "predictor", PredictorConfig),
        "runtime": load_section(args.params, "runtime", RuntimeConfig),
    }
    if args.dry_run:
        return print_config(configs)
    check_inputs(args.inputs)
    with stage_run("phase1", {k: to_dict(v) for k, v in configs.items()}) as run:
        training, result, module = train_phase1_seeds(configs["phase1"], configs["predictor"], args.base, args.contexts,
                                                      args.init, args.heads, args.out, args.seeds_dir, args.twins_dir,
                                                      args.checkpoints, tracker=run, runtime_cfg=configs["runtime"],
                                                      oracle_dir=args.oracle)
        write_phase1_reports(result, module, training, args.outputs)
        write_report(training, args.training, run)
        run.log_artifact(args.figure)
        run.log_artifact(args.pareto_figure)


if __name__ == "__main__":
    cli(main)
