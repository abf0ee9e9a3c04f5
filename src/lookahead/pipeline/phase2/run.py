"""Phase 2's and its controls' training and scoring in one process —
:func:`lookahead.pipeline.phase2.build.train_phase2` or
:func:`lookahead.pipeline.phase2.control.train_control`, then what the ``score_phase2`` stage measures
(:mod:`lookahead.pipeline.phase2.score`) on the model still in memory — for tests and benchmarks that
want a scored run in one call. No stage imports it (each stage lists only what it runs)."""

from __future__ import annotations

from lookahead.artifacts.val_scores import ScoringConfig
from lookahead.pipeline.phase2.build import train_phase2
from lookahead.pipeline.phase2.config import Phase2Config
from lookahead.pipeline.phase2.control import StaticMask, train_control
from lookahead.pipeline.phase2.score import final_batches, final_label, score_control, score_phase2
from lookahead.train.loop import TrainResult


def build_phase2(cfg: Phase2Config, base_dir, tokens_dir, contexts_dir, init_file, predictor_file, diffusion_dir, out_dir,
                 checkpoint_root=None, tracker=None, heads_file=None, scoring: ScoringConfig | None = None
                 ) -> tuple[dict, TrainResult]:
    """Train the phase-2 LM (written to ``out_dir``) and score it on ``scoring``'s windows (None: the
    default set): (the seed's report, its per-position NLLs in ``token_nll``; the training result)."""
    training, result, module = train_phase2(cfg, base_dir, tokens_dir, contexts_dir, init_file, predictor_file,
                                            diffusion_dir, out_dir, checkpoint_root, tracker, heads_file)
    scoring = scoring or ScoringConfig()
    batches = final_batches(cfg, scoring, tokens_dir, module.cache, module.device)
    return score_phase2(training, module, batches, final_label(cfg, scoring, tokens_dir, module.cache)), result


def build_control(cfg: Phase2Config, base_dir, tokens_dir, contexts_dir, out_dir, checkpoint_root=None,
                  tracker=None, mask: StaticMask | None = None, scoring: ScoringConfig | None = None
                  ) -> tuple[dict, TrainResult]:
    """Train a control of phase 2 (dense, or under ``mask``; written to ``out_dir``) and score it, as
    :func:`build_phase2`."""
    training, result, module = train_control(cfg, base_dir, tokens_dir, contexts_dir, out_dir, checkpoint_root,
                                             tracker, mask)
    scoring = scoring or ScoringConfig()
    batches = final_batches(cfg, scoring, tokens_dir, module.cache, module.device)
    return score_control(training, module, batches, final_label(cfg, scoring, tokens_dir, module.cache)), result
