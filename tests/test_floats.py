"""The one comparison of a recomputed float with a committed one (lookahead.core.floats)."""

from __future__ import annotations

import math

from lookahead.core.floats import RELATIVE, close, mismatches


def test_a_cpus_last_bits_pass_and_a_real_change_does_not():
    committed = 5.772338899272581
    assert close(5.7723388992725955, committed)  # an AVX2 refit of an AVX-512 fit: 2.5e-15 relative
    assert close(committed * (1 + RELATIVE / 2), committed)
    assert not close(committed * (1 + 1e-6), committed) and not close(committed * (1 + 2 * RELATIVE), committed)
    assert close(1e-17, 0.0) and close(-3e-18, 1e-18)  # a value that should be 0 and is not, by a bit
    assert not close(1e-6, 0.0)
    assert close(math.nan, math.nan) and not close(math.nan, 1.0) and not close(1.0, math.nan)


def test_every_difference_is_named_by_its_key():
    committed = {"fits": {"a": {"overdispersion": 5.772338899272581, "df": None, "adjacent": [1.0, 2.0]}},
                 "label": "test:8x4:abc", "n": 3}
    recomputed = {"fits": {"a": {"overdispersion": 5.7723388992725955, "df": None, "adjacent": [1.0, 2.0]}},
                  "label": "test:8x4:abc", "n": 3}
    assert mismatches(recomputed, committed) == []
    recomputed["fits"]["a"]["overdispersion"] *= 1 + 1e-6
    recomputed["fits"]["a"]["adjacent"][1] = 2.5
    found = mismatches(recomputed, committed)
    assert [f.split(":")[0] for f in found] == ["fits.a.overdispersion", "fits.a.adjacent[1]"]
    assert "relative difference 1.0e-06 > 1e-09" in found[0]
    # anything but a float compares exactly: strings, integers, None, keys, lengths
    assert mismatches({**committed, "label": "test:8x4:abd"}, committed) == [
        "label: recomputed 'test:8x4:abd', committed 'test:8x4:abc'"]
    assert mismatches({**committed, "n": 4}, committed) == ["n: recomputed 4, committed 3"]
    assert mismatches({"x": None}, {"x": 0.0}) == ["x: recomputed None, committed 0.0"]
    assert mismatches({"x": 1, "y": 2.0}, {"x": 1}) == ["y: only recomputed"]
    assert mismatches({"x": [1.0]}, {"x": [1.0, 2.0]}) == ["x: 1 items recomputed, 2 committed"]
    assert mismatches({"x": True}, {"x": 1}) == ["x: recomputed True, committed 1"]
    assert mismatches(2, 2.0) == [] and mismatches(2, 2.5) != []  # JSON's 2.0 against a refit's int
