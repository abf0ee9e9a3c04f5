"""Shared fixtures: the repository root, a seed, tiny tokenizers and token streams."""

from __future__ import annotations

import os

# The session runs two tiny pipelines and the unit tests at once on as few as 2 cores (tiny_runs):
# numpy's BLAS (OpenBLAS) then gets one thread, here and in every process the tests start, before
# numpy is first imported. Its threads spin against the others: a 1 536 x 384 SVD took 0.27-0.47 s
# with 2 threads beside one busy process, 0.027 s with 1; the probe stage's took half a minute.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# torch's OpenMP threads (two per process here) wait for each other by spinning, which burns the
# cores the other processes of the session need: three processes of the hub-profile run's phase 1
# at once took 213 s of wall time (423 s of CPU) by default, 43 s (83 s) with waiting threads that
# sleep, as against 21 s for one alone. Sleeping waits change no result (the thread count stays).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import json  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from lookahead.tools.faults import lock_outs  # noqa: E402,F401  (the tests' name for it)

REPO = Path(__file__).resolve().parents[1]


def pytest_itemcollected(item):
    """The tests of one tiny run change its repository one after the other: under pytest-xdist
    (`make test`: ``-n 2 --dist loadgroup``) each run's tests are one group, run in order by one
    worker, while the other worker takes the other run's tests and the unit tests. (Marked as each
    test is collected: pytest-xdist reads the groups in its own ``pytest_collection_modifyitems``.)
    Such a test is `slow` too, whatever its module says: it waits for a DVC pipeline run, which
    `make test-fast` leaves out."""
    run = next((run for run in TINY_RUNS if run in item.fixturenames), None)  # the closure: fixtures' fixtures too
    if run is not None:
        item.add_marker(pytest.mark.xdist_group(run))
        item.add_marker(pytest.mark.slow)


def pytest_configure(config):
    """Under ``--dist loadgroup`` pytest-xdist 3.8 marks a grouped test by its node id, which pytest
    9.2 no longer lets it change: the groups are lost (pytest-dev/pytest-xdist#1386), and the tests
    of a tiny run would change its repository from two workers at once. Refused before any work."""
    from importlib.metadata import version

    if config.getoption("dist", "no") != "loadgroup" or not config.getoption("numprocesses", None):
        return
    major_minor = lambda name: tuple(int(x) for x in version(name).split(".")[:2])  # noqa: E731
    if major_minor("pytest") >= (9, 2) and major_minor("pytest-xdist") <= (3, 8):
        raise pytest.UsageError(f"pytest {version('pytest')} with pytest-xdist {version('pytest-xdist')} does not "
                                "group tests under --dist loadgroup (pytest-dev/pytest-xdist#1386): install "
                                "pytest<9.2 (`pip install -e '.[dev]'`) or run one process (`make test WORKERS=0`)")


def pytest_collection_modifyitems(items):
    """The unit tests first, while the tiny pipeline runs start beside them (:func:`tiny_runs`); then
    the tests of those runs; the reliability suite last (it starts from copies of a run)."""
    items.sort(key=lambda item: ("reliability" in item.path.parts, item.get_closest_marker("slow") is not None))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture
def seed() -> int:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    return 0


@pytest.fixture(scope="session")
def wn():
    """The real WordNet 3.0 (installed by `make test`'s set-up)."""
    from lookahead.semantics.wordnet_source import open_wordnet

    return open_wordnet(root=REPO)


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """A byte-level BPE trained on a small synthetic text, saved and reloaded with AutoTokenizer."""
    from transformers import AutoTokenizer

    from lookahead.pipeline.tokenizer import TokenizerConfig, train_bpe

    d = tmp_path_factory.mktemp("tok")
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
    rng = random.Random(0)
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(400)]
    (d / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    tok = train_bpe(d / "train.txt", TokenizerConfig(vocab_size=320, min_frequency=2))
    tok.save_pretrained(d / "saved")
    return AutoTokenizer.from_pretrained(d / "saved")


def save_tiny_lm(path, tokenizer, hidden: int = 32, n_layers: int = 2, n_heads: int = 2, seed: int = 0):
    """A tiny random OLMo2 causal LM saved with ``tokenizer`` as an HF model directory."""
    from transformers import Olmo2Config, Olmo2ForCausalLM

    torch.manual_seed(seed)
    cfg = Olmo2Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=48, num_hidden_layers=n_layers,
                      num_attention_heads=n_heads, num_key_value_heads=n_heads, max_position_embeddings=256,
                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                      bos_token_id=tokenizer.bos_token_id)
    Olmo2ForCausalLM(cfg).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def phase_inputs(tiny_tokenizer, tmp_path_factory):
    """The inputs of phase 1 and pairs for a tiny random 2 x 2-head LM: model directory, token
    streams, a context cache (the `base` encoder), an init file, head statistics and the static baselines."""
    from safetensors.torch import save_file

    from lookahead.artifacts.val_scores import WindowsConfig
    from lookahead.graph.nodes import n_nodes
    from lookahead.pipeline.contexts import ContextsConfig, build_contexts
    from lookahead.pipeline.static_baselines import StaticBaselinesConfig, build_static_baselines

    d = tmp_path_factory.mktemp("phase_inputs")
    base = save_tiny_lm(d / "base", tiny_tokenizer)
    rng = np.random.default_rng(0)
    (d / "tokens").mkdir()
    np.save(d / "tokens" / "train.npy", rng.integers(2, len(tiny_tokenizer), 4000).astype(np.uint16))
    np.save(d / "tokens" / "val.npy", rng.integers(2, len(tiny_tokenizer), 1000).astype(np.uint16))
    cfg = ContextsConfig(encoder="base", train_sequences=12, val_sequences=4, batch_size=4, device="cpu")
    build_contexts(cfg, 12, tiny_tokenizer, d / "tokens", base, d / "contexts")
    gen = torch.Generator().manual_seed(0)
    vocab, n = len(tiny_tokenizer), n_nodes(2, 2)
    save_file({"geo_table": torch.randn(vocab, 4, generator=gen), "geo_mask": (torch.rand(vocab, generator=gen) > 0.5).float(),
               "U0": 0.3 * torch.randn(n, 2, generator=gen), "V0": 0.3 * torch.randn(n, 2, generator=gen)},
              str(d / "init.safetensors"), metadata={"config": '{"n_layers": 2}'})
    save_file({"importance": torch.tensor([[0.3, 0.1], [0.05, 0.2]])}, str(d / "heads.safetensors"))
    build_static_baselines(StaticBaselinesConfig(fit_windows=2, batch_size=4, device="cpu"), WindowsConfig(per_role=4), 12,
                           base, d / "tokens", d / "static_baselines")
    return {"base": base, "tokens": d / "tokens", "contexts": d / "contexts", "init": d / "init.safetensors",
            "heads": d / "heads.safetensors", "static_baselines": d / "static_baselines", "root": d}


def sh(cmd: list[str], cwd: Path, env: dict, check: bool = True) -> str:
    """Run a command; its stdout + stderr, or an AssertionError showing them when it fails."""
    from lookahead.tools.faults import run

    try:
        return run(cmd, cwd, env, check)
    except RuntimeError as err:
        raise AssertionError(str(err)) from None


class BackgroundRepro:
    """`dvc repro` of the tiny profile in a fresh git + DVC repository holding the project's files
    (:func:`lookahead.tools.faults.scratch_repo`), run in a process of its own beside the tests.

    One run per session, whichever pytest-xdist workers the session has: the first worker to ask
    for it (an atomic ``mkdir`` of ``home``) makes the repository and starts the run; every worker
    then reads it from ``home``: ``env.json`` (the run's environment), ``repro.log``, and, once the
    run has ended, ``dvc.lock.done`` (the lock file it wrote: tests change the repository
    afterwards) and ``rc`` (its exit code)."""

    def __init__(self, home: Path, prepare=None, command: tuple[str, ...] = ("dvc", "repro")):
        """``prepare(path, env)``, if given, adapts the fresh repository before the run (its params,
        its environment: it returns the env the run gets); ``command``: what runs in the repository."""
        from lookahead.tools.faults import scratch_repo

        self.home, self.path, self.log = home, home / "repo", home / "repro.log"
        self.proc: subprocess.Popen | None = None
        try:
            home.mkdir(parents=True)
        except FileExistsError:  # another worker started it
            deadline = time.time() + 300
            while not (home / "env.json").exists():
                if time.time() > deadline:
                    raise AssertionError(f"the tiny run in {home} was never started") from None
                time.sleep(0.5)
            self.env = json.loads((home / "env.json").read_text())
            return
        self.path.mkdir()
        _, self.env = scratch_repo(REPO, self.path)
        # one torch thread per stage process: the tiny runs and the unit tests already fill the
        # cores, where a second thread only waits for the first (37 s against 43 s for the three
        # phase-1 processes above). The runs are compared with each other, never with a run on two
        # threads (some of their outputs differ in the last bits between one thread and two).
        self.env["OMP_NUM_THREADS"] = "1"
        if prepare is not None:
            self.env = prepare(self.path, self.env)
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(list(command), cwd=self.path, env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT)
        threading.Thread(target=self._record_end, daemon=True).start()
        tmp = home / "env.json.tmp"
        tmp.write_text(json.dumps(self.env))
        tmp.rename(home / "env.json")

    def _record_end(self) -> None:
        """(In the worker that started the run.) Once it ends: its lock file, then its exit code."""
        code = self.proc.wait()
        if (self.path / "dvc.lock").exists():
            shutil.copy(self.path / "dvc.lock", self.home / "dvc.lock.done")
        (self.home / "rc.tmp").write_text(str(code))
        (self.home / "rc.tmp").rename(self.home / "rc")

    def output(self) -> str:
        """Wait for the run; its output (an AssertionError with its tail when it failed)."""
        deadline = time.time() + 1800
        while not (self.home / "rc").exists():
            if time.time() > deadline:
                raise AssertionError(f"the tiny run in {self.path} did not end in 30 min")
            time.sleep(0.5)
        code, out = int((self.home / "rc").read_text()), self.log.read_text()
        if code != 0:
            raise AssertionError(f"dvc repro failed ({code}) in {self.path}:\n{out[-4000:]}")
        return out

    @property
    def lock(self) -> str:
        """The dvc.lock the run wrote, as it ended."""
        self.output()
        return (self.home / "dvc.lock.done").read_text()

    def close(self) -> None:
        """In the process that started it, at the session's end: in one process, stop a run still
        going (no test is left to read it); under pytest-xdist, wait for it (the other worker's
        tests may still read it; a Ctrl-C reaches the run as it reaches the workers)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        if not os.environ.get("PYTEST_XDIST_WORKER"):
            self.proc.terminate()
        self.proc.wait(timeout=1800)


TINY_RUNS = ("pipeline_repo", "second_tiny_run", "hub_profile_run")
"""The tiny runs, by the fixture that gives each; the xdist group of the tests that read it
(:func:`pytest_itemcollected`)."""


def shared_root(tmp_path_factory) -> Path:
    """This session's directory that all its pytest-xdist workers share (each has a basetemp of its
    own inside it); the basetemp itself without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def tiny_runs(request, tmp_path_factory):
    """The tiny pipeline runs the selected tests need, all started when the session starts: a tiny
    stage's work is mostly one-threaded start-up (imports, DVC), so two runs and the unit tests share
    2 cores with little loss, where one after the other they took most of the suite's time."""
    wanted = {name for item in request.session.items for name in item.fixturenames if name in TINY_RUNS}
    runs = {name: BackgroundRepro(shared_root(tmp_path_factory) / "tiny_runs" / name, PREPARE.get(name),
                                  COMMANDS.get(name, ("dvc", "repro")))
            for name in TINY_RUNS if name in wanted}
    yield runs
    for run in runs.values():
        run.close()


@pytest.fixture(scope="session")
def pipeline_repo(tiny_runs):
    """The tiny pipeline run (`dvc repro` of profiles/tiny.yaml in a fresh repository): (path, env).
    Shared by the pipeline, sharing, scale-out and reliability tests."""
    run = tiny_runs["pipeline_repo"]
    run.output()
    return run.path, run.env


@pytest.fixture(scope="session")
def pipeline_repro_output(pipeline_repo, tiny_runs) -> str:
    """What `dvc repro` printed in ``pipeline_repo``."""
    return tiny_runs["pipeline_repo"].output()


def _hub_profile(path: Path, env: dict) -> dict:
    """The 1B profile's code path at the tiny profile's sizes, the hub a local cache (tests/hub_profile.py);
    beside it, SmolLM2's profile on a tiny grouped Llama written as GGUF (``repo-gguf``, run second)."""
    import yaml

    from lookahead.tools.faults import scratch_repo
    from tests.hub_profile import gguf_base, hub_cache, runnable_gguf_profile, runnable_profile

    (path / "params.yaml").write_text(yaml.safe_dump(runnable_profile(REPO), sort_keys=False))
    second = path.parent / GGUF_REPO
    second.mkdir()
    scratch_repo(REPO, second)
    params = runnable_gguf_profile(REPO, *gguf_base(path.parent / "gguf"))
    (second / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return {**_untracked(path, env), "HF_HUB_CACHE": str(hub_cache(path.parent / "hub")), "HF_HUB_OFFLINE": "1"}


GGUF_REPO = "repo-gguf"
"""The hub-profile run's second repository (beside its first): SmolLM2's profile on a tiny GGUF."""


def _untracked(path: Path, env: dict) -> dict:
    """A run whose tests read nothing from MLflow runs without it (``LOOKAHEAD_TRACKING=off``: each stage
    skips importing MLflow, about 2 s of its start-up); the first run's tests check the tracking."""
    return {**env, "LOOKAHEAD_TRACKING": "off"}


PREPARE = {"hub_profile_run": _hub_profile, "second_tiny_run": _untracked}
COMMANDS = {"hub_profile_run": ("sh", "-c", f"dvc repro && cd ../{GGUF_REPO} && dvc repro")}
"""A run's command where it is not `dvc repro` in its repository."""


@pytest.fixture(scope="session")
def hub_profile_run(tiny_runs):
    """`dvc repro` of profiles/olmo2-1b.yaml's code path on tiny stand-ins of its hub models: (path, env)."""
    run = tiny_runs["hub_profile_run"]
    run.output()
    return run.path, run.env


@pytest.fixture(scope="session")
def gguf_profile_run(hub_profile_run, tiny_runs):
    """`dvc repro` of profiles/smollm2-135m.yaml's code path on a tiny grouped Llama GGUF, the hub-profile
    run's second repository (run after its first): (path, env)."""
    return tiny_runs["hub_profile_run"].home / GGUF_REPO, hub_profile_run[1]


@pytest.fixture(scope="session")
def second_tiny_run(tiny_runs):
    """A second tiny pipeline run from scratch, in another repository, at the same time as the
    first: (path, env). Every output must have the first run's bytes (docs/reproducibility.md)."""
    run = tiny_runs["second_tiny_run"]
    run.output()
    return run.path, run.env


# Experiments queued in the tiny run: name -> (the param set, the stages it reruns).
QUEUED_EXPERIMENTS = {
    # free connectivity on phase 2's router graph (its weights reach evaluate's rows, causality check, explainer)
    "connectivity-both": ("phase2.connectivity=both", {"phase2", "score_phase2", "evaluate"}),
    "samples-3": ("evaluate.diffusion_samples=3", {"evaluate"}),  # tiny.yaml has 2: the last stage alone reruns
    # a scoring setting: the scoring stages and evaluate rerun, nothing trains (tiny.yaml has 2000 resamples)
    "resamples-300": ("scoring.resamples=300", {"score_phase1", "score_phase2", "score_control", "evaluate"}),
}


@pytest.fixture(scope="session")
def queued_experiments(pipeline_repo, tmp_path_factory) -> tuple[Path, dict, str]:
    """:data:`QUEUED_EXPERIMENTS` queued in the tiny run (its outputs committed first, with a default
    DVC remote as a team has one) and run by one queue worker (`dvc exp run --queue`, `dvc queue
    start`): (path, env, the baseline commit). Read by the MLflow-landing check and the experiments'
    trip through git and DVC remotes."""
    path, env = pipeline_repo
    # an experiment's commit carries its baseline's DVC config: the remote `dvc exp push` sends its outputs to
    sh(["dvc", "remote", "add", "-f", "-d", "exps", str(tmp_path_factory.mktemp("experiments") / "store")], path, env)
    sh(["git", "add", "-A"], path, env)
    sh(["git", "commit", "-qm", "outputs", "--allow-empty"], path, env)
    for name, (assignment, _) in QUEUED_EXPERIMENTS.items():
        sh(["dvc", "exp", "run", "--queue", "-n", name, "-S", assignment], path, env)
    sh(["dvc", "queue", "start", "-j", "1"], path, env)
    # Wait on the experiments' git refs (refs/exps/<baseline>/<name>, written as each one lands: a git
    # call costs milliseconds), asking the queue itself (a DVC process: about 2 s of a core, taken from
    # the experiments it waits for) every 20 s, to see a failure, and once every ref is there.
    deadline, status, asked = time.time() + 600, "", time.time()
    while time.time() < deadline:
        refs = sh(["git", "for-each-ref", "--format=%(refname)", "refs/exps"], path, env).split()
        landed = {ref.rsplit("/", 1)[-1] for ref in refs} >= set(QUEUED_EXPERIMENTS)
        if landed or time.time() - asked > 20:
            status, asked = sh(["dvc", "queue", "status"], path, env), time.time()
            rows = [line for line in status.splitlines() if line.split()[1:2] and line.split()[1] in QUEUED_EXPERIMENTS]
            if len(rows) == len(QUEUED_EXPERIMENTS) and all("Success" in r or "Failed" in r for r in rows):
                break
        time.sleep(1)
    for name in QUEUED_EXPERIMENTS:
        row = next((line for line in status.splitlines() if name in line.split()), "")
        assert "Success" in row, status + sh(["dvc", "queue", "logs", name], path, env, check=False)
    return path, env, sh(["git", "rev-parse", "HEAD"], path, env).strip()


@pytest.fixture(scope="session")
def downstream_inputs(phase_inputs, tmp_path_factory):
    """What phase 2 and evaluate read besides ``phase_inputs``: a phase-1 predictor (init bias 1: a
    mix of heads on and off) and a diffusion head trained for a few steps on its pairs."""
    from lookahead.artifacts.contexts import ContextCache
    from lookahead.core.config import from_dict
    from lookahead.graph.predictor import PredictorConfig, StructurePredictor, save_predictor
    from lookahead.pipeline.diffusion.build import DiffusionConfig, build_diffusion
    from lookahead.pipeline.pairs import PairsConfig, build_pairs

    d = tmp_path_factory.mktemp("downstream")
    cache = ContextCache(phase_inputs["contexts"])
    torch.manual_seed(0)
    predictor = StructurePredictor.from_init(PredictorConfig.cascade(rank=2, hidden=8, init_bias=1.0), phase_inputs["init"],
                                             cache.dim)
    torch.nn.init.normal_(predictor.to_v.weight, std=0.5)  # as if trained: the topology depends on the context
    save_predictor(predictor, d / "predictor.safetensors")
    build_pairs(PairsConfig(target="beats_dense", sequences=6, samples=4, keep=2, batch_size=3, approx_positions=0, device="cpu"),
                phase_inputs["base"], phase_inputs["contexts"], phase_inputs["init"], d / "predictor.safetensors",
                d / "pairs")
    cfg = from_dict(DiffusionConfig, {
        "denoiser": {"hidden": 8, "layers": 1, "rank": 2, "cond_hidden": 8}, "sample_steps": 2, "eval_samples": 2,
        "heldout_fraction": 0.25, "eval_batch_size": 2, "val_pairs": 16,
        "train": {"steps": 2, "batch_size": 8, "warmup_steps": 1, "eval_every": 2, "log_every": 1,
                  "checkpoint_every": 0, "device": "cpu"}})
    build_diffusion(cfg, phase_inputs["base"], phase_inputs["contexts"], phase_inputs["init"],
                    d / "predictor.safetensors", d / "pairs", d / "diffusion")
    return {**phase_inputs, "predictor": d / "predictor.safetensors", "diffusion": d / "diffusion", "root": d}


@pytest.fixture(scope="session")
def phase2_run(downstream_inputs, tmp_path_factory):
    """The phase-2 stage (decoder mlp, the cascade router on the cache's windows with replay) and its
    two controls on the tiny inputs: (config, phase-2 report, its training result, its output
    directory, each control's report and LM directory, root)."""
    from lookahead.artifacts.phase2 import write_pruning
    from lookahead.core.config import from_dict
    from lookahead.pipeline.phase2.run import build_control, build_phase2
    from lookahead.pipeline.phase2.score import save_seed_scores
    from lookahead.pipeline.phase2.config import Phase2Config
    from lookahead.pipeline.phase2.static_mask import static_mask

    d = tmp_path_factory.mktemp("phase2")
    cfg = from_dict(Phase2Config, {
        "hard_from_step": 1, "eval_batch_size": 2, "windows": "cache", "replay": True, "predictor_lr_scale": 30,
        "shared_heads": 0,
        "train": {"steps": 3, "batch_size": 2, "lr": 1e-3, "warmup_steps": 1, "eval_every": 2, "log_every": 1,
                  "checkpoint_every": 2, "device": "cpu"}})
    i = downstream_inputs
    report, result = build_phase2(cfg, i["base"], i["tokens"], i["contexts"], i["init"], i["predictor"], i["diffusion"],
                                  d / "out", d / "ckpt")
    control, _ = build_control(cfg, i["base"], i["tokens"], i["contexts"], d / "control", d / "ckpt")
    write_pruning(d / "out", d / "pruning.json")
    static, _ = build_control(cfg, i["base"], i["tokens"], i["contexts"], d / "static", d / "ckpt",
                              mask=static_mask(i["static_baselines"], d / "pruning.json"))
    scores = {name: d / f"{name}.safetensors" for name in ("phase2", "control", "static_control")}
    for name, run in (("phase2", report), ("control", control), ("static_control", static)):
        save_seed_scores(scores[name], [run])  # one seed's per-position NLLs, as the stages write them
    return {"cfg": cfg, "report": report, "result": result, "out": d / "out", "control": control,
            "control_dir": d / "control", "static_control": static, "static_control_dir": d / "static", "root": d,
            "scores": scores}


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """An OpenSSH server on 127.0.0.1:<free port> accepting one generated key; yields
    (port, key file, a refused key file, home with known_hosts). `make setup` installs openssh-server."""
    from lookahead.tools.faults import start_sshd

    proc, port, key, stranger, home = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield port, key, stranger, home
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="session")
def reproduced(second_tiny_run, tmp_path_factory):
    """One copy per session of the second tiny pipeline run (`dvc repro` after it is a no-op),
    everything committed: the state every fault of the reliability suite starts from and must come
    back to (each test ends by checking that it did)."""
    path, env = second_tiny_run
    sh(["dvc", "repro"], path, env)
    env = {**env, "LOOKAHEAD_TRACKING": "on"}  # the faults' tests read the stages' runs
    dest = tmp_path_factory.mktemp("reproduced") / "repo"
    shutil.copytree(path, dest, symlinks=True)
    sh(["git", "add", "-A"], dest, env)
    sh(["git", "commit", "-qm", "reproduced", "--allow-empty"], dest, env)
    return dest, env
