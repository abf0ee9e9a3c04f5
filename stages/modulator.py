"""DVC stage `modulator`: the seed notebook's geometric residual modulator — the LERP one (sections
7-10) or the multi-expert field one (section 12), `modulator.kind` — trained on next-token NLL with
the base LM frozen; val NLL and relational alignment with WordNet (gloss- and token-level) before and after."""

from lookahead.core.cli import cli, parse_stage_args, print_config
from lookahead.core.config import load_section, to_dict
from lookahead.core.inputs import check_inputs
from lookahead.core.report import write_metrics
from lookahead.core.tracking import stage_run
from lookahead.artifacts.val_scores import WindowsConfig
from lookahead.pipeline.modulator.build import HEADLINE, build_modulator_seeds, modulator_windows
from lookahead.pipeline.modulator.config import AlignmentConfig, ModulatorConfig
from lookahead.pipeline.modulator.plots import write_modulator_reports
from lookahead.semantics.wordnet_source import WordNetSource


def main(argv: list[str] | None = None) -> None:
    args = parse_stage_args(__doc__, {
        "base": "base model directory (input)",
        "tokens": "token streams directory (input)",
        "contexts": "context cache directory (input: the test set is chosen apart from its val windows)",
        "wordnet": "wordnet stage directory (input)",
        "init": "init safetensors (input)",
        "out": "modulator directory (output)",
        "metrics": "headline metrics json",
        "report": "full report json",
        "checkpoints": "resumable checkpoints directory (not a DVC output)",
        "train-curve": "training curve csv (output: plot)",
        "eval-curve": "val NLL curve csv (output: plot)",
        "alpha-curve": "alpha per layer against step csv (output: plot)",
        "bands": "mean cosine per path-similarity band, before and after, csv (output: plot)",
        "figure": "summary png (output)",
    }, argv)
    configs = {
        "modulator": load_section(args.params, "modulator", ModulatorConfig),
        "probe": load_section(args.params, "probe", AlignmentConfig, partial=True),
        "wordnet": load_section(args.params, "wordnet", WordNetSource, partial=True),
        "windows": load_section(args.params, "windows", WindowsConfig),
    }
    if args.dry_run:
        return print_config(configs)
    check_inputs(args.inputs)
    with stage_run("modulator", {k: to_dict(v) for k, v in configs.items()}) as run:
        report, result, alpha_rows = build_modulator_seeds(configs["modulator"], configs["probe"], args.base,
                                                           args.tokens, args.wordnet, configs["wordnet"].path, args.init,
                                                           args.out, args.checkpoints, tracker=run,
                                                           windows=modulator_windows(configs["modulator"], configs["windows"],
                                                                                     args.tokens, args.contexts))
        write_modulator_reports(result, alpha_rows, report,
                                args.outputs)
        write_metrics(report, HEADLINE, args.metrics, args.report, run)
        run.log_artifact(args.figure)


if __name__ == "__main__":
    cli(main)
