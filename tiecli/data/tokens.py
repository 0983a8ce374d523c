# Used by `tiecli train` and `tiecli eval`: corpus -> deterministic split -> cached token arrays.
"""The data pipeline (its sources are in corpus.py, its batches in batches.py).

A corpus is a sequence of documents: the bundled Shakespeare, the user's text files (data=textfile),
or a text column read with Hugging Face datasets (data=hf: parquet, json/jsonl or text files, a saved
dataset folder, a Hub dataset). It is split into train/val/test by whole documents or by contiguous
blocks, so held-out text is never trained on; the split depends only on the data settings, never on
the training seed.

Nothing holds the whole corpus. It is read as a stream of text pieces, several times: to hash its
files (the cache key), to measure its units (documents or blocks) and choose the held-out ones, to
draw the BPE training sample when that tokenizer is not cached yet, and to tokenize. Tokenizing cuts
each split's text into ~1 MB chunks at points no token crosses, encodes them in a pool of
`data.num_proc` processes and appends the ids to one flat file per split, read back as a numpy memmap.
A second run with the same data and tokenizer only hashes the files, then reads the cached arrays.
"""

import contextlib
import functools
import hashlib
import json
import os
import random
import re
import shutil
import sys
import tempfile
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tiktoken

from tiecli.config.schema import DataConfig, TokenizerConfig
from tiecli.data import tokenizer
from tiecli.data.corpus import READ_BYTES, Source, cache_dir, cannot_read, source
from tiecli.errors import TiecliError

SPLITS = ("train", "val", "test")
BUCKETS = ("frequent", "mid", "rare")
TOKENS_FORMAT = 2  # part of the cache key: bump when the split or the token files change, and old entries are rebuilt
CHUNK_CHARS = 1 << 20  # text per tokenizer task: ~0.2 s of work, so the pool's cost per task is small

# A point no token crosses in any of tiecli's split patterns (GPT-2's, rustbpe's and the bytes one):
# just after a newline between two non-space characters, or just before a space between two ASCII
# letters. Text on either side splits into the pieces the whole text would, so encoding text cut
# there, piece by piece, gives exactly the ids of the whole. (Python's \s holds every character that
# the tokenizers' regex engine counts as a space, and a few more: the cuts err on the safe side.)
_SAFE_CUT = re.compile(r"(?<=\S)\n(?=\S)|(?<=[A-Za-z])(?= [A-Za-z])")


def num_proc(data: DataConfig) -> int:
    """Tokenizer processes: data.num_proc, else every core this process may run on."""
    if data.num_proc is not None:
        return data.num_proc
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _digest(src: Source, data: DataConfig) -> str:
    """A hash of all the split texts come from: the input files' bytes and the settings that cut them."""
    settings = [TOKENS_FORMAT, src.kind, data.split, data.val_fraction, data.test_fraction, data.split_seed]
    settings += [data.n_blocks, data.text_field, data.hf_split]
    digest = hashlib.sha256(json.dumps(settings).encode())
    for path in src.files:
        try:
            with open(path, "rb") as f:
                digest.update(b"\0%d\0" % os.fstat(f.fileno()).st_size)
                while block := f.read(READ_BYTES):
                    digest.update(block)
        except OSError as e:
            raise cannot_read(path, e) from None
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Units and the split


def _nbytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def _text(src: Source) -> Iterator[str]:
    """The whole corpus as one stream of pieces: its documents, a blank line between two."""
    for i, doc in enumerate(src.documents()):
        if i:
            yield "\n\n"
        yield from doc


def _stream(src: Source, data: DataConfig, ends: list[int]) -> Iterator[tuple[int, str]]:
    """(unit, piece) for the whole corpus in order: units are the documents, or blocks ending at `ends`."""
    if data.split == "block":
        yield from _cut(_text(src), ends)
        return
    for i, doc in enumerate(src.documents()):
        yield i, ""  # an empty document still takes its place between two joiners
        for piece in doc:
            yield i, piece


def _cut(pieces: Iterable[str], ends: list[int]) -> Iterator[tuple[int, str]]:
    """The stream of pieces cut at the character offsets `ends`: (block, piece)."""
    block, pos = 0, 0
    for piece in pieces:
        while piece:
            take = min(len(piece), ends[block] - pos)
            yield block, piece[:take]
            piece, pos = piece[take:], pos + take
            if pos == ends[block] and block + 1 < len(ends):
                block += 1


@dataclass
class SplitPlan:
    sizes: np.ndarray  # (U,) UTF-8 bytes of each unit
    owners: np.ndarray  # (U,) index into SPLITS of the split each unit belongs to
    ends: list[int]  # data.split=block: where each block ends in the corpus text (characters); else []


def split_plan(src: Source, data: DataConfig) -> SplitPlan:
    """Measure the units, then hold out whole units: a seeded shuffle draws them until each split holds its share of bytes."""
    if data.split == "block":
        ends, sizes = _blocks(src, data)
    else:
        ends, sizes = [], _document_sizes(src, data)
    if len(sizes) < 3:
        raise TiecliError(
            f"the {data.name} text cuts into only {len(sizes)} block(s) at line ends; train, val and test "
            "need one each: give a longer text with more lines"
        )
    owners = np.zeros(len(sizes), dtype=np.int8)
    total, remaining = int(sizes.sum()), len(sizes)
    order = _shuffled_from_the_end(len(sizes), data.split_seed)
    for split, fraction, keep in ((2, data.test_fraction, 2), (1, data.val_fraction, 1)):
        held = 0  # at least one unit each, and `keep` left over for the splits still to fill
        while (held == 0 or held < fraction * total) and remaining > keep:
            i = next(order)
            owners[i], held, remaining = split, held + int(sizes[i]), remaining - 1
    if sizes[owners == 0].sum() == 0:
        raise TiecliError(f"the training split of {data.name} is empty: lower data.val_fraction/test_fraction")
    return SplitPlan(sizes, owners, ends)


def _shuffled_from_the_end(n: int, seed: int) -> Iterator[int]:
    """0..n-1 in the order random.Random(seed).shuffle leaves them, last first, each drawn when asked for.

    shuffle swaps from the end (Fisher-Yates), so its last k places are settled after k draws: the few
    held-out units of millions cost a few draws, not a list of millions.
    """
    rng = random.Random(seed)
    moved: dict[int, int] = {}  # place -> the unit a swap left there
    for i in range(n - 1, 0, -1):
        j = rng.randrange(i + 1)  # what shuffle draws: randrange(i + 1) is its _randbelow(i + 1)
        yield moved.get(j, j)
        moved[j] = moved.get(i, i)
    if n:
        yield moved.get(0, 0)


def _check_text(data: DataConfig, n_docs: int, n_bytes: int, blank: bool) -> None:
    if n_bytes == 0:
        raise TiecliError(f"the {data.name} corpus holds no text ({n_docs} document(s), all empty)")
    if blank:
        raise TiecliError(
            f"the {data.name} corpus holds only whitespace ({n_docs} document(s)): there is nothing to learn"
        )


def _document_sizes(src: Source, data: DataConfig) -> np.ndarray:
    sizes, blank = array("q"), True
    for doc in src.documents():
        n = 0
        for piece in doc:
            n += _nbytes(piece)
            blank = blank and (not piece or piece.isspace())
        sizes.append(n)
    _check_text(data, len(sizes), sum(sizes), blank and sum(sizes) > 0)
    if len(sizes) < 3:
        raise TiecliError(
            f"data.split=document needs at least 3 documents, the corpus has {len(sizes)}; use data.split=block"
        )
    return np.frombuffer(sizes, dtype=np.int64)


def _blocks(src: Source, data: DataConfig) -> tuple[list[int], np.ndarray]:
    """About data.n_blocks contiguous blocks of the corpus text, each ending at a line end where there is one.

    A block ends at the first line end at or after its start + total // n_blocks characters; the last
    block also takes a rest shorter than half a block. Returns each block's end and its bytes.
    """
    total = n_docs = 0
    blank = True
    for doc in src.documents():
        n_docs += 1
        for piece in doc:
            total += len(piece)
            blank = blank and (not piece or piece.isspace())
    _check_text(data, n_docs, total, blank and total > 0)
    total += 2 * (n_docs - 1)  # the blank lines between documents
    size = max(1, total // data.n_blocks)
    ends: list[int] = []
    sizes = array("q")
    start = pos = n = 0  # where the block starts, where the piece starts, the block's bytes so far
    for piece in _text(src):
        cut = 0  # where the block's part of this piece starts
        while start < total and (newline := piece.find("\n", max(0, min(total, start + size) - 1 - pos))) != -1:
            if total - (pos + newline) < size // 2:
                start = total  # the rest is too short for a block of its own: it joins the last one
                break
            n += _nbytes(piece[cut : newline + 1])
            ends.append(pos + newline + 1)
            sizes.append(n)
            start, cut, n = pos + newline + 1, newline + 1, 0
        n += _nbytes(piece[cut:])
        pos += len(piece)
    if not ends or ends[-1] < total:
        ends.append(total)
        sizes.append(n)
    return ends, np.frombuffer(sizes, dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# Tokenized splits, cached


@dataclass
class Corpus:
    """Tokenized splits plus what evaluation and diagnostics need to know about the vocabulary."""

    encoding: tiktoken.Encoding
    tokens: dict[str, np.ndarray]  # split -> (N,) token ids
    counts: np.ndarray  # (V,) how often each token occurs in the training split
    token_bytes: np.ndarray  # (V,) UTF-8 bytes of each token, for bits per byte
    key: str  # cache key: hash of the input files, the split settings and the tokenizer

    def buckets(self, bounds: list[float]) -> np.ndarray:
        return frequency_buckets(self.counts, bounds)


def load_corpus(data: DataConfig, tok: TokenizerConfig, cache: Path | None = None) -> Corpus:
    cache = cache or cache_dir()
    src = source(data)
    digest = _digest(src, data)
    plan = functools.cache(lambda: split_plan(src, data))  # measured only when something must be built
    sample = functools.partial(_bpe_sample, src, data, plan, tok.train_bytes)
    enc = tokenizer.build(tok.name, tok.vocab_size, sample, cache, key=f"{digest} train_bytes={tok.train_bytes}")
    key = hashlib.sha256(f"{digest} {tokenizer.fingerprint(enc)}".encode()).hexdigest()[:20]
    folder = cache / "tokens" / key
    meta = _whole_entry(folder, enc.n_vocab)
    if meta is None:
        chunks = _split_chunks(_stream(src, data, plan().ends), plan().owners, _joiner(data))
        _write_tokens(folder, enc, chunks, num_proc(data))
        meta = json.loads((folder / "meta.json").read_text())
    tokens: dict[str, np.ndarray] = {
        s: np.memmap(folder / f"{s}.bin", dtype=meta["dtype"], mode="r", shape=(meta["n_tokens"][s],)) for s in SPLITS
    }
    counts = np.load(folder / "counts.npy")
    if np.count_nonzero(counts) < 2:  # one repeated token: nothing to predict, and no geometry to measure
        raise TiecliError(
            f"the training split of {data.name} holds {np.count_nonzero(counts)} distinct token(s); "
            "give a text with more than one kind of character"
        )
    return Corpus(
        encoding=enc,
        tokens=tokens,
        counts=counts,
        token_bytes=tokenizer.token_byte_lengths(enc),
        key=key,
    )


def _joiner(data: DataConfig) -> str:
    """What goes between two units of a split: a blank line between documents; blocks are contiguous text."""
    return "\n\n" if data.split == "document" else ""


def _bpe_sample(src: Source, data: DataConfig, plan: Callable[[], SplitPlan], limit: int | None) -> str:
    """About `limit` bytes of the training split (all of it with no limit), spread over it: every k-th
    training unit, joined as the split joins them, the last one cut short."""
    sizes, owners = plan().sizes, plan().owners
    train = np.flatnonzero(owners == 0)
    stride = 1 if limit is None else max(1, -(-int(sizes[train].sum()) // limit))
    chosen = np.zeros(len(owners), dtype=bool)
    chosen[train[::stride]] = True
    parts: list[str] = []
    n, last = 0, -1
    for unit, piece in _stream(src, data, plan().ends):
        if not chosen[unit]:
            continue
        if unit != last and last != -1:
            parts.append(_joiner(data))
        last = unit
        parts.append(piece if limit is None else piece[: limit - n])  # characters: bytes for ASCII text
        n += _nbytes(parts[-1])
        if limit is not None and n >= limit:
            break
    return "".join(parts)


def _split_chunks(stream: Iterable[tuple[int, str]], owners: np.ndarray, joiner: str) -> Iterator[tuple[int, str]]:
    """(split, text): each split's text (its units joined by `joiner`) in chunks of about CHUNK_CHARS,
    cut only where no token crosses, so that the chunks' ids, end to end, are the ids of the whole text."""
    pending: list[list[str]] = [[] for _ in SPLITS]
    length, last = [0] * len(SPLITS), [-1] * len(SPLITS)
    limit = [2 * CHUNK_CHARS] * len(SPLITS)
    for unit, piece in stream:
        s = int(owners[unit])
        if last[s] != unit:
            if last[s] != -1:
                pending[s].append(joiner)
                length[s] += len(joiner)
            last[s] = unit
        pending[s].append(piece)
        length[s] += len(piece)
        if length[s] < limit[s]:
            continue
        text, start = "".join(pending[s]), 0
        while len(text) - start >= 2 * CHUNK_CHARS and (cut := _SAFE_CUT.search(text, start + CHUNK_CHARS)):
            yield s, text[start : cut.end()]
            start = cut.end()
        pending[s], length[s] = [text[start:]], len(text) - start
        # Text with no safe point (one endless line without spaces) waits until it has doubled: joined O(n) times in all
        limit[s] = max(2 * CHUNK_CHARS, 2 * length[s])
    for s, parts in enumerate(pending):
        text = "".join(parts)
        if text:
            yield s, text


def _whole_entry(folder: Path, n_vocab: int) -> dict | None:
    """The cache entry's meta.json when its files are whole (each split's file as long as meta.json says,
    counts.npy one count per token summing to the training split); None when it is absent or damaged
    (a disk that filled, a hand edit), and then a damaged one is set aside, said on stderr, and rebuilt."""
    if not folder.exists():
        return None
    try:
        meta = json.loads((folder / "meta.json").read_text())
        size = np.dtype(meta["dtype"]).itemsize
        for s in SPLITS:
            if (folder / f"{s}.bin").stat().st_size != int(meta["n_tokens"][s]) * size:
                raise ValueError(f"{s}.bin is not {meta['n_tokens'][s]} tokens long")
        counts = np.load(folder / "counts.npy")
        if counts.shape != (n_vocab,) or int(counts.sum()) != int(meta["n_tokens"]["train"]):
            raise ValueError("counts.npy does not match train.bin")
        return meta
    except (OSError, ValueError, KeyError, TypeError, EOFError) as e:
        why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
        print(f"note: the token cache entry {folder} is damaged ({why}); rebuilding it", file=sys.stderr)
    bad = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".bad-"))
    with contextlib.suppress(FileNotFoundError):  # another process set it aside first
        folder.rename(bad / folder.name)  # out of the way at once: no process reads half of it
    shutil.rmtree(bad, ignore_errors=True)
    return None


def _write_tokens(folder: Path, enc: tiktoken.Encoding, chunks: Iterator[tuple[int, str]], processes: int) -> None:
    """Tokenize every split into a temporary folder, then rename it into place (atomic)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if enc.n_vocab <= 2**16 else np.uint32
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".tmp-"))
    try:
        counts = np.zeros(enc.n_vocab, dtype=np.int64)
        n_tokens = dict.fromkeys(SPLITS, 0)
        files = [open(tmp / f"{s}.bin", "wb") for s in SPLITS]
        try:
            for split, ids in tokenizer.encode_stream(enc, chunks, dtype, processes):
                files[split].write(ids.tobytes())  # not ids.tofile: its error on a full disk has no errno
                n_tokens[SPLITS[split]] += len(ids)
                if split == 0:
                    counts += np.bincount(ids, minlength=enc.n_vocab)
        finally:
            for f in files:
                f.close()
        np.save(tmp / "counts.npy", counts)
        (tmp / "meta.json").write_text(json.dumps({"dtype": np.dtype(dtype).name, "n_tokens": n_tokens}))
        try:
            tmp.rename(folder)
        except OSError:  # another process cached the same key first; theirs is identical
            shutil.rmtree(tmp)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.filename is None:  # a full disk: name the cache entry it was writing
            raise OSError(e.errno, e.strerror or str(e), str(folder)) from None
        raise


def frequency_buckets(counts: np.ndarray, bounds: list[float]) -> np.ndarray:
    """(V,) bucket per token: 0 frequent, 1 mid, 2 rare.

    Tokens sorted by training count (descending): "frequent" are the most common ones that together
    make up the first bounds[0] of training tokens, "mid" the next ones up to bounds[1], "rare" the
    rest, including tokens never seen in training.
    """
    order = np.argsort(-counts, kind="stable")
    before = np.concatenate([[0], np.cumsum(counts[order])[:-1]]) / max(1, counts.sum())  # share of tokens ahead
    bucket_sorted = np.where(before < bounds[0], 0, np.where(before < bounds[1], 1, 2))
    bucket_sorted[counts[order] == 0] = 2
    buckets = np.empty_like(bucket_sorted, dtype=np.int8)
    buckets[order] = bucket_sorted
    return buckets
