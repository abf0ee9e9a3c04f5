"""dvc.yaml lists, for every stage, each `lookahead` module its script imports, transitively
(STYLE 3), by file, `core`'s too: a change to any of them must rerun the stage, and a change to any
other must not. Imports inside functions count too. Phase 2's decoder is imported by name where it
runs; its inputs come through the params-templated `decoder_inputs` deps (checked here for each decoder)."""

from __future__ import annotations


import pytest
import yaml

from lookahead.core.errors import ConfigError
from lookahead.pipeline.phase2.config import DECODER_INPUTS, DECODER_MODULES, DecoderInputs, check_decoder_inputs
from tests.conftest import REPO
from tests.imports import closure, module_file

STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
PARAMS = yaml.safe_load((REPO / "params.yaml").read_text())


def resolve(deps: list[str], decoder_inputs: dict) -> list[str]:
    """The deps with ``${decoder_inputs.<key>}`` (phase 2's params-templated deps) filled in."""
    out = []
    for dep in deps:
        for key, value in decoder_inputs.items():
            dep = dep.replace(f"${{decoder_inputs.{key}}}", value)
        out.append(dep)
    return out


def expand(deps: list[str]) -> set[str]:
    """The source files a stage's deps cover: a directory dep stands for every .py file under it."""
    files = set()
    for dep in deps:
        path = REPO / dep
        if dep.startswith("src/") and path.is_dir():
            files |= {str(p.relative_to(REPO)) for p in path.rglob("*.py") if "__pycache__" not in p.parts}
        elif dep.startswith("src/"):
            files.add(dep)
    return files


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_deps_cover_its_imports(stage):
    spec = STAGES[stage]
    script = REPO / "stages" / f"{stage}.py"
    assert f"stages/{stage}.py" in spec["cmd"] and f"stages/{stage}.py" in spec["deps"]
    needed = {str(p.relative_to(REPO)) for p in closure(script)}
    missing = sorted(needed - expand(resolve(spec["deps"], PARAMS["decoder_inputs"])))
    assert not missing, f"dvc.yaml stage {stage!r} imports {missing} but does not list them in deps"
    listed = {d for d in spec["deps"] if d.startswith("src/lookahead/")}
    extra = sorted(listed - needed)
    assert not extra, f"dvc.yaml stage {stage!r} lists {extra} in deps but never imports them (needless reruns)"


@pytest.mark.parametrize("decoder", sorted(DECODER_INPUTS))
def test_phase2s_templated_deps_cover_each_decoder_and_only_it(decoder):
    """Phase 2 imports a decoder's sampler by name (config.DECODER_MODULES), so its deps list the decoder's
    inputs through ``decoder_inputs``: with a decoder's inputs they cover the sampler module and everything
    it imports; the default's inputs are the mlp decoder's, which hold neither the diffusion head's outputs
    nor its code."""
    deps = resolve(STAGES["phase2"]["deps"], DECODER_INPUTS[decoder])
    needed = {str(p.relative_to(REPO)) for p in closure(REPO / "stages" / "phase2.py")}
    if decoder in DECODER_MODULES:
        sampler = module_file(DECODER_MODULES[decoder])
        needed |= {str(sampler.relative_to(REPO))} | {str(p.relative_to(REPO)) for p in closure(sampler)}
    assert not sorted(needed - expand(deps)), decoder
    assert PARAMS["decoder_inputs"] == DECODER_INPUTS["mlp"]
    default = expand(resolve(STAGES["phase2"]["deps"], PARAMS["decoder_inputs"]))
    assert "src/lookahead/graph/denoiser.py" not in default and "models/diffusion" not in resolve(
        STAGES["phase2"]["deps"], PARAMS["decoder_inputs"])
    check_decoder_inputs(decoder, DecoderInputs(**DECODER_INPUTS[decoder]))
    if decoder in DECODER_MODULES:
        with pytest.raises(ConfigError, match="decoder_inputs.code=src/lookahead/graph"):
            check_decoder_inputs(decoder, DecoderInputs())


def test_the_checker_sees_imports_inside_functions(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("def f():\n    from lookahead.pipeline.init import build_init\n"
                      "    from lookahead.semantics import geometry\n")
    files = {str(p.relative_to(REPO / "src" / "lookahead")) for p in closure(script)}
    assert {"pipeline/init.py", "semantics/geometry.py", "artifacts/wordnet_tables.py", "lm/encoders.py"} <= files


def test_a_directory_dep_ignores_bytecode():
    """Phase 2's diffusion decoder lists `src/lookahead/graph` as a directory: its bytecode must not count."""
    assert "__pycache__/" in (REPO / ".dvcignore").read_text().split()
    assert expand(["src/lookahead/graph"]) == {str(p.relative_to(REPO)) for p in (REPO / "src/lookahead/graph").glob("*.py")}


def test_the_rerun_table_lists_each_params_key_where_dvc_yaml_does():
    """scripts/rerun_table.py --params: a key belongs to the stages that list it or a section above it
    (and a key templated into dvc.yaml is measured alone); the edit it makes is a value of another kind."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("rerun_table", REPO / "scripts" / "rerun_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    listing = table.params_listing(stages)
    scoring = tuple(s for s, spec in stages.items() if "scoring" in spec.get("params", []))
    assert listing["scoring.resamples"] == listing["scoring.bootstrap_seed"] == scoring and "evaluate" in scoring
    assert listing["base.train.seed"] == ("base",) and "(templated)" in listing["launch.train"]
    assert set(listing) == set(table.leaves(yaml.safe_load((REPO / "params.yaml").read_text())))
    for value in (True, 3, 0.5, "x", None, [1, 2]):
        assert table.edited(value) != value
    assert table.set_key({"a": {"b": 1}}, "a.b", 2) == {"a": {"b": 2}}


def test_training_stages_list_their_keys_one_by_one_and_scoring_keys_rerun_scoring_only():
    """Training and scoring apart (docs/pipeline.md): phase 1 and phase 2 list each key of their
    sections they train with, the scoring keys of ``phase1`` are listed by ``score_phase1`` alone,
    and no training stage lists ``scoring``: changing a scoring setting retrains nothing."""
    import dataclasses

    from lookahead.pipeline.phase1.config import SCORING_KEYS, Phase1Config
    from lookahead.pipeline.phase2.config import Phase2Config

    params = {s: spec.get("params", []) for s, spec in STAGES.items()}
    phase1 = [f"phase1.{f.name}" for f in dataclasses.fields(Phase1Config) if f.name not in SCORING_KEYS]
    assert [k for k in params["phase1"] if k.startswith("phase1")] == phase1
    assert [k for k in params["phase2"] if k.startswith("phase2")] == [f"phase2.{f.name}" for f in dataclasses.fields(Phase2Config)]
    assert {f"phase1.{k}" for k in SCORING_KEYS} <= set(params["score_phase1"])
    for stage in ("phase1", "phase2", "control", "static_control"):
        assert "scoring" not in params[stage] and not any(k.startswith("scoring.") for k in params[stage]), stage
    scoring = sorted(s for s, keys in params.items() if "scoring" in keys)
    assert scoring == ["evaluate", "score_control", "score_phase1", "score_phase2"]
