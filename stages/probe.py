"""DVC stage `probe`: the geometric terrain of the base model and of the packaged MiniLM —
embedding and weight geometry, head probes, relational alignment with WordNet."""

from lookahead.config import cli, load_section, parse_stage_args, print_config, to_dict
from lookahead.inputs import check_inputs
from lookahead.probe import ProbeConfig, build_probe
from lookahead.probe import headline_keys as probe_headline
from lookahead.report import write_metrics
from lookahead.tracking import stage_run
from lookahead.wordnet_data import WordNetSource

OUTPUTS = {
    "eigenspectrum": "embedding eigenspectra csv (plot)",
    "heads-csv": "per-head importance csv (plot)",
    "bands": "cosine by similarity band csv (plot)",
    "heads": "head statistics safetensors (for init)",
    "figure": "summary png",
}


def main(argv: list[str] | None = None) -> None:
    args = parse_stage_args(__doc__, {
        "base": "base model directory (input)",
        "tokens": "token streams directory (input)",
        "wordnet": "wordnet stage directory (input)",
        "metrics": "headline metrics json",
        "report": "full report json",
        **OUTPUTS,
    }, argv)
    configs = {
        "probe": load_section(args.params, "probe", ProbeConfig),
        "wordnet": load_section(args.params, "wordnet", WordNetSource, partial=True),
    }
    if args.dry_run:
        return print_config(configs)
    check_inputs(args.inputs)
    outputs = {name.replace("-", "_"): getattr(args, name.replace("-", "_")) for name in OUTPUTS}
    with stage_run("probe", {k: to_dict(v) for k, v in configs.items()}) as run:
        metrics = build_probe(configs["probe"], args.base, args.tokens, args.wordnet, configs["wordnet"].path, outputs)
        write_metrics(metrics, probe_headline(metrics), args.metrics, args.report, run)
        run.log_artifact(outputs["figure"])


if __name__ == "__main__":
    cli(main)
