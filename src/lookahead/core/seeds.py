"""Research headlines over seeds (docs/reproducibility.md).

A research stage (phase1, pairs, diffusion, phase2, control, evaluate, modulator) runs once with
its configured seeds — the *primary* run, whose outputs (model, pairs, figures) are what DVC
tracks and later stages read — and ``seeds - 1`` more times with every seed of its section shifted
by 1, 2, …: the stage's own randomness (training seed, window and batch draws, sampling), on the
same inputs. They give the spread; where a scoring stage reads their models, they are kept beside the
primary's (:func:`kept_seeds`: ``<stage>_seeds/seed<i>``), else discarded. In
``metrics/<stage>.json`` a seeded figure ``<name>`` is the mean over all runs and ``<name>_sd`` its
sample standard deviation; the report keeps every run's figures (``per_seed``) and the primary
run's (``primary``), which is what the stage's outputs were made with.

Base pretraining is one seed: it is the pipeline's input, like a downloaded checkpoint.

Under ``accelerate launch`` with N processes (docs/scaling.md) every process makes every seed's run, so
each training has all N: the main process as above, a worker each run with a scratch directory for
its outputs (the primary's included), and it exits when the last seed's run is done — what follows
(metrics, reports, tracking) is the main process's. :func:`following` tells the training loop that a
worker returns from a training instead of exiting.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tqdm import tqdm

C = TypeVar("C")


def _main_process() -> bool:
    """:func:`lookahead.core.tracking.is_main_process`, imported when asked: the training loop imports
    this module, and a GPU machine without MLflow imports the loop (benchmarks/gpu_check.py)."""
    from lookahead.core.tracking import is_main_process

    return is_main_process()


def reseeded(cfg: C, offset: int) -> C:
    """A copy of a config dataclass with every field named ``seed`` (nested ones included)
    increased by ``offset``."""
    changes = {}
    for field in dataclasses.fields(cfg):
        value = getattr(cfg, field.name)
        if field.name == "seed" and isinstance(value, int):
            changes[field.name] = value + offset
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            changes[field.name] = reseeded(value, offset)
    return dataclasses.replace(cfg, **changes)


def final_evaluation_only(cfg: C) -> C:
    """A copy whose training (a ``train`` section, if any) evaluates only after its last step:
    a run kept for its final figures needs no curve, and its training is the same (evaluation
    draws from generators of its own, never from the training's)."""
    train = getattr(cfg, "train", None)
    if train is None or not dataclasses.is_dataclass(train):
        return cfg
    return dataclasses.replace(cfg, train=dataclasses.replace(train, eval_every=train.steps))


def other_seeds(cfg: C, seeds: int, run: Callable[[C, Path], dict[str, Any]], stage: str) -> list[dict[str, Any]]:
    """Figures of the ``seeds - 1`` runs besides the primary one: ``run(reseeded(cfg, i), scratch)``
    for i = 1 … seeds − 1 (evaluated after the last step only), each given an empty scratch
    directory for outputs nobody keeps."""
    out = []
    quiet = seeds <= 1 or not _main_process()  # a worker's runs follow the main process's bar
    for offset in tqdm(range(1, seeds), desc=f"{stage} seeds", unit="seed", disable=quiet):
        with tempfile.TemporaryDirectory(prefix=f"{stage}-seed{offset}-") as scratch:
            out.append(run(final_evaluation_only(reseeded(cfg, offset)), Path(scratch)))
    return out


R = TypeVar("R")

_FOLLOWING = False


def following() -> bool:
    """Whether this worker process is making a stage's seed runs with the main process
    (:func:`over_seeds`): its trainings return rather than end the process."""
    return _FOLLOWING


def _follow(cfg: C, stage: str, run: Callable[[C, Path | None], Any]) -> None:
    """A worker's part of :func:`over_seeds`: the runs the main process makes, in its order and
    with its configs, each writing to a scratch directory; then the process ends."""
    global _FOLLOWING
    _FOLLOWING = True
    with tempfile.TemporaryDirectory(prefix=f"{stage}-worker-seed0-") as scratch:
        run(cfg, Path(scratch))  # the primary run: its outputs are the main process's to write
    other_seeds(cfg, cfg.seeds, run, stage)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    raise SystemExit(0)


def over_seeds(cfg: C, stage: str, keys: Sequence[str], run: Callable[[C, Path | None], R],
               gather: Callable[[list[dict[str, Any]]], None] | None = None) -> R:
    """A research stage over ``cfg.seeds`` seeds: the primary run ``run(cfg, None)``, which writes
    the stage's outputs, then the others, ``run(c, scratch)`` (:func:`other_seeds`). Returns the
    primary run's result with its report — the result itself, or the first element of a tuple —
    replaced by :func:`with_spread` over every run's report for ``keys``. ``gather``, if given,
    first sees every run's report, primary first (e.g. to pop per-position NLLs and save them).
    In a worker process of a multi-process launch it makes the same runs in scratch directories
    and ends the process (:func:`_follow`)."""
    if not _main_process():
        _follow(cfg, stage, run)
    primary = run(cfg, None)
    report, rest = (primary[0], primary[1:]) if isinstance(primary, tuple) else (primary, None)

    def report_of(c: C, scratch: Path) -> dict[str, Any]:
        out = run(c, scratch)
        return out[0] if isinstance(out, tuple) else out

    others = other_seeds(cfg, cfg.seeds, report_of, stage)
    if gather is not None:
        gather([report, *others])
    out = with_spread(report, others, keys)
    return (out, *rest) if rest is not None else out


@contextlib.contextmanager
def kept_seeds(seeds_dir: str | Path | None) -> Iterator[Callable[[int, Path], Path]]:
    """Where seed ``offset``'s run (≥ 1) writes its outputs so that scoring can read them later:
    ``seed<offset>`` in ``seeds_dir``, which replaces ``seeds_dir`` once every seed has run (a killed
    run leaves the old one); yields ``out(offset, scratch)``. With ``seeds_dir`` None, or in a worker
    process of a multi-process launch (the main process keeps the outputs), ``scratch``: discarded."""
    from lookahead.core.atomic import atomic_dir

    keep = seeds_dir is not None and _main_process()
    with atomic_dir(seeds_dir) if keep else contextlib.nullcontext() as tmp:
        yield lambda offset, scratch: tmp / f"seed{offset}" if keep else scratch


def mean_ci(values: Sequence[float | None], confidence: float = 0.95) -> dict[str, float | None]:
    """Mean, sample standard deviation (ddof 1; 0 for one value) and the Student-t interval of the
    mean at ``confidence`` (``ci95_low``, ``ci95_high``; the mean itself for one value) of the
    finite values of repeated measurements over seeds; all None (JSON null) when there are none,
    e.g. a ratio undefined on every seed."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not finite:
        return {"mean": None, "sd": None, "ci95_low": None, "ci95_high": None}
    mean = sum(finite) / len(finite)
    if len(finite) == 1:
        return {"mean": mean, "sd": 0.0, "ci95_low": mean, "ci95_high": mean}
    from scipy import stats

    sd = math.sqrt(sum((v - mean) ** 2 for v in finite) / (len(finite) - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, len(finite) - 1)) * sd / math.sqrt(len(finite))
    return {"mean": mean, "sd": sd, "ci95_low": mean - half, "ci95_high": mean + half}


def mean_sd(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    """(mean, sd) of :func:`mean_ci`."""
    out = mean_ci(values)
    return out["mean"], out["sd"]


def seed_summary(runs: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
    """``{key: mean, key_sd: sd, ...}`` over the per-seed figure dicts ``runs`` (each holding every
    key), plus ``seeds`` (how many)."""
    out: dict[str, Any] = {}
    for key in keys:
        out[key], out[f"{key}_sd"] = mean_sd([run[key] for run in runs])
    out["seeds"] = len(runs)
    return out


def with_spread(primary: dict[str, Any], others: Sequence[dict[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
    """The primary run's figures with each of ``keys`` replaced by its mean over all runs, plus
    ``<key>_sd``, ``seeds``, ``primary`` (the primary run's own values) and ``per_seed``."""
    runs = [primary, *others]
    return {**primary, **seed_summary(runs, keys),
            "primary": {k: primary[k] for k in keys},
            "per_seed": [{k: run[k] for k in keys} for run in runs]}


def seeded_headline(keys: Sequence[str], seeded: Sequence[str]) -> tuple[str, ...]:
    """A headline tuple with ``<key>_sd`` after each seeded key, and ``seeds`` at the end."""
    out: list[str] = []
    for key in keys:
        out.append(key)
        if key in seeded:
            out.append(f"{key}_sd")
    return (*out, "seeds")


def one_run(headline: Sequence[str]) -> set[str]:
    """The headline keys one run reports by itself: without ``_sd``, ``seeds`` and the paired claims
    (a key with ``_ci_low``/``_ci_high`` beside it, :mod:`lookahead.core.intervals`), which only the
    seeds together give."""
    claims = {key.removesuffix("_ci_low") for key in headline if key.endswith("_ci_low")}
    return {key for key in headline
            if not key.endswith(("_sd", "_ci_low", "_ci_high")) and key != "seeds" and key not in claims}
