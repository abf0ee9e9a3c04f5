"""DVC stage `score_phase2`: score phase 2's LM and the static control — every seed's, as their training
stages wrote them — on the scoring windows: the per-position NLLs evaluate pairs, and each one's
headline and report (the dense control: `score_control`). It trains nothing: a new test set reruns
this stage (and evaluate) alone."""

from lookahead.artifacts.val_scores import load_scoring
from lookahead.core.cli import cli, parse_stage_args, print_config
from lookahead.core.config import to_dict
from lookahead.core.inputs import check_inputs
from lookahead.core.report import write_metrics
from lookahead.core.tracking import stage_run
from lookahead.pipeline.phase2.score import HEADLINE, STATIC_HEADLINE, read_training, score_phase2_seeds

HEADLINES = {"phase2": HEADLINE, "static_control": STATIC_HEADLINE}


def main(argv: list[str] | None = None) -> None:
    paths = {
        "base": "base model directory (input: the frozen LM phase 2's dense figures read where it froze its own)",
        "tokens": "token streams directory (input: the scoring set's val windows)",
        "contexts": "context cache directory (input: its val windows with windows: cache)",
        "init": "init safetensors (input: the geometric features)",
        "static-baselines": "the static baselines' masks (input: the static control's, the stronger on selection)",
        "predictor": "phase-1 predictor safetensors (input: decoder diffusion's gate kind)",
        "diffusion": "decoder diffusion: the diffusion head directory (input: dvc.yaml passes decoder_inputs.weights)",
    }
    for stage in HEADLINES:
        dashed = stage.replace("_", "-")
        paths.update({
            dashed: f"{stage}'s model directory (input)",
            f"{dashed}-seeds": f"{stage}'s other seeds' models (input)",
            f"{dashed}-training": f"{stage}'s training figures, json (input)",
            f"{dashed}-scores": f"{stage}'s per-position val NLLs on the scoring set, every seed, safetensors (output)",
            f"{dashed}-metrics": f"{stage}'s headline metrics json",
            f"{dashed}-report": f"{stage}'s full report json",
        })
    args = parse_stage_args(__doc__, paths, argv)
    scoring = load_scoring(args.params)
    if args.dry_run:
        return print_config({"scoring": scoring})
    check_inputs(args.inputs)
    arg = lambda stage, part="": getattr(args, stage + (f"_{part}" if part else ""))  # noqa: E731
    with stage_run("score_phase2", {"scoring": to_dict(scoring)}) as run:
        reports = score_phase2_seeds({s: (arg(s), arg(s, "seeds")) for s in HEADLINES},
                                     {s: read_training(arg(s, "training")) for s in HEADLINES}, args.base, args.tokens,
                                     args.contexts, args.init, args.static_baselines, args.predictor, args.diffusion, scoring,
                                     {s: arg(s, "scores") for s in HEADLINES})
        for stage, report in reports.items():  # in MLflow under the stage's name: one run holds both
            write_metrics(report, HEADLINES[stage], arg(stage, "metrics"), arg(stage, "report"))
            run.log_metrics({stage: report})
            run.log_artifact(arg(stage, "report"))


if __name__ == "__main__":
    cli(main)
