import numpy as np
import pytest
import torch
from conftest import conf, data_config

from tiecli import data
from tiecli.errors import TiecliError


def test_shakespeare_split_is_by_whole_plays_and_ignores_the_training_seed():
    docs = data.load_documents(data_config())
    assert len(docs) == 42
    texts = data.split_texts(docs, data_config())
    assert texts == data.split_texts(docs, data_config())  # deterministic
    held_out = [t for _, t in docs if t in texts["val"] or t in texts["test"]]
    assert held_out and all(t not in texts["train"] for t in held_out)
    total = sum(len(t) for _, t in docs)
    for split in ("val", "test"):
        assert 0.05 * total <= len(texts[split]) < 0.2 * total
    assert data.split_texts(docs, data_config(split_seed=1)) != texts


def test_block_split_of_one_file_is_disjoint_and_complete(tmp_path):
    lines = [f"line {i} of the notes\n" for i in range(5000)]
    (tmp_path / "notes.txt").write_text("".join(lines))
    cfg = data_config(name="textfile", path=str(tmp_path / "notes.txt"), split="block", n_blocks=50)
    texts = data.split_texts(data.load_documents(cfg), cfg)
    seen = [set(texts[s].splitlines()) for s in data.SPLITS]
    assert all(seen) and not (seen[0] & seen[1]) and not (seen[0] & seen[2]) and not (seen[1] & seen[2])
    assert set().union(*seen) == {line.rstrip("\n") for line in lines}


def test_textfile_accepts_folders_and_globs(tmp_path):
    for i in range(3):
        (tmp_path / f"part{i}.md").write_text(f"document {i}\n" * 50)
    (tmp_path / ".hidden").write_text("never read")
    by_folder = data.load_documents(data_config(name="textfile", path=str(tmp_path)))
    by_glob = data.load_documents(data_config(name="textfile", path=str(tmp_path / "*.md")))
    assert [t for _, t in by_folder] == [t for _, t in by_glob] and len(by_glob) == 3


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.mkdir(), "is a folder with no files"),
        (lambda p: p.write_bytes(b"caf\xe9 au lait"), "is not UTF-8 text (byte 0xe9 at offset 3)"),
        (lambda p: p.write_text(""), "holds no text"),
    ],
)
def test_bad_textfile_paths_give_clear_errors(tmp_path, setup, message):
    target = tmp_path / "input"
    setup(target)
    cfg = data_config(name="textfile", path=str(target), split="block")
    with pytest.raises(TiecliError) as e:
        data.split_texts(data.load_documents(cfg), cfg)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "text", ["one long line of words " * 5000, "a first long line " * 3000 + "\n" + "and a second " * 3000]
)
def test_text_too_short_to_split_is_a_clear_error(tmp_path, text):
    (tmp_path / "short.txt").write_text(text)
    cfg = data_config(name="textfile", path=str(tmp_path / "short.txt"), split="block")
    with pytest.raises(TiecliError, match=r"cuts into only [12] block\(s\) at line ends"):
        data.split_texts(data.load_documents(cfg), cfg)


def test_three_blocks_give_three_non_empty_splits(tmp_path):
    (tmp_path / "three.txt").write_text("".join(f"line {i}\n" for i in range(3)))
    cfg = data_config(
        name="textfile",
        path=str(tmp_path / "three.txt"),
        split="block",
        n_blocks=3,
        test_fraction=0.6,
        val_fraction=0.3,
    )
    texts = data.split_texts(data.load_documents(cfg), cfg)
    assert all(texts[s] for s in data.SPLITS)


def test_glob_matching_nothing_is_an_error(tmp_path):
    with pytest.raises(TiecliError, match="matches no files"):
        data.load_documents(data_config(name="textfile", path=str(tmp_path / "*.txt")))


def test_corpus_is_cached_and_consistent(monkeypatch):
    corpus = data.load_corpus(data_config(), conf("tokenizer=bytes").tokenizer)
    assert corpus.encoding.n_vocab == 256
    assert corpus.counts.sum() == len(corpus.tokens["train"])
    assert (corpus.token_bytes == 1).all()  # one byte per token
    monkeypatch.setattr(data, "_write_tokens", lambda *a: pytest.fail("tokenized again despite the cache"))
    again = data.load_corpus(data_config(), conf("tokenizer=bytes").tokenizer)
    assert again.key == corpus.key and np.array_equal(again.tokens["val"], corpus.tokens["val"])


def test_frequency_buckets_by_token_mass():
    counts = np.array([50, 0, 30, 10, 5, 5])  # 100 tokens
    assert data.frequency_buckets(counts, [0.5, 0.9]).tolist() == [0, 2, 1, 1, 2, 2]
    # token 0 alone is 50%, then 2 and 3 bring it to 90%; the rest, and the unseen token 1, are rare


def test_eval_windows_cover_every_target_once():
    for n, t in [(100, 8), (97, 8), (9, 8), (10, 8)]:
        covered = [s + 1 + i for s, length in data.eval_windows(n, t) for i in range(length)]
        assert covered == list(range(1, n))
    limited = data.eval_windows(1000, 8, limit=5)
    assert len(limited) == 5 and limited[0][0] == 0 and limited == data.eval_windows(1000, 8, limit=5)


def test_batches_are_next_token_pairs_and_reproducible():
    tokens = np.arange(1000, dtype=np.uint16)
    x, y = data.get_batch(tokens, 4, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 16) and torch.equal(y, x + 1)
    x2, _ = data.get_batch(tokens, 4, 16, torch.Generator().manual_seed(0))
    assert torch.equal(x, x2)
