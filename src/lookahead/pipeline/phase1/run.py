"""Phase 1's two stages in one process — :func:`lookahead.pipeline.phase1.build.train_phase1` and
:func:`lookahead.pipeline.phase1.score.score_phase1` — for tests and benchmarks that want a trained
and scored router in one call. No stage imports it (each stage lists only what it runs)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from lookahead.artifacts.oracle_targets import OracleTargets
from lookahead.artifacts.val_scores import ScoringConfig
from lookahead.graph.predictor import PredictorConfig
from lookahead.graph.runtime import RuntimeConfig
from lookahead.pipeline.phase1.build import train_phase1, train_phase1_seeds
from lookahead.pipeline.phase1.config import Phase1Config
from lookahead.pipeline.phase1.final import ScoringSet
from lookahead.pipeline.phase1.module import Phase1Module
from lookahead.pipeline.phase1.score import score_phase1, score_phase1_seeds
from lookahead.train.loop import TrainResult


def build_phase1(cfg: Phase1Config, predictor_cfg: PredictorConfig, base_dir, contexts_dir, init_file, heads_file,
                 out_file, checkpoint_root=None, tracker=None, runtime_cfg: RuntimeConfig | None = None,
                 oracle_targets: dict | None = None, scoring: ScoringSet | None = None,
                 val_state: dict | None = None, oracle: OracleTargets | None = None, twin_file=None
                 ) -> tuple[dict, TrainResult, Phase1Module]:
    """:func:`train_phase1`, then :func:`score_phase1` on the trained models in memory: (the seed's
    report, the training result, the module) — what the two stages give one seed, in one call."""
    training, result, module, twin = train_phase1(cfg, predictor_cfg, base_dir, contexts_dir, init_file, heads_file,
                                                  out_file, checkpoint_root, tracker, runtime_cfg, oracle_targets,
                                                  val_state, oracle, twin_file)
    return score_phase1(training, module, module.model, scoring, twin), result, module


def build_phase1_seeds(cfg: Phase1Config, predictor_cfg: PredictorConfig, base_dir, contexts_dir, init_file, heads_file,
                       out_file, checkpoint_root=None, runtime_cfg: RuntimeConfig | None = None,
                       scoring_cfg: ScoringConfig | None = None, tokens_dir=None, oracle_dir=None) -> dict:
    """Both stages in one call (:func:`train_phase1_seeds`, :func:`score_phase1_seeds`), the seeds'
    routers and twins in a temporary directory beside ``out_file``: the scored report."""
    with tempfile.TemporaryDirectory(prefix="phase1-seeds-", dir=Path(out_file).parent) as tmp:
        seeds_dir, twins_dir = Path(tmp) / "seeds", Path(tmp) / "twins"
        training, _, _ = train_phase1_seeds(cfg, predictor_cfg, base_dir, contexts_dir, init_file, heads_file, out_file,
                                            seeds_dir, twins_dir, checkpoint_root, None, runtime_cfg, oracle_dir)
        return score_phase1_seeds(cfg, base_dir, contexts_dir, init_file, heads_file, out_file, seeds_dir, twins_dir,
                                  training, scoring_cfg or ScoringConfig(), tokens_dir, oracle_dir)
