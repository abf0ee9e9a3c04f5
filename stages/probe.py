"""DVC stage `probe`: the geometric terrain of the base model and of the packaged MiniLM —
embedding and weight geometry, head probes, relational alignment with WordNet."""

from lookahead.core.cli import cli, parse_stage_args, print_config
from lookahead.core.config import load_section, to_dict
from lookahead.core.inputs import check_inputs
from lookahead.core.report import write_metrics
from lookahead.core.tracking import stage_run
from lookahead.pipeline.probe.build import ProbeConfig, build_probe
from lookahead.pipeline.probe.build import headline_keys as probe_headline
from lookahead.semantics.wordnet_source import WordNetSource


def main(argv: list[str] | None = None) -> None:
    args = parse_stage_args(__doc__, {
        "base": "base model directory (input)",
        "tokens": "token streams directory (input)",
        "wordnet": "wordnet stage directory (input)",
        "metrics": "headline metrics json",
        "report": "full report json",
        "eigenspectrum": "embedding eigenspectra csv (output: plot)",
        "heads-csv": "per-head importance csv (output: plot)",
        "bands": "cosine by similarity band csv (output: plot)",
        "heads": "head statistics safetensors (for init) (output)",
        "figure": "summary png (output)",
    }, argv)
    configs = {
        "probe": load_section(args.params, "probe", ProbeConfig),
        "wordnet": load_section(args.params, "wordnet", WordNetSource, partial=True),
    }
    if args.dry_run:
        return print_config(configs)
    check_inputs(args.inputs)
    with stage_run("probe", {k: to_dict(v) for k, v in configs.items()}) as run:
        metrics = build_probe(configs["probe"], args.base, args.tokens, args.wordnet, configs["wordnet"].path, args.outputs)
        write_metrics(metrics, probe_headline(metrics), args.metrics, args.report, run)
        run.log_artifact(args.figure)


if __name__ == "__main__":
    cli(main)
