"""DVC stage `evaluate`: the final table (held-out NLL, active fractions, FLOPs and measured speed of
every LM and topology against dense baselines), the causality check and the explainer figure."""

from lookahead.artifacts.val_scores import load_scoring
from lookahead.core.cli import cli, parse_stage_args, print_config
from lookahead.core.config import load_section, to_dict
from lookahead.core.inputs import check_inputs
from lookahead.core.report import write_metrics
from lookahead.core.tracking import stage_run
from lookahead.pipeline.evaluate.build import HEADLINE, build_evaluate
from lookahead.pipeline.evaluate.config import EvaluateConfig
from lookahead.pipeline.evaluate.plots import write_evaluate_outputs


def main(argv: list[str] | None = None) -> None:
    args = parse_stage_args(__doc__, {
        "base": "base model directory (input)",
        "contexts": "context cache directory (input)",
        "init": "init safetensors (input)",
        "static-baselines": "the static baselines' masks (input: the static rows', the stronger on selection)",
        "predictor": "phase-1 predictor safetensors (input)",
        "diffusion": "diffusion head directory (input)",
        "phase2": "phase-2 directory (input)",
        "control": "dense control LM directory (input)",
        "static-control": "static control LM directory (input)",
        "phase1-scores": "phase 1's per-position val NLLs on the scoring set (input: the base LM dense and routed)",
        "phase2-scores": "phase 2's per-position val NLLs on the scoring set (input)",
        "control-scores": "the dense control's per-position val NLLs on the scoring set (input)",
        "static-control-scores": "the static control's per-position val NLLs on the scoring set (input)",
        "metrics": "headline metrics json",
        "report": "full report json",
        "table": "the table as markdown (output)",
        "pareto": "NLL vs active-head fraction csv (output: plot)",
        "layers": "active-head fraction per layer csv (output: plot)",
        "figure": "explainer png (output)",
        "page": "explainer html (inline svg, self-contained) (output)",
    }, argv)
    cfg = load_section(args.params, "evaluate", EvaluateConfig)
    scoring = load_scoring(args.params)
    if args.dry_run:
        return print_config({"evaluate": cfg, "scoring": scoring})
    check_inputs(args.inputs)
    with stage_run("evaluate", {"evaluate": to_dict(cfg), "scoring": to_dict(scoring)}) as run:
        evaluation = build_evaluate(cfg, args.base, args.contexts, args.init, args.static_baselines, args.predictor,
                                    args.diffusion, args.phase2, args.control, args.static_control, scoring,
                                    {"phase1": args.phase1_scores, "phase2": args.phase2_scores, "control": args.control_scores,
                                     "static_control": args.static_control_scores})
        write_evaluate_outputs(evaluation, args.outputs)
        write_metrics(evaluation.report, HEADLINE, args.metrics, args.report, run)
        run.log_artifact(args.figure)
        run.log_artifact(args.page)
        run.log_artifact(args.table)


if __name__ == "__main__":
    cli(main)
