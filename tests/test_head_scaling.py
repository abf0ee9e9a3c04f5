"""The head-scaling study's script (scripts/head_scaling.py): its family of shapes and
the committed figures it collects, against the metrics they come from."""

from __future__ import annotations


import pytest

from tests import consistency


@pytest.fixture(scope="module")
def study():
    return consistency.head_scaling_script()


def test_the_family_changes_one_thing_at_a_time_from_16_to_256_heads(study):
    points = study.POINTS
    assert points[0] == study.DEFAULT and (points[0].layers, points[0].heads) == (4, 4)
    assert [p.total for p in points] == [16, 32, 64, 128, 256]
    for a, b in zip(points, points[1:]):
        assert (a.layers != b.layers) + (a.heads != b.heads) == 1, (a.name, b.name)
    assert points[2].overrides() == {"base.arch.n_layers": 4, "base.arch.n_heads": 16, "oracle.per_round": 1,
                                     "oracle.candidates": 4, "static_baselines.candidates": 4}
    assert points[0].oracle == "exact greedy" and all(p.oracle.startswith("lazy greedy") for p in points[1:])
    # the greedy static mask: exact up to 32 heads, the lazy search from 64 (the "64+ heads")
    assert [p.static_mask.split(" (")[0] for p in points] == ["exact greedy"] * 2 + ["lazy greedy"] * 3


def test_the_default_point_holds_the_default_runs_committed_claims():
    with consistency.committed() as root:  # as committed: a rerun rewrites the working tree's metrics
        consistency.head_scaling_default_point_is_the_default_run(root)


def test_the_pages_tables_are_a_fresh_render_of_the_committed_study():
    with consistency.committed() as root:
        consistency.head_scaling_page_is_a_fresh_render(root)
