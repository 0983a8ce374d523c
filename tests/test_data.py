# pytest tests/test_data.py   (CPU; the 20 MB streaming test, marked slow, takes 10-20 s; the rest ~30 s)
import json
import lzma
import os
import random
import sys

import numpy as np
import pytest
from conftest import conf, data_config

from tiecli.data import corpus, tokenizer
from tiecli.data import tokens as data
from tiecli.errors import ConfigError, TiecliError


def documents(cfg):
    """The corpus's documents, each whole, in memory: what the streaming path must never need."""
    return [text for _, text in corpus.load_documents(cfg)]


def split_texts(cfg):
    """Each split's whole text, built in memory from the plan: the one-shot reference."""
    plan = data.split_plan(corpus.source(cfg), cfg)
    if cfg.split == "document":
        units, joiner = documents(cfg), "\n\n"
    else:
        text = "\n\n".join(documents(cfg))
        units, joiner = [text[a:b] for a, b in zip([0, *plan.ends[:-1]], plan.ends)], ""
    return {s: joiner.join(u for u, o in zip(units, plan.owners) if o == i) for i, s in enumerate(data.SPLITS)}


def shakespeare_lines():
    with lzma.open(corpus.SHAKESPEARE, "rt", encoding="utf-8") as f:
        return [line for d in map(json.loads, f) for line in d["text"].splitlines(keepends=True)]


# Text that tokenizers split in unusual ways, put at the edges of documents and in their middle.
ODD = [
    "  leading spaces",
    "trailing spaces   ",
    "\n\nblank lines first",
    "CRLF line\r\nanother\r\n",
    "tabs\tand\u00a0no-break\u2003spaces \n",
    "<|endoftext|> is plain text here",
    "don't I'm we'll O'Neill 3.14159 1,000,000",
    "café naïve Ωμέγα 🙂👍🏽 🇫🇷",
    "中文文本测试。你好世界" * 300,  # a long run with no space and no newline
    "word " * 3000,  # a long line: only spaces between letters to cut at
    "x\n\ny\n \nz\n\t\n",
]


def write_corpus(folder, n_bytes, seed=0):
    """Text files of Shakespeare's lines in random order, with ODD pieces at random places: n_bytes in all."""
    rng, lines = random.Random(seed), shakespeare_lines()
    folder.mkdir()
    written, i = 0, 0
    while written < n_bytes:
        body = rng.choices(lines, k=rng.randint(20, 2000))
        for _ in range(rng.randint(0, 3)):
            body.insert(rng.randint(0, len(body)), rng.choice(ODD))
        text = "".join(body)
        (folder / f"doc{i:05d}.txt").write_text(text, encoding="utf-8")
        written, i = written + len(text.encode()), i + 1
    return folder


# --- the split -----------------------------------------------------------------------------


@pytest.mark.slow
def test_shakespeare_split_is_by_whole_plays_and_ignores_the_training_seed():
    cfg = data_config()
    docs = documents(cfg)
    assert len(docs) == 42
    plan = data.split_plan(corpus.source(cfg), cfg)
    assert np.array_equal(plan.owners, data.split_plan(corpus.source(cfg), cfg).owners)  # deterministic
    assert plan.sizes.tolist() == [len(d.encode()) for d in docs]
    total = plan.sizes.sum()
    for i in (1, 2):
        assert 0.05 * total <= plan.sizes[plan.owners == i].sum() < 0.2 * total
    assert not np.array_equal(data.split_plan(corpus.source(cfg), data_config(split_seed=1)).owners, plan.owners)


@pytest.mark.parametrize("n", [3, 4, 10, 1000])
def test_held_out_units_are_drawn_as_random_shuffle_orders_them(n):
    for seed in (0, 1234, 2**62):
        order = list(range(n))
        random.Random(seed).shuffle(order)
        assert list(data._shuffled_from_the_end(n, seed)) == order[::-1]


def test_block_split_of_one_file_is_disjoint_and_complete(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "READ_BYTES", 1000)  # block ends fall inside pieces and between them
    lines = [f"line {i} of the notes\n" for i in range(5000)]
    (tmp_path / "notes.txt").write_text("".join(lines))
    cfg = data_config(name="textfile", path=str(tmp_path / "notes.txt"), split="block", n_blocks=50)
    plan = data.split_plan(corpus.source(cfg), cfg)
    text = "".join(lines)
    assert 45 <= len(plan.ends) <= 50 and plan.ends[-1] == len(text)
    assert all(text[e - 1] == "\n" for e in plan.ends)  # every block ends at a line end
    texts = split_texts(cfg)
    seen = [set(texts[s].splitlines()) for s in data.SPLITS]
    assert all(seen) and not (seen[0] & seen[1]) and not (seen[0] & seen[2]) and not (seen[1] & seen[2])
    assert set().union(*seen) == {line.rstrip("\n") for line in lines}


def test_textfile_accepts_folders_and_globs(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    for i in range(3):
        (folder / f"part{i}.md").write_text(f"document {i}\n" * 50)
    (folder / ".hidden").write_text("never read")
    by_folder = documents(data_config(name="textfile", path=str(folder)))
    by_glob = documents(data_config(name="textfile", path=str(folder / "*.md")))
    assert by_folder == by_glob and len(by_glob) == 3


@pytest.mark.slow
@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.mkdir(), "is a folder with no files"),
        (lambda p: p.write_bytes(b"caf\xe9 au lait"), "is not UTF-8 text (byte 0xe9 at offset 3)"),
        (lambda p: p.write_bytes(b"a" * 5000 + b"\xe2\x82"), "is not UTF-8 text (byte 0xe2 at offset 5000)"),
        (lambda p: p.write_text(""), "holds no text"),
        (lambda p: p.write_text(" \n\t\n" * 100), "holds only whitespace"),
    ],
)
def test_bad_textfile_paths_give_clear_errors(tmp_path, monkeypatch, setup, message):
    monkeypatch.setattr(corpus, "READ_BYTES", 4096)  # the cut character straddles two reads
    target = tmp_path / "input"
    setup(target)
    cfg = data_config(name="textfile", path=str(target), split="block")
    with pytest.raises(TiecliError) as e:
        data.split_plan(corpus.source(cfg), cfg)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "text", ["one long line of words " * 5000, "a first long line " * 3000 + "\n" + "and a second " * 3000]
)
def test_text_too_short_to_split_is_a_clear_error(tmp_path, text):
    (tmp_path / "short.txt").write_text(text)
    cfg = data_config(name="textfile", path=str(tmp_path / "short.txt"), split="block")
    with pytest.raises(TiecliError, match=r"cuts into only [12] block\(s\) at line ends"):
        data.split_plan(corpus.source(cfg), cfg)


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
    texts = split_texts(cfg)
    assert all(texts[s] for s in data.SPLITS)


def test_glob_matching_nothing_is_an_error(tmp_path):
    with pytest.raises(TiecliError, match="matches no files"):
        corpus.source(data_config(name="textfile", path=str(tmp_path / "*.rst")))


# --- streaming tokenization equals one-shot ------------------------------------------------


@pytest.fixture(scope="module")
def bpe_300(tmp_path_factory):
    return tokenizer.bpe("".join(shakespeare_lines()[:20000]), 300, tmp_path_factory.mktemp("bpe"))


@pytest.mark.slow
@pytest.mark.parametrize("split", ["document", "block"])
def test_small_chunks_cut_only_where_no_token_crosses(tmp_path, monkeypatch, bpe_300, split):
    # ~200 chunks in all, each cut at a _SAFE_CUT point: every cut must leave the ids unchanged.
    monkeypatch.setattr(data, "CHUNK_CHARS", 2000)
    monkeypatch.setattr(corpus, "READ_BYTES", 3000)
    cfg = data_config(name="textfile", path=str(write_corpus(tmp_path / "c", 400_000)), split=split, n_blocks=20)
    texts = split_texts(cfg)
    for enc in (tokenizer.gpt2(), bpe_300, tokenizer.byte_level()):
        plan = data.split_plan(corpus.source(cfg), cfg)
        chunks = list(
            data._split_chunks(data._stream(corpus.source(cfg), cfg, plan.ends), plan.owners, data._joiner(cfg))
        )
        assert len(chunks) > 150
        for i, s in enumerate(data.SPLITS):
            assert "".join(t for j, t in chunks if j == i) == texts[s]
            streamed = [ids for j, ids in tokenizer.encode_stream(enc, iter(chunks), np.uint32, 1) if j == i]
            assert np.array_equal(np.concatenate(streamed), enc.encode_ordinary(texts[s])), (enc.name, s)


@pytest.mark.slow  # ~10 s idle, 20 s on a busy 2-core machine
def test_streaming_20mb_corpus_gives_the_one_shot_encoders_tokens(tmp_path):
    cfg = data_config(name="textfile", path=str(write_corpus(tmp_path / "corpus", 20_000_000)), num_proc=2)
    tok = conf("tokenizer=gpt2").tokenizer
    corpus = data.load_corpus(cfg, tok, tmp_path / "cache")
    enc = tokenizer.gpt2()
    texts = split_texts(cfg)
    assert len(texts["train"]) > 15_000_000
    for s in data.SPLITS:
        assert np.array_equal(corpus.tokens[s], enc.encode_ordinary(texts[s])), s
    assert corpus.tokens["train"].dtype == np.uint16
    assert np.array_equal(corpus.counts, np.bincount(corpus.tokens["train"], minlength=enc.n_vocab))


# --- the cache -----------------------------------------------------------------------------


def test_corpus_is_cached_and_consistent(monkeypatch):
    corpus = data.load_corpus(data_config(), conf("tokenizer=bytes").tokenizer)
    assert corpus.encoding.n_vocab == 256
    assert corpus.counts.sum() == len(corpus.tokens["train"])
    assert (corpus.token_bytes == 1).all()  # one byte per token
    monkeypatch.setattr(data, "_write_tokens", lambda *a: pytest.fail("tokenized again despite the cache"))
    monkeypatch.setattr(data, "split_plan", lambda *a: pytest.fail("measured the corpus again despite the cache"))
    again = data.load_corpus(data_config(num_proc=1), conf("tokenizer=bytes").tokenizer)  # num_proc: same tokens
    assert again.key == corpus.key and np.array_equal(again.tokens["val"], corpus.tokens["val"])


@pytest.mark.slow
def test_cache_key_changes_with_any_byte_of_the_data(tmp_path):
    folder = write_corpus(tmp_path / "c", 300_000)
    cfg, tok = data_config(name="textfile", path=str(folder)), conf("tokenizer=bytes").tokenizer
    key = data.load_corpus(cfg, tok, tmp_path / "cache").key
    victim = sorted(folder.iterdir())[1]
    stat = victim.stat()
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 1  # same size, same modification time: only the content differs
    victim.write_bytes(bytes(raw))
    os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert data.load_corpus(cfg, tok, tmp_path / "cache").key != key
    assert data.load_corpus(
        data_config(name="textfile", path=str(folder), split_seed=7), tok, tmp_path / "cache"
    ).key not in (key,)


@pytest.mark.slow
def test_bpe_trains_on_a_bounded_sample_spread_over_the_training_split(tmp_path):
    cfg = data_config()
    src = corpus.source(cfg)
    plan = data.split_plan(src, cfg)
    whole = data._bpe_sample(src, cfg, lambda: plan, None)
    assert len(whole.encode()) == plan.sizes[plan.owners == 0].sum() + 2 * (np.sum(plan.owners == 0) - 1)
    sample = data._bpe_sample(src, cfg, lambda: plan, 200_000)
    assert 200_000 <= len(sample.encode()) < 200_100
    docs, train = documents(cfg), np.flatnonzero(plan.owners == 0)
    stride = -(-plan.sizes[train].sum() // 200_000)  # every k-th training document, not the first 200 KB
    assert (
        sample.startswith(docs[train[0]] + "\n\n" + docs[train[stride]][:1000]) and docs[train[1]][:1000] not in sample
    )
    # train_bytes is part of the tokenizer's cache key: another bound trains another tokenizer
    small = data_config(name="textfile", path=str(write_corpus(tmp_path / "c", 300_000)))
    tok = conf("tokenizer=bpe", "tokenizer.vocab_size=300", "tokenizer.train_bytes=50000").tokenizer
    first = data.load_corpus(small, tok, tmp_path / "cache")
    tok = conf("tokenizer=bpe", "tokenizer.vocab_size=300", "tokenizer.train_bytes=60000").tokenizer
    second = data.load_corpus(small, tok, tmp_path / "cache")
    assert len(list((tmp_path / "cache" / "bpe").glob("*.tiktoken"))) == 2
    assert first.key != second.key


# --- data=hf -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_docs():
    rng, lines = random.Random(1), shakespeare_lines()
    return ["".join(rng.choices(lines, k=rng.randint(50, 400))) + rng.choice(ODD[:8]) for _ in range(60)]


def hf(**changes):
    return data_config(
        **{"name": "hf", "path": None, "hf_split": "train", "text_field": "text", "num_proc": 1, **changes}
    )


@pytest.mark.slow
def test_hf_parquet_jsonl_and_saved_dataset_give_the_textfile_tokens(tmp_path, hf_docs):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    datasets.disable_progress_bars()
    for i, doc in enumerate(hf_docs):
        (tmp_path / "txt").mkdir(exist_ok=True)
        (tmp_path / "txt" / f"{i:03d}.txt").write_text(doc)
    tok = conf("tokenizer=gpt2").tokenizer
    expected = data.load_corpus(data_config(name="textfile", path=str(tmp_path / "txt")), tok, tmp_path / "cache")

    (tmp_path / "pq").mkdir()
    for part in range(3):  # three files, with a null row and another column, read in name order
        rows = hf_docs[part * 20 : (part + 1) * 20]
        table = pa.table({"id": list(range(len(rows) + 1)), "body": [*rows, None]})
        pq.write_table(table, tmp_path / "pq" / f"part{part}.parquet")
    (tmp_path / "pq" / "README.md").write_text("a note beside the data")
    with lzma.open(tmp_path / "docs.jsonl.xz", "wt") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in hf_docs)
    datasets.Dataset.from_dict({"text": hf_docs}).save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"text": hf_docs}), "test": datasets.Dataset.from_dict({"text": ["x"]})}
    ).save_to_disk(str(tmp_path / "saved_dict"))
    for cfg in (
        hf(files=str(tmp_path / "pq"), text_field="body"),
        hf(files=str(tmp_path / "docs.jsonl.xz")),
        hf(files=str(tmp_path / "saved")),
        hf(files=str(tmp_path / "saved_dict")),
    ):
        corpus = data.load_corpus(cfg, tok, tmp_path / "cache")
        assert all(np.array_equal(corpus.tokens[s], expected.tokens[s]) for s in data.SPLITS), cfg.files


@pytest.mark.slow
def test_hf_bad_column_and_split_are_config_errors(tmp_path, hf_docs):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": hf_docs, "n": list(range(len(hf_docs)))}), tmp_path / "a.parquet")
    for field, message in (("text", "is not a column of"), ("n", "holds int64 values")):
        with pytest.raises(ConfigError, match=message) as e:
            corpus.source(hf(files=str(tmp_path / "a.parquet"), text_field=field))
        assert "body, n" in str(e.value) or "int64" in str(e.value)


def test_hf_without_datasets_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets now raises ImportError
    with pytest.raises(TiecliError, match=r"pip install 'tiecli\[hf\]'"):
        corpus.source(hf(files="tiny.txt"))  # conftest puts it in every test's folder


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides, code, message",
    [
        (["data.files=missing.parquet"], 1, "data.files 'missing.parquet' does not exist"),
        (["data.files=a.parquet", "data.text_field=content"], 2, "data.text_field='content' is not a column"),
        (["data.files=empty.parquet"], 1, "is an empty parquet file (0 rows)"),
        (["data.files=zero.parquet"], 1, "is not a parquet file"),
        (["data.files=notes.csv"], 2, "holds no file data=hf reads"),
        ([], 2, "give exactly one"),
        (["data.files=a.parquet", "data.hub=roneneldan/TinyStories"], 2, "give exactly one"),
        (["data.hub=roneneldan/TinyStories"], 1, "offline"),
    ],
)
def test_bad_hf_input_is_one_line_and_the_right_exit_code(isolated, monkeypatch, hf_docs, overrides, code, message):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    from helpers import one_line_error, tiecli

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # as HF_DATASETS_OFFLINE=1 does
    pq.write_table(pa.table({"text": hf_docs}), "a.parquet")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), "empty.parquet")
    open("zero.parquet", "wb").close()
    open("notes.csv", "w").write("text\nhello\n")
    one_line_error(tiecli("train", "data=hf", "tokenizer=bytes", *overrides), code, message)
    assert not list(isolated.glob("runs/*/summary.json"))


def test_frequency_buckets_by_token_mass():
    counts = np.array([50, 0, 30, 10, 5, 5])  # 100 tokens
    assert data.frequency_buckets(counts, [0.5, 0.9]).tolist() == [0, 2, 1, 1, 2, 2]
    # token 0 alone is 50%, then 2 and 3 bring it to 90%; the rest, and the unseen token 1, are rare
