"""The wordnet stage's library: exact nltk Wu-Palmer / path similarity, fast; token matching."""

from __future__ import annotations

import random

import numpy as np
import pytest

from lookahead.pipeline.wordnet import WordNetStageError, draw_anchors, draw_pairs
from lookahead.lm.tokens import encode_each
from lookahead.semantics.wordnet import leading_space, match_tokens, path_similarity_pairs, wup_matrix


def nltk_value(v) -> np.float32:
    return np.float32(0.0 if v is None else v)


@pytest.fixture(scope="module")
def mixed_synsets(wn):
    """Synsets of every part of speech, plus ones that exercise nltk's corner cases."""
    rng = random.Random(7)
    by_pos = {}
    for s in wn.all_synsets():
        by_pos.setdefault(s.pos(), []).append(s)
    picked = [s for pos in "nvasr" for s in rng.sample(by_pos[pos], 28)]
    # roots and shallow nodes (depth-0 ties with the simulated root), instance hypernyms,
    # synsets whose ancestor has a larger min depth (nltk's diagonal below 1), repeats
    corner = ["entity.n.01", "physical_entity.n.01", "change.v.01", "be.v.01", "paris.n.01", "einstein.n.01",
              "chef.n.01", "fireman.n.01", "dog.n.01", "cat.n.01", "good.a.01", "quickly.r.01"]
    picked += [wn.synset(name) for name in corner] + picked[:3]
    return picked


def test_wup_matrix_equals_nltk_on_over_20000_pairs_of_all_parts_of_speech(mixed_synsets):
    matrix = wup_matrix(mixed_synsets, chunk_rows=16)
    n = len(mixed_synsets)
    assert n * n >= 20_000 and matrix.dtype == np.float32
    expected = np.array([[nltk_value(a.wup_similarity(b)) for b in mixed_synsets] for a in mixed_synsets])
    mismatches = np.argwhere(matrix != expected)
    assert len(mismatches) == 0, [(str(mixed_synsets[i]), str(mixed_synsets[j]), expected[i, j], matrix[i, j]) for i, j in mismatches[:5]]
    # nltk's quirks are really exercised: an asymmetric pair and a diagonal entry below 1
    assert (matrix != matrix.T).any()
    assert {mixed_synsets[i].pos() for i in range(n)} == set("nvasr")


def test_diagonal_can_fall_below_one_exactly_as_in_nltk(wn):
    # an ancestor with a larger min depth than the synset itself becomes nltk's subsumer
    candidates = [s for s in list(wn.all_synsets("n"))[:4000] if s.wup_similarity(s) != 1.0][:3]
    assert candidates, "expected nltk use_min_depth quirk on some noun"
    matrix = wup_matrix(candidates)
    assert [matrix[i, i] for i in range(len(candidates))] == [np.float32(s.wup_similarity(s)) for s in candidates]


def test_path_similarity_pairs_equal_nltk(wn, mixed_synsets):
    rng = random.Random(3)
    pairs = [(rng.choice(mixed_synsets), rng.choice(mixed_synsets)) for _ in range(3000)]
    pairs += [(s, s) for s in mixed_synsets[:5]]
    got = path_similarity_pairs(pairs)
    expected = np.array([nltk_value(a.path_similarity(b)) for a, b in pairs])
    assert np.array_equal(got, expected)


def test_empty_input():
    assert wup_matrix([]).shape == (0, 0)
    assert path_similarity_pairs([]).shape == (0,)


def test_matching_single_tokens_with_the_leading_space_convention(wn, tiny_tokenizer):
    from transformers import AutoTokenizer  # noqa: F401  (tiny_tokenizer is an AutoTokenizer)

    assert leading_space(tiny_tokenizer) in ("", " ")
    matched = match_tokens(wn, tiny_tokenizer)
    ids = [m["token_id"] for m in matched]
    assert len(ids) == len(set(ids)) > 0
    prefix = leading_space(tiny_tokenizer)
    for m in matched:
        assert tiny_tokenizer.encode(prefix + m["lemma"], add_special_tokens=False) == [m["token_id"]]
        assert len(m["gloss"]) > 10
        assert wn.synset(m["synset"]).pos() == m["pos"]
        assert m["lemma"].replace(" ", "_") in wn.synset(m["synset"]).lemma_names()


def test_encode_each_gives_the_tokenizers_own_ids(wn, tiny_tokenizer):
    """The backend's batch call against the tokenizer's own call, on every 40th WordNet lemma as
    match_tokens encodes them (multi-word, hyphens, digits) and texts with a special token; and
    the tokenizer's own call where its backend would pad (which the call turns off)."""
    import copy

    texts = [" " + name.replace("_", " ") for name in sorted(wn.all_lemma_names())[::40]]
    texts += ["", f"{tiny_tokenizer.eos_token} alpha", "gamma\tdelta\n"]
    expected = tiny_tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert len(texts) > 3000 and encode_each(tiny_tokenizer, texts) == expected
    padded = copy.deepcopy(tiny_tokenizer)
    padded.backend_tokenizer.enable_padding(length=64, pad_id=0)
    assert len(padded.backend_tokenizer.encode("alpha").ids) == 64
    assert encode_each(padded, texts) == expected


def test_too_many_anchors_gives_both_numbers():
    with pytest.raises(WordNetStageError, match=r"n_anchors is 50 but the tokenizer matches only 20"):
        draw_anchors(20, 50, seed=0)


def test_draws_are_seeded_and_distinct():
    a = draw_anchors(1000, 100, seed=1)
    assert np.array_equal(a, draw_anchors(1000, 100, seed=1)) and len(set(a)) == 100
    assert not np.array_equal(a, draw_anchors(1000, 100, seed=2))
    pairs = draw_pairs(50, 300, seed=0)
    assert pairs.shape == (300, 2) and (pairs[:, 0] < pairs[:, 1]).all()
    assert len({tuple(p) for p in pairs}) == 300
    assert draw_pairs(4, 100, seed=0).shape == (6, 2)  # capped at all pairs


def test_a_tokenizer_that_matches_nothing_is_a_clear_error(wn, tmp_path):
    from lookahead.pipeline.wordnet import WordNetConfig, build_wordnet

    class NoMatch:
        def encode(self, text, add_special_tokens=False):
            return [1, 2]

        def __call__(self, texts, add_special_tokens=False):
            return {"input_ids": [[1, 2] for _ in texts]}

    with pytest.raises(WordNetStageError, match="no WordNet lemma as a single token"):
        build_wordnet(WordNetConfig(n_anchors=2), NoMatch(), tmp_path / "out")
    assert not (tmp_path / "out").exists()
