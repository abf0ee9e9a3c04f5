"""DVC stage `score_phase1`: score phase 1's routers, every seed's and each one's static twin, on the
scoring windows — dense, the router on dense states and as deployed, static pruning, random heads,
both label-free oracles — and the claims with their intervals. It trains nothing: a new test set or
baseline reruns this stage alone."""

from lookahead.artifacts.val_scores import load_scoring
from lookahead.core.cli import cli, parse_stage_args, print_config
from lookahead.core.config import load_section, to_dict
from lookahead.core.inputs import check_inputs
from lookahead.core.report import write_metrics
from lookahead.core.tracking import stage_run
from lookahead.pipeline.phase1.score import HEADLINE, score_phase1_seeds, scoring_config
from lookahead.pipeline.phase1.config import ScoringKeys


def main(argv: list[str] | None = None) -> None:
    args = parse_stage_args(__doc__, {
        "base": "base model directory (input)",
        "contexts": "context cache directory (input)",
        "tokens": "token streams directory (input: the scoring set's val windows)",
        "init": "init safetensors (input: the geometric features)",
        "heads": "probe head statistics (input: the router's importance)",
        "static-baselines": "the static baselines' masks (input: static pruning's, the stronger on selection)",
        "oracle": "oracle targets directory (input: the greedy oracle's search settings)",
        "router": "phase 1's primary router, safetensors (input: its training config is the seeds')",
        "seeds-dir": "the other seeds' routers (input)",
        "twins-dir": "every seed's static twin (input)",
        "training": "every seed's training figures, json (input)",
        "scores": "per-position val NLLs on the scoring set, every seed, safetensors (output)",
        "metrics": "headline metrics json",
        "report": "full report json",
        "checkpoints": "the oracles' per-batch results, to resume a killed run (not a DVC output)",
    }, argv)
    keys = load_section(args.params, "phase1", ScoringKeys, partial=True)
    scoring = load_scoring(args.params)
    if args.dry_run:
        return print_config({"phase1 (the keys scoring reads)": keys, "scoring": scoring})
    check_inputs(args.inputs)
    cfg, training = scoring_config(args.router, keys, args.training)
    with stage_run("score_phase1", {"phase1": to_dict(cfg), "scoring": to_dict(scoring)}) as run:
        report = score_phase1_seeds(cfg, args.base, args.contexts, args.init, args.heads, args.router, args.seeds_dir,
                                    args.twins_dir, training, scoring, args.tokens, args.oracle, args.scores,
                                    args.static_baselines, args.checkpoints)
        write_metrics(report, HEADLINE, args.metrics, args.report, run)


if __name__ == "__main__":
    cli(main)
