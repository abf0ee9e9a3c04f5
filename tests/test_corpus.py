"""Corpus sources, the hash split, and bad input."""

from __future__ import annotations

import itertools

import pytest

from lookahead.pipeline.corpus import CorpusConfig, CorpusError, build_corpus, split_of, wordnet_lines


def test_split_is_a_function_of_the_line_alone():
    lines = [f"document number {i}" for i in range(2000)]
    first = {line: split_of(line, 0.1, "salt") for line in lines}
    shuffled = {line: split_of(line, 0.1, "salt") for line in reversed(lines)}
    assert first == shuffled
    val = sum(s == "val" for s in first.values())
    assert 140 <= val <= 260  # 10 % of 2000, binomial sd ~13
    other_salt = {line: split_of(line, 0.1, "pepper") for line in lines}
    assert other_salt != first


def test_build_corpus_from_files(tmp_path):
    text = "\n".join(f"line {i} with some words" for i in range(300)) + "\n\n   \n"
    src = tmp_path / "a.txt"
    src.write_text(text, encoding="utf-8")
    cfg = CorpusConfig(source="files", files=[str(src)], val_fraction=0.2)
    stats = build_corpus(cfg, tmp_path / "out")
    train = (tmp_path / "out" / "train.txt").read_text(encoding="utf-8").splitlines()
    val = (tmp_path / "out" / "val.txt").read_text(encoding="utf-8").splitlines()
    assert sorted(train + val) == sorted(f"line {i} with some words" for i in range(300))
    assert stats["train"]["lines"] == len(train) and stats["val"]["lines"] == len(val)
    assert stats["val"]["words"] == 5 * len(val)
    assert stats["train"]["chars"] == sum(map(len, train))
    # deterministic: a second build gives the same files
    build_corpus(cfg, tmp_path / "again")
    assert (tmp_path / "again" / "val.txt").read_bytes() == (tmp_path / "out" / "val.txt").read_bytes()


def test_max_lines_keeps_the_first_documents(tmp_path):
    src = tmp_path / "a.txt"
    src.write_text("\n".join(f"doc {i}" for i in range(100)), encoding="utf-8")
    stats = build_corpus(CorpusConfig(source="files", files=[str(src)], max_lines=40, val_fraction=0.3), tmp_path / "o")
    assert stats["train"]["lines"] + stats["val"]["lines"] == 40


@pytest.mark.parametrize(
    "content, fragment",
    [(b"", "is empty"), (b"\n  \n", "is empty"), (b"good line\nbad \xff\xfe byte\n", "not valid UTF-8: byte 14 (line 2)")],
)
def test_bad_files_are_clear_errors_and_leave_nothing(tmp_path, content, fragment):
    src = tmp_path / "bad.txt"
    src.write_bytes(content)
    out = tmp_path / "out"
    with pytest.raises(CorpusError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        build_corpus(CorpusConfig(source="files", files=[str(src)]), out)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [src]  # no temporary directory left behind either


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(CorpusError, match="not found"):
        build_corpus(CorpusConfig(source="files", files=[str(tmp_path / "nope.txt")]), tmp_path / "out")


def test_existing_output_survives_a_failed_build(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.txt").write_text("old\n")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff")
    with pytest.raises(CorpusError):
        build_corpus(CorpusConfig(source="files", files=[str(bad)]), out)
    assert (out / "train.txt").read_text() == "old\n"


def test_wordnet_lines_hold_lemmas_gloss_and_examples(wn):
    synsets = list(itertools.islice(wn.all_synsets(), 200))
    lines = list(itertools.islice(wordnet_lines(wn), 200))
    for synset, line in zip(synsets, lines):
        lemmas, _, rest = line.partition(": ")
        assert lemmas == ", ".join(n.replace("_", " ") for n in synset.lemma_names())
        assert rest.startswith(synset.definition().strip())
        for example in synset.examples():
            assert example.strip() in rest
