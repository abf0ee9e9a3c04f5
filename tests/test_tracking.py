"""MLflow tracking: parent run per pipeline, child run per stage, failures only warn (docs/tracking.md)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import signal
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from lookahead.core import tracking


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory) -> Path:
    """An MLflow SQLite store with every migration applied and nothing logged, made once per session
    (making one takes seconds, most of them the migrations); a test's project gets a copy. A store
    made from nothing is still made, and checked, in test_tracking_uri_environment_variable_is_honoured
    and in every tiny pipeline run."""
    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def project(tmp_path, monkeypatch, empty_store):
    shutil.copy(empty_store, tmp_path / "mlflow.db")
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    (tmp_path / "params.yaml").write_text("corpus: {}\n")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.setenv("DVC_EXP_NAME", "exp-test")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def runs(uri):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(tracking.EXPERIMENT)
    return client, client.search_runs([exp.experiment_id])


def test_stages_group_under_one_parent_in_the_local_store(project):
    with tracking.stage_run("corpus", {"corpus": {"max_lines": 5, "nested": {"a": 1}}}) as run:
        run.log_metrics({"train": {"lines": 10}}, step=0)
    with tracking.stage_run("base", {"base": {"train": {"lr": 0.01}}}) as run:
        run.log_metrics({"val_nll": 3.5}, step=7)
    uri = f"sqlite:///{project / 'mlflow.db'}"
    assert tracking.tracking_uri(project) == uri  # absolute, inside the project
    client, found = runs(uri)
    parents = [r for r in found if r.data.tags[tracking.TAG_ROLE] == "pipeline"]
    stages = {r.data.tags[tracking.TAG_STAGE]: r for r in found if r.data.tags[tracking.TAG_ROLE] == "stage"}
    assert len(parents) == 1 and parents[0].data.tags[tracking.TAG_PIPELINE] == "exp-test"
    assert set(stages) == {"corpus", "base"}
    for run in stages.values():
        assert run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert run.info.status == "FINISHED"
        # what the floats depend on besides the inputs: the resolved versions and the CPU
        assert run.data.tags["env.libraries.torch"] == importlib.metadata.version("torch")
        assert run.data.tags["env.libraries.transformers"] == importlib.metadata.version("transformers")
        assert run.data.tags["env.cpu.torch_capability"] == torch.backends.cpu.get_cpu_capability()
        assert run.data.tags["env.python.version"] == platform.python_version()
    assert stages["corpus"].data.params == {"corpus/corpus.max_lines": "5", "corpus/corpus.nested.a": "1"}
    assert stages["corpus"].data.metrics == {"train.lines": 10.0}
    assert stages["base"].data.params == {"base/base.train.lr": "0.01"}
    history = client.get_metric_history(stages["base"].info.run_id, "val_nll")
    assert [(m.step, m.value) for m in history] == [(7, 3.5)]
    # artifacts live beside the store, not in a (temporary) working directory
    exp = client.get_experiment_by_name(tracking.EXPERIMENT)
    assert exp.artifact_location == (project / "mlartifacts").as_uri()


def test_failed_stage_is_marked_failed_and_raises(project):
    with pytest.raises(ZeroDivisionError):
        with tracking.stage_run("base", {}):
            1 / 0
    _, found = runs(f"sqlite:///{project / 'mlflow.db'}")
    (stage,) = [r for r in found if r.data.tags[tracking.TAG_ROLE] == "stage"]
    assert stage.info.status == "FAILED"


def test_ctrl_c_inside_a_tracking_call_waits_for_it_then_marks_the_run_failed(project, monkeypatch):
    """A SIGINT in the middle of a client call (here: raised from inside log_batch) is held until the
    call has written, then stops the stage, whose run still ends FAILED: an interrupted SQL write
    would leave the store locked and the run RUNNING (the Ctrl-C of tests/reliability/test_kills.py)."""
    client_cls = type(MlflowClient("sqlite:///" + str(project / "mlflow.db")))
    log_batch = client_cls.log_batch
    # Python's own Ctrl-C handler, as a stage process starts with (a library an earlier test in this
    # worker process loaded may have left another one in place)
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)

    def interrupted_log_batch(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C arrives while the write is under way
        return log_batch(self, *args, **kwargs)

    with pytest.raises(KeyboardInterrupt):
        with tracking.stage_run("phase1", {}) as run:
            monkeypatch.setattr(client_cls, "log_batch", interrupted_log_batch)
            run.log_metrics({"hard_nll": 4.25}, step=3)
            pytest.fail("the held Ctrl-C did not stop the stage after the call")
    monkeypatch.undo()
    client, found = runs(f"sqlite:///{project / 'mlflow.db'}")
    (stage,) = [r for r in found if r.data.tags[tracking.TAG_ROLE] == "stage"]
    assert stage.info.status == "FAILED"
    assert [(m.step, m.value) for m in client.get_metric_history(stage.info.run_id, "hard_nll")] == [(3, 4.25)]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is back
    signal.signal(signal.SIGINT, outer)


def test_parent_stays_failed_when_a_later_stage_succeeds_until_the_failed_one_reruns(project):
    def parent_state():
        _, found = runs(f"sqlite:///{project / 'mlflow.db'}")
        (parent,) = [r for r in found if r.data.tags[tracking.TAG_ROLE] == "pipeline"]
        return parent.info.status

    with tracking.stage_run("corpus", {}):
        pass
    assert parent_state() == "FINISHED"
    with pytest.raises(RuntimeError):
        with tracking.stage_run("probe", {}):
            raise RuntimeError("probe broke")
    assert parent_state() == "FAILED"
    with tracking.stage_run("wordnet", {}):  # e.g. `dvc repro --keep-going` runs another branch
        pass
    assert parent_state() == "FAILED"
    with tracking.stage_run("probe", {}):  # the fixed stage reruns in the same pipeline run
        pass
    assert parent_state() == "FINISHED"


def test_list_figures_reach_mlflow_as_step_series(project):
    report = {"val_nll": 3.5, "encoder": "minilm", "per_layer": [0.5, 0.25, 1.0],
              "weights": {"q_proj": {"stable_rank": [7.0, 3.5]}}, "bands": [{"cos": 0.1, "n": 4}, {"cos": 0.3, "n": 2}],
              "grid": [[1, 2], [3, 4]], "flag": True}
    with tracking.stage_run("probe", {}) as run:
        run.log_metrics(report)
    client, found = runs(f"sqlite:///{project / 'mlflow.db'}")
    (stage,) = [r for r in found if r.data.tags[tracking.TAG_ROLE] == "stage"]
    rid = stage.info.run_id

    def series(key):
        return [(m.step, m.value) for m in sorted(client.get_metric_history(rid, key), key=lambda m: m.step)]

    assert series("val_nll") == [(0, 3.5)]
    assert series("per_layer") == [(0, 0.5), (1, 0.25), (2, 1.0)]
    assert series("weights.q_proj.stable_rank") == [(0, 7.0), (1, 3.5)]
    assert series("bands.cos") == [(0, 0.1), (1, 0.3)] and series("bands.n") == [(0, 4.0), (1, 2.0)]
    assert series("grid.1") == [(0, 3.0), (1, 4.0)]
    assert "encoder" not in stage.data.metrics and "flag" not in stage.data.metrics


def test_tracking_uri_environment_variable_is_honoured(project, tmp_path_factory, monkeypatch):
    other = tmp_path_factory.mktemp("server") / "other.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{other}")
    with tracking.stage_run("corpus", {}):
        pass
    assert other.is_file()
    assert MlflowClient(f"sqlite:///{project / 'mlflow.db'}").get_experiment_by_name(tracking.EXPERIMENT) is None
    _, found = runs(f"sqlite:///{other}")
    assert len(found) == 2


def test_unreachable_store_warns_and_the_stage_still_runs(project, monkeypatch):
    # a store that cannot be created: its parent "directory" is a file
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{project}/params.yaml/x.db")
    done = []
    with pytest.warns(UserWarning, match="MLflow tracking unavailable for stage 'base'"):
        with tracking.stage_run("base", {"base": {"a": 1}}) as run:
            run.log_metrics({"x": 1.0})
            done.append(True)
    assert done == [True] and not run.active


def test_tracking_off_logs_nothing_and_never_imports_mlflow(project, monkeypatch):
    """``LOOKAHEAD_TRACKING=off``: the stage runs with an inactive run, the store stays empty, and a fresh
    process running a stage block never imports mlflow."""
    import subprocess
    import sys

    monkeypatch.setenv(tracking.SWITCH, "off")
    with tracking.stage_run("base", {"base": {"a": 1}}) as run:
        run.log_metrics({"x": 1.0})
    assert not run.active
    assert MlflowClient(f"sqlite:///{project / 'mlflow.db'}").get_experiment_by_name(tracking.EXPERIMENT) is None
    probe = ("import sys\nfrom lookahead.core.tracking import stage_run\nwith stage_run('base', {}) as run:\n"
             "    run.log_metrics({'x': 1.0})\nprint('mlflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=project).stdout
    assert out.strip() == "False"


def test_experiment_workspace_resolves_to_its_repository(tmp_path):
    workspace = tmp_path / ".dvc" / "tmp" / "exps" / "tmpab12cd"
    workspace.mkdir(parents=True)
    assert tracking.home_root(workspace) == tmp_path.resolve()
    assert tracking.home_root(tmp_path) == tmp_path.resolve()


def test_pipeline_id_without_dvc_exp_is_revision_and_params_hash(project, monkeypatch):
    monkeypatch.delenv("DVC_EXP_NAME")
    first = tracking.pipeline_id(project)
    (project / "params.yaml").write_text("corpus: {max_lines: 3}\n")
    second = tracking.pipeline_id(project)
    assert first.split("-")[0] == second.split("-")[0] and first != second
