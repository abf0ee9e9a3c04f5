"""Finding WordNet 3.0 offline (docs/install.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lookahead.semantics import wordnet_source as wordnet
from lookahead.semantics.wordnet_source import LEXNAMES, WordNetMissing, assemble, open_wordnet, synset_texts
from tests.conftest import REPO


def test_lexnames_is_the_standard_45_line_list():
    assert len(LEXNAMES) == 45
    assert LEXNAMES[0] == ("adj.all", 3) and LEXNAMES[3] == ("noun.Tops", 1) and LEXNAMES[44] == ("adj.ppl", 3)
    assert {pos for _, pos in LEXNAMES} == {1, 2, 3, 4}


def test_reader_matches_known_wordnet_30_facts(wn):
    assert wn.get_version() == "3.0"
    dog, cat = wn.synset("dog.n.01"), wn.synset("cat.n.01")
    assert dog.lexname() == "noun.animal"
    assert dog.wup_similarity(cat) == pytest.approx(0.8571428571428571)
    walk = list(wn.all_synsets())  # nltk's walk of the data files
    assert len(walk) == 117659
    # the table the stages read (from the per-user cache once it is filled): nltk's values, in its order
    assert synset_texts(wn) == [(s.name(), s.lemma_names(), s.definition(), s.examples()) for s in walk]


def test_lemma_index_is_parsed_once_then_read_back_from_the_cache(wn, tmp_path, monkeypatch):
    monkeypatch.setenv("LOOKAHEAD_CACHE_DIR", str(tmp_path))
    parsed = open_wordnet(root=REPO)  # an empty cache: nltk parses the index files, the cache keeps the result
    (cached,) = tmp_path.glob("wordnet/*/lemma_pos_offset_map.pickle")
    assert dict(parsed._lemma_pos_offset_map) == dict(wn._lemma_pos_offset_map)
    stamp = cached.stat().st_mtime_ns
    again = open_wordnet(root=REPO)  # read back, not parsed or written again
    assert cached.stat().st_mtime_ns == stamp
    assert dict(again._lemma_pos_offset_map) == dict(parsed._lemma_pos_offset_map)
    assert [lemma.name() for lemma in again.lemmas("dog")] == [lemma.name() for lemma in wn.lemmas("dog")]
    cached.write_bytes(b"damaged")  # a damaged cache is parsed again and rewritten
    assert dict(open_wordnet(root=REPO)._lemma_pos_offset_map) == dict(parsed._lemma_pos_offset_map)
    assert cached.stat().st_size > 1000


def test_explicit_path_is_assembled_into_a_project_local_data_dir(wn, tmp_path):
    # wordnet.path: a plain directory of WordNet files (here, the ones nltk already reads).
    source = tmp_path / "wn-files"
    source.mkdir()
    for name in wordnet.REQUIRED_FILES:
        (source / name).write_bytes(Path(wn.root.path, name).read_bytes())
    reader = open_wordnet(path=source, root=tmp_path / "project")
    local = tmp_path / "project" / wordnet.LOCAL_DATA_DIR / "corpora" / "wordnet"
    assert (local / "lexnames").read_text().count("\n") == 45
    assert reader.synset("dog.n.01").definition() == wn.synset("dog.n.01").definition()


def test_missing_wordnet_names_both_install_routes(tmp_path, monkeypatch):
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "empty")])
    monkeypatch.setattr(wordnet, "debian_wordnet_dir", lambda: None)
    with pytest.raises(WordNetMissing) as info:
        open_wordnet(root=tmp_path)
    message = str(info.value)
    assert "apt-get install wordnet-base wordnet-sense-index" in message
    assert "nltk.download('wordnet')" in message


def test_bad_explicit_path_is_a_clear_error(tmp_path):
    with pytest.raises(WordNetMissing, match="is not a WordNet 3.0 directory"):
        assemble(tmp_path, tmp_path / "data")
