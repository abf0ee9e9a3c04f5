"""The frontier study's script (scripts/frontier.py): its grid, what each point runs, and the MACs it
records, against closed forms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import consistency


@pytest.fixture(scope="module")
def study():
    return consistency.script("frontier")


def test_the_grid_runs_routed_points_in_both_skips_and_dense_models_over_base_seeds(study):
    points = study.grid()
    routed = [p for p in points if p.kind == "routed"]
    dense = [p for p in points if p.kind == "dense"]
    assert len(routed) == 2 * 7 and [p.name for p in dense] == ["4x4-dense96-s0", "4x4-dense64-s0", "4x4-dense32-s0"]
    assert {(p.skip, p.keep) for p in routed} == {("full", 0.75), ("full", 0.5), ("full", 0.25), ("full", 0.125),
                                                 ("query", 0.5), ("query", 0.25), ("query", 0.125)}
    assert len({p.name for p in points}) == len(points)
    r = study.Point("4x8", "routed", "full", 0.125)
    assert r.name == "4x8-full-keep125" and r.targets == ("score_phase1", "score_phase2", "score_control")
    assert r.overrides("selection") == {
        "base.arch.n_layers": 4, "base.arch.n_heads": 8, "oracle.candidates": 4, "scoring.set": "selection",
        "phase1.static_twin": False, "phase1.score_static_curve": True, "phase1.oracle": "none", "phase1.random_draws": 1,
        "predictor.keep": 0.125, "runtime.skip": "full"}
    d = study.Point("4x8", "dense", width=32, seed=2)
    assert d.name == "4x8-dense32-s2" and d.targets == ("score_control",)
    assert d.overrides("test")["base.arch.head_dim"] == 4 and d.overrides("test")["base.train.seed"] == 2
    assert study.experiment_name(d, "test") == "fr-4x8-dense32-s2" and study.experiment_name(d, "selection").endswith("-sel")
    with pytest.raises(study.StudyError, match="even head dim"):
        study.Point("4x8", "dense", width=36).overrides("test")


def test_the_plan_names_each_points_command(study, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = study.plan([study.Point("4x4", "dense", width=64, seed=1)], "selection")
    assert text.split()[:2] == ["4x4-dense64-s1", "to"]
    assert "-S base.arch.head_dim=16 -S base.train.seed=1" in text and text.endswith("score_control")


def test_non_embedding_macs_leave_the_lm_head_out_of_both_sides():
    """(m · dense − d·V) / (dense − d·V): dense stays 1, the head-less share of a cheaper model falls further."""
    from transformers import Olmo2Config

    from lookahead.graph.cost import macs_per_token

    study = consistency.script("frontier")
    cfg = Olmo2Config(hidden_size=8, intermediate_size=12, num_hidden_layers=4, num_attention_heads=4, vocab_size=61)
    out = study.macs_figures(cfg, 9, {"dense": 1.0, "half": 0.8, "none": None})
    dense = macs_per_token(cfg, 5.0, 1.0, "query")
    assert out["dense_macs_per_token"] == dense and out["lm_head_macs_per_token"] == 8 * 61
    assert out["dense_non_embedding"] == pytest.approx(1.0) and out["none_non_embedding"] is None
    assert out["half_non_embedding"] == pytest.approx((0.8 * dense - 488) / (dense - 488)) and out["half_non_embedding"] < 0.8


def _synthetic(study, rng, windows=64):
    """Records of one shape (2 x 2 = 4 heads): two full-skip routed points and one query-skip, the dense
    models at width 64 over three base seeds; NLLs fall with MACs, the routed ones below both frontiers."""

    def noise(rows=1):
        return rng.normal(0, 0.05, (rows, windows))

    def routed(skip, keep, macs, nll):
        curve = {f"static_heads_{k}": (5.0 - 0.2 * k + noise()).tolist() for k in range(1, 5)}
        return {"point": f"4x4-{skip}-keep{round(keep * 1000)}", "shape": "4x4", "kind": "routed", "skip": skip,
                "keep": keep, "heads_total": 4, "static_control_heads": round(keep * 4),
                "macs": {"deployed": macs, "phase2_deployed": macs, "static_control": 0.7 + 0.3 * keep,
                         **{f"static_heads_{k}": 0.7 + 0.3 * k / 4 for k in range(1, 5)}},
                "windows": {"phase1": {"deployed": (nll + noise(3)).tolist(), **curve},
                            "phase2": {"deployed": (nll - 0.1 + noise(3)).tolist()},
                            "static_control": {"hard": (4.9 - 0.5 * keep + noise(3)).tolist()},
                            "control": {"dense": (4.1 + noise(3)).tolist(), "base": (4.2 + noise()).tolist()}}}

    records = [routed("full", 0.5, 0.85, 4.3), routed("full", 0.25, 0.78, 4.5), routed("query", 0.5, 0.99, 4.25)]
    for seed in range(3):
        records.append({"point": f"4x4-dense64-s{seed}", "shape": "4x4", "kind": "dense", "width": 64, "seed": seed,
                        "macs": {"dense": 0.8}, "windows": {"control": {"base": (4.6 + noise()).tolist(),
                                                                        "dense": (4.5 + noise(3)).tolist()}}})
    return records


def test_the_frontiers_are_drawn_from_the_records_and_the_claims_interpolate_them(study):
    """The static frontier before: the curve at every count; after: the static controls and the dense control.
    The dense frontier: one row per base seed at each width. A routed point at 0.85 of dense MACs sits between
    the static curve's 2 and 3 heads (0.85 = 0.7 + 0.3 · 2/4) — exactly on 2 heads' MACs — and between the
    dense widths 64 (0.8) and 128 (1.0), a quarter of the way."""
    import numpy as np

    from lookahead.tools.frontier_fit import claims as frontier_claims, frontiers

    records = _synthetic(study, np.random.default_rng(0))
    f = frontiers(records, "4x4")
    assert [label for _, _, label in f["static_before"]] == [f"static {k}/4" for k in range(1, 5)]
    assert [label for _, _, label in f["static_after"]] == ["static control 1/4", "static control 2/4", "dense control"]
    assert [(m, a.shape) for m, a, _ in f["dense_before"]] == [(1.0, (1, 64)), (0.8, (3, 64))]
    claims = frontier_claims(records, "4x4", resamples=300)
    by = {(c["point"], c["when"], c["against"]): c for c in claims}
    assert len(claims) == 3 * 2 * 2
    static = by["4x4-full-keep500", "before", "static"]
    curve = np.asarray(records[1]["windows"]["phase1"]["static_heads_2"])  # the curve of the lowest share (all alike)
    routed = np.asarray(records[0]["windows"]["phase1"]["deployed"])
    assert static["estimate"] == pytest.approx(routed.mean() - curve.mean()) and static["between"] == [[1, 1.0]]
    dense = by["4x4-full-keep500", "before", "dense"]
    bases = np.vstack([np.asarray(r["windows"]["control"]["base"]) for r in records[3:]])
    own = np.asarray(records[0]["windows"]["control"]["base"])
    assert dense["frontier_nll"] == pytest.approx(0.25 * own.mean() + 0.75 * bases.mean())
    assert dense["verdict"] == "below" and dense["seed_se"] > 0  # the base seeds' spread is in its interval
    assert by["4x4-full-keep250", "before", "dense"]["verdict"] == "outside"  # 0.78: below the smallest dense model
    assert by["4x4-full-keep500", "after", "static"]["frontier_nll"] is not None


def test_the_headline_point_is_declared_on_selection_and_judged_on_test_with_holm(study, tmp_path):
    """Declared from selection records only (the point whose worse claim is lowest, both frontiers
    measured); judged on test records only, Holm across its claims; the headline is drawn from them."""
    import numpy as np

    from lookahead.tools import frontier_page
    from lookahead.tools.frontier_fit import holm

    selection = [dict(r, set="selection") for r in _synthetic(study, np.random.default_rng(1))]
    declaration = frontier_page.declare(selection, ["4x4"], resamples=300)
    chosen = declaration["declared"]["4x4"]
    # 4x4-full-keep250 is outside the dense frontier (0.78 < 0.8), query-keep500 measured against both
    assert chosen["point"] in ("4x4-full-keep500", "4x4-query-keep500")
    assert chosen["selection_worse_estimate"] == max(c["estimate"] for c in chosen["selection_claims"])
    with pytest.raises(ValueError, match="selection"):
        frontier_page.declare([dict(r, set="test") for r in selection], ["4x4"])
    test = [dict(r, set="test") for r in _synthetic(study, np.random.default_rng(2))]
    judged = frontier_page.judged(test, declaration, resamples=300)
    assert {c["against"] for c in judged} == {"static", "dense"} and all(c["point"] == chosen["point"] for c in judged)
    assert [c["holm_p_value"] for c in judged] == pytest.approx(holm([c["p_value"] for c in judged]))
    with pytest.raises(ValueError, match="test"):
        frontier_page.judged(selection, declaration)
    head = frontier_page.headline(judged, declaration)
    dense = next(c for c in judged if c["against"] == "dense")
    assert head["4x4_dense"] == round(dense["estimate"], 4) and head["4x4_dense_hi"] == round(dense["ci_high"], 4)
    assert head["4x4_dense_holm_p"] == pytest.approx(dense["holm_p_value"], rel=0.05)
    assert head["4x4_macs"] == round(dense["macs_over_dense"], 4)
    two_shapes = dict(head, **{k.replace("4x4", "4x8"): v for k, v in head.items()})
    assert consistency.headline_width(str(frontier_page.HEADLINE), two_shapes) <= 400  # both shapes declared
    frontier_page.figure(test, ["4x4"], tmp_path / "frontier.png")
    assert (tmp_path / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = frontier_page.report(test, ["4x4"], declaration, judged, resamples=300)
    assert report["judged"] == judged and len(report["claims"]) == 12


def test_the_study_declares_once_on_selection_then_writes_the_headline_from_test(study, tmp_path, monkeypatch):
    """`--declare` on the selection points writes the declaration and refuses a second one; `--set test`
    refuses to judge before a declaration, then writes the headline drawn from the judged claims."""
    import shutil

    import numpy as np

    from lookahead.tools import frontier_page as page
    from tests.consistency import REPO

    monkeypatch.chdir(tmp_path)
    shutil.copy(REPO / "params.yaml", "params.yaml")
    for scoring_set, seed in (("selection", 1), ("test", 2)):
        (study.POINT_DIR / scoring_set).mkdir(parents=True)
        for r in _synthetic(study, np.random.default_rng(seed)):
            (study.POINT_DIR / scoring_set / f"{r['point']}.json").write_text(json.dumps(dict(r, set=scoring_set)))
    with pytest.raises(study.StudyError, match="declare the headline"):
        study.write(["4x4"], "test", declare=False, commit_each=False)
    study.write(["4x4"], "selection", declare=True, commit_each=False)
    declared = json.loads(page.DECLARED.read_text())
    assert declared["declared"]["4x4"]["point"] and Path("docs/figures/frontier_selection.png").is_file()
    with pytest.raises(study.StudyError, match="declared once"):
        study.write(["4x4"], "selection", declare=True, commit_each=False)
    study.write(["4x4"], "test", declare=False, commit_each=False)
    headline = json.loads(page.HEADLINE.read_text())
    judged = json.loads(page.REPORT.read_text())["judged"]
    for claim in judged:
        key = f"4x4_{claim['against']}"
        assert headline[key] == round(claim["estimate"], 4)
        assert headline[f"{key}_holm_p"] == pytest.approx(claim["holm_p_value"], rel=0.05)
    assert page.FIGURE.is_file()


def test_the_committed_headline_is_drawn_from_the_report_and_fits_a_terminal():
    """As committed (a rerun rewrites the working tree's metrics): the consistency set's check."""
    from lookahead.tools import frontier_page as page

    with consistency.committed() as root:
        assert (root / page.HEADLINE).is_file()  # the study is scored on the test windows
        consistency.frontier_headline_is_drawn_from_its_report(root)


def test_the_between_base_spread_goes_to_the_dense_frontier_claims_alone(study):
    """The dense frontier's points are other base LMs than the routed point's: each carries the
    between-base sd of the NLL level (make bases' records: the base LMs' dense NLL before, their dense
    controls' after); the static frontier runs on the routed point's own base LM, so nothing is added."""
    import numpy as np

    from lookahead.tools.frontier_fit import claims as frontier_claims, level_spread

    bases = [{"windows": {"phase1": {"dense": [[4.3 + d] * 4]}, "control": {"dense": [[4.2 + 2 * d] * 4] * 3}}}
             for d in (-0.01, 0.0, 0.01)]
    spread = level_spread(bases)
    assert spread["before"] == (pytest.approx(0.01), 3) and spread["after"] == (pytest.approx(0.02), 3)
    assert level_spread(bases[:1]) == {}
    records = _synthetic(study, np.random.default_rng(3))
    by = {(c["point"], c["when"], c["against"]): c for c in frontier_claims(records, "4x4", 300, spread=spread)}
    dense = by["4x4-full-keep500", "after", "dense"]  # at 0.85: a quarter of the way from width 64 to the full width
    assert dense["base_sd"] == pytest.approx(0.02)
    assert dense["base_se"] == pytest.approx(0.02 * np.sqrt(1 + 0.25 ** 2 + 0.75 ** 2))
    assert by["4x4-full-keep500", "after", "static"]["base_se"] == 0.0


def test_the_variants_change_one_setting_of_a_grid_point(study):
    found = study.variants()
    names = [p.name for p in found]
    assert len(set(names)) == len(names) and not set(names) & {p.name for p in study.grid()}
    router = next(p for p in found if p.variant == "router32" and p.shape == "4x4" and p.keep == 0.25)
    base = study.Point("4x4", "routed", "full", 0.25)
    assert router.name == "4x4-full-keep250-router32"
    assert {k: v for k, v in router.overrides("selection").items() if base.overrides("selection").get(k) != v} == {
        "predictor.hidden": 32}
    assert study.variants(("4x4",)) == [p for p in found if p.shape == "4x4"]


def test_the_results_page_section_shows_the_declared_claims_and_every_point(study, tmp_path):
    import numpy as np

    from lookahead.tools import frontier_page as page
    from lookahead.tools.results_frontier import frontier_section

    assert frontier_section(tmp_path / "none.json") == []  # not scored on test yet: no section
    selection = [dict(r, set="selection") for r in _synthetic(study, np.random.default_rng(1))]
    declaration = page.declare(selection, ["4x4"], resamples=300)
    test = [dict(r, set="test") for r in _synthetic(study, np.random.default_rng(2))]
    judged = page.judged(test, declaration, resamples=300)
    path = tmp_path / "frontier_report.json"
    path.write_text(json.dumps(page.report(test, ["4x4"], declaration, judged, resamples=300)))
    text = "\n".join(frontier_section(path))
    for c in judged:
        assert f"| `{c['point']}` | {c['against']} frontier |" in text and f"{c['holm_p_value']:.3g}" in text
    assert text.count("| `4x4-") == len(judged) + 12  # the declared claims, then every point's 12
    from lookahead.tools.results_frontier import frontier_line

    assert frontier_line(tmp_path / "none.json") is None
    line = frontier_line(path)  # README's summary line: every judged claim, drawn from the report
    for c in judged:
        assert f"− {c['against']} frontier {c['estimate']:+.3f} [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]: {c['verdict']}" in line
    met = all(c["verdict"] == "below" for c in judged)
    assert line.endswith("met at " + judged[0]["point"] + "." if met else "missed.")


def test_a_point_record_reads_a_runs_files_and_counts_its_macs(study, tmp_path, monkeypatch):
    """A routed point's record from a run's files (here a directory standing in for the experiment's
    commit): per-window means of every score file, its MACs as the gates ran (the score files' per-position
    MACs, every seed, over dense, the router's share added) and the static curve's closed form."""
    import numpy as np
    import yaml
    from transformers import Olmo2Config

    from lookahead.artifacts.val_scores import save_scores
    from lookahead.graph.cost import macs_per_token
    from tests.consistency import REPO

    run = tmp_path / "run"
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["base"]["arch"].update(n_layers=4, n_heads=4, context_length=8)
    cfg = Olmo2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=4, num_attention_heads=4, vocab_size=61)
    (run / "models" / "base").mkdir(parents=True)
    (run / "models" / "base" / "config.json").write_text(cfg.to_json_string())
    rng = np.random.default_rng(0)
    label, positions = "test:4x8:abc", 32
    dense = macs_per_token(cfg, 4.5, 1.0, "query")
    ran = np.full((3, positions), 0.6 * dense)
    files = {"phase1": {"dense": rng.normal(4, 0.1, positions), "deployed": rng.normal(4.2, 0.1, (3, positions)),
                        "deployed_macs": ran, **{f"static_heads_{k}": rng.normal(5 - k / 4, 0.1, positions)
                                                 for k in range(1, 17)}},
             "phase2": {"deployed": rng.normal(4.1, 0.1, (3, positions)), "deployed_macs": ran},
             "static_control": {"hard": rng.normal(4.4, 0.1, (3, positions))},
             "control": {"dense": rng.normal(4.0, 0.1, (3, positions)), "base": rng.normal(4.05, 0.1, positions)}}
    for name, arrays in files.items():
        save_scores(run / "data" / "val_nll" / f"{name}.safetensors", arrays, label)
    (run / "metrics").mkdir()
    (run / "metrics" / "phase1_report.json").write_text(json.dumps({"active_head_fraction": 0.5,
                                                                     "router_macs_over_dense": 0.05}))
    (run / "metrics" / "phase2_report.json").write_text(json.dumps({"active_head_fraction": 0.5}))
    monkeypatch.setattr(study, "read_params", lambda rev: params)
    monkeypatch.setattr(study, "read_json", lambda rev, path: json.loads((run / path).read_text()))
    monkeypatch.setattr(study, "output_file", lambda rev, path, tmp: run / path)
    point = study.Point("4x4", "routed", "full", 0.5)
    record = study.point_record(point, "0123456789abcdef", {"phase1": 1.0}, "test")
    assert record["window_set"] == label and record["heads_total"] == 16 and record["stage_seconds"] == {"phase1": 1.0}
    assert record["macs"]["deployed"] == pytest.approx(0.6 + 0.05) and record["macs"]["phase2_deployed"] == pytest.approx(0.65)
    static = lambda k: macs_per_token(cfg, 4.5, k / 16, "static") / macs_per_token(cfg, 4.5, 1.0, "static")  # noqa: E731
    assert record["macs"]["static_heads_3"] == pytest.approx(static(3)) and record["static_control_heads"] == 8
    means = np.asarray(record["windows"]["phase1"]["deployed"])
    assert means.shape == (3, 4) and means[1, 2] == pytest.approx(files["phase1"]["deployed"][1, 16:24].mean(), abs=1e-6)
    with pytest.raises(study.StudyError, match="holds 4 x 4 heads"):
        study.point_record(study.Point("4x8", "routed", "full", 0.5), "0123456789abcdef", {}, "test")
    head = 16 * 61
    assert record["macs"]["deployed_non_embedding"] == pytest.approx((0.65 * dense - head) / (dense - head))
    # a smaller dense model: its MACs over the full width's (head_dim 2 of 4 at hidden 16), the control's files alone
    narrow = Olmo2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=4, num_attention_heads=4, vocab_size=61,
                         head_dim=2)
    (run / "models" / "base" / "config.json").write_text(narrow.to_json_string())
    record = study.point_record(study.Point("4x4", "dense", width=8), "0123456789abcdef", {}, "test")
    assert list(record["windows"]) == ["control"] and np.asarray(record["windows"]["control"]["base"]).shape == (1, 4)
    assert record["macs"]["dense"] == pytest.approx(macs_per_token(narrow, 4.5, 1.0, "query") / dense)
    assert record["macs"]["dense"] < 1


def test_a_variant_adds_no_frontier_point_and_one_trained_longer_meets_controls_trained_alike(study, tmp_path):
    """A smaller router at a grid share runs the same static control: the static frontier after keeps one
    point per head count. A variant that continues pretraining longer is measured after it against its own
    static and dense controls and the narrower dense models trained as long — not the grid's controls —
    and before it against the same frontiers as every point (the same base LMs); the figure draws it so."""
    import numpy as np

    from lookahead.tools import frontier_page as page
    from lookahead.tools.frontier_fit import claims as frontier_claims, frontiers

    rng = np.random.default_rng(2)
    records = _synthetic(study, rng)
    grid = records[0]
    router = dict(grid, point="4x4-full-keep500-router32", variant="router32", controls="",
                  macs=dict(grid["macs"], deployed=0.82, phase2_deployed=0.82))
    longer = json.loads(json.dumps(dict(grid, point="4x4-full-keep500-phase2x2", variant="phase2x2")))
    longer["controls"] = study.Point("4x4", "routed", "full", 0.5, variant="phase2x2").controls
    assert longer["controls"] == "phase2.train.steps=400"
    longer["windows"]["static_control"]["hard"] = (np.asarray(grid["windows"]["static_control"]["hard"]) - 0.3).tolist()
    longer["windows"]["control"]["dense"] = (np.asarray(grid["windows"]["control"]["dense"]) - 0.3).tolist()
    dense_longer = dict(records[3], point="4x4-dense64-s0-phase2x2", variant="phase2x2", controls=longer["controls"],
                        windows={"control": {"base": records[3]["windows"]["control"]["base"],
                                             "dense": (np.asarray(records[3]["windows"]["control"]["dense"]) - 0.3).tolist()}})
    every = records + [router, longer, dense_longer]
    with_variants, without = frontiers(every, "4x4"), frontiers(records, "4x4")
    for name, pts in without.items():  # the grid's frontiers, point for point
        assert [(m, label) for m, _, label in with_variants[name]] == [(m, label) for m, _, label in pts]
        assert all(np.array_equal(a, b) for (_, a, _), (_, b, _) in zip(with_variants[name], pts))
    alike = frontiers(every, "4x4", longer["controls"])
    assert [label for _, _, label in alike["static_after"]] == ["static control 2/4", "dense control"]
    assert np.array_equal(alike["static_after"][1][1], np.asarray(longer["windows"]["control"]["dense"]))
    assert [(m, a.shape[0]) for m, a, _ in alike["dense_after"]] == [(1.0, 1), (0.8, 1)]
    assert [(m, a.shape[0]) for m, a, _ in alike["dense_before"]] == [(1.0, 1), (0.8, 3)]  # the grid's base LMs
    by = {(c["point"], c["when"], c["against"]): c for c in frontier_claims(every, "4x4", resamples=300)}
    ran = np.asarray(longer["windows"]["phase2"]["deployed"]).mean()
    own = np.asarray(longer["windows"]["static_control"]["hard"]).mean()
    assert by["4x4-full-keep500-phase2x2", "after", "static"]["estimate"] == pytest.approx(ran - own)
    assert by["4x4-full-keep500-phase2x2", "after", "static"]["controls"] == "phase2.train.steps=400"
    assert by["4x4-full-keep500-phase2x2", "before", "static"]["estimate"] == pytest.approx(
        by["4x4-full-keep500", "before", "static"]["estimate"])  # the same router before, the same frontier
    assert by["4x4-full-keep500-router32", "after", "static"]["variant"] == "router32"
    report = page.report(every, ["4x4"], None, None, resamples=100)
    assert list(report["frontiers_trained_otherwise"]["4x4"]) == ["phase2.train.steps=400"]
    drawn = page.figure(every, ["4x4"], tmp_path / "frontier.png")
    assert (tmp_path / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(drawn["4x4 before"]["routed variants"]) == [0.82, longer["macs"]["deployed"]]
    assert drawn["4x4 after"]["routed variants"] == [0.82]  # the longer one is not set against the grid's controls
    assert drawn["4x4 after"]["routed variant (phase2.train.steps=400)"] == [longer["macs"]["phase2_deployed"]]
    assert drawn["4x4 after"]["static frontier (phase2.train.steps=400)"] == [m for m, _, _ in alike["static_after"]]
    assert drawn["4x4 after"]["static frontier"] == [m for m, _, _ in without["static_after"]]
    dense_points = [p for p in study.variants() if p.kind == "dense"]
    assert [p.name for p in dense_points] == ["4x4-dense64-s0-phase2x2", "4x4-dense32-s0-phase2x2"]
    assert dense_points[0].overrides("selection")["phase2.train.steps"] == 400
