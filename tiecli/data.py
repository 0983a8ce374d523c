# Used by `tiecli train` and `tiecli eval`: corpus -> deterministic split -> cached token arrays -> batches.
"""The data pipeline.

A corpus is a list of documents (the bundled Shakespeare, or the user's files). It is split into
train/val/test by whole documents or by contiguous blocks, so held-out text is never trained on;
the split depends only on the data settings, never on the training seed. Each split is tokenized
once and cached as a flat token array (a numpy memmap) under a key that hashes the split texts and
the tokenizer, so a second run with the same data starts at once.
"""

import glob
import hashlib
import json
import lzma
import os
import random
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tiktoken
import torch

from tiecli import tokenizer
from tiecli.config import DataConfig, TokenizerConfig
from tiecli.errors import TiecliError

SPLITS = ("train", "val", "test")
BUCKETS = ("frequent", "mid", "rare")
SHAKESPEARE = Path(__file__).parent / "assets" / "shakespeare.jsonl.xz"


def cache_dir() -> Path:
    """Where tokenizers and token arrays are cached: $TIECLI_CACHE_DIR, else ~/.cache/tiecli."""
    if "TIECLI_CACHE_DIR" in os.environ:
        return Path(os.environ["TIECLI_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tiecli"


def load_documents(data: DataConfig) -> list[tuple[str, str]]:
    """(name, text) pairs, in a stable order."""
    if data.name == "shakespeare":
        with lzma.open(SHAKESPEARE, "rt", encoding="utf-8") as f:
            return [(d["name"], d["text"]) for d in map(json.loads, f)]
    if data.path is None:
        raise TiecliError("data.path is required for data=textfile: give data.path=FILE, FOLDER or GLOB")
    return [(str(p), _read_utf8(p)) for p in _text_files(data.path)]


def _text_files(path: str) -> list[Path]:
    p = Path(path).expanduser()
    if any(ch in path for ch in "*?["):
        files = [Path(f) for f in sorted(glob.glob(str(p), recursive=True)) if Path(f).is_file()]
        if not files:
            raise TiecliError(f"data.path {path!r} matches no files")
        return files
    try:
        mode = p.stat().st_mode  # stat only: a FIFO is never opened (reading one would block)
    except (FileNotFoundError, NotADirectoryError):
        raise TiecliError(f"data.path {path!r} does not exist") from None
    except OSError as e:  # a name too long, a folder it may not enter, a symlink loop
        raise TiecliError(f"data.path {_short(path)!r} cannot be used ({e.strerror or type(e).__name__})") from None
    if stat.S_ISREG(mode):
        return [p]
    if stat.S_ISDIR(mode):
        files = sorted(
            f for f in p.rglob("*") if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts)
        )
        if not files:
            raise TiecliError(f"data.path {path!r} is a folder with no files in it")
        return files
    raise TiecliError(f"data.path {path!r} is not a regular file or a folder (a FIFO, socket or device)")


def _short(path: str) -> str:
    return path if len(path) <= 80 else f"{path[:40]}...{path[-30:]}"


def _read_utf8(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as e:  # /proc/self/mem and other files that stat as regular but cannot be read
        raise TiecliError(f"data.path file {str(path)!r} cannot be read ({e.strerror or type(e).__name__})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TiecliError(
            f"data.path file {str(path)!r} is not UTF-8 text (byte {raw[e.start]:#04x} at offset {e.start})"
        ) from None


def split_texts(docs: list[tuple[str, str]], data: DataConfig) -> dict[str, str]:
    """Train/val/test texts. Held-out units are drawn by a seeded shuffle until each holds its share of bytes."""
    if sum(len(text) for _, text in docs) == 0:
        raise TiecliError(f"the {data.name} corpus holds no text ({len(docs)} file(s), all empty)")
    if not any(text.strip() for _, text in docs):
        raise TiecliError(
            f"the {data.name} corpus holds only whitespace ({len(docs)} file(s)): there is nothing to learn"
        )
    if data.split == "document":
        if len(docs) < 3:
            raise TiecliError(
                f"data.split=document needs at least 3 documents, the corpus has {len(docs)}; use data.split=block"
            )
        units = [text for _, text in docs]
    else:
        units = _blocks("\n\n".join(text for _, text in docs), data.n_blocks)
    if len(units) < 3:
        raise TiecliError(
            f"the {data.name} text cuts into only {len(units)} block(s) at line ends; train, val and test "
            "need one each: give a longer text with more lines"
        )
    order = list(range(len(units)))
    random.Random(data.split_seed).shuffle(order)
    total = sum(len(u.encode()) for u in units)
    owner = ["train"] * len(units)
    for split, fraction, keep in (("test", data.test_fraction, 2), ("val", data.val_fraction, 1)):
        held = 0  # at least one unit each, and `keep` left over for the splits still to fill
        while (held == 0 or held < fraction * total) and len(order) > keep:
            i = order.pop()
            owner[i] = split
            held += len(units[i].encode())
    joiner = "\n\n" if data.split == "document" else ""
    return {s: joiner.join(u for u, o in zip(units, owner) if o == s) for s in SPLITS}


def _blocks(text: str, n_blocks: int) -> list[str]:
    """Cut text into about n_blocks contiguous pieces, each ending at a line end where there is one."""
    size = max(1, len(text) // n_blocks)
    blocks, start = [], 0
    while start < len(text):
        end = min(len(text), start + size)
        newline = text.find("\n", end - 1)  # the first line end at or after the cut
        end = len(text) if newline == -1 or len(text) - newline < size // 2 else newline + 1
        blocks.append(text[start:end])
        start = end
    return blocks


@dataclass
class Corpus:
    """Tokenized splits plus what evaluation and diagnostics need to know about the vocabulary."""

    encoding: tiktoken.Encoding
    tokens: dict[str, np.ndarray]  # split -> (N,) token ids
    counts: np.ndarray  # (V,) how often each token occurs in the training split
    token_bytes: np.ndarray  # (V,) UTF-8 bytes of each token, for bits per byte
    key: str  # cache key: hash of the split texts and the tokenizer

    def buckets(self, bounds: list[float]) -> np.ndarray:
        return frequency_buckets(self.counts, bounds)


def load_corpus(data: DataConfig, tok: TokenizerConfig, cache: Path | None = None) -> Corpus:
    cache = cache or cache_dir()
    texts = split_texts(load_documents(data), data)
    if not texts["train"]:
        raise TiecliError(f"the training split of {data.name} is empty: lower data.val_fraction/test_fraction")
    enc = tokenizer.build(tok.name, tok.vocab_size, texts["train"], cache)
    digest = hashlib.sha256(tokenizer.fingerprint(enc).encode())
    for s in SPLITS:
        digest.update(f"\0{s}\0".encode() + texts[s].encode())
    key = digest.hexdigest()[:20]
    folder = cache / "tokens" / key
    if not (folder / "meta.json").exists():
        _write_tokens(folder, enc, texts)
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


def _write_tokens(folder: Path, enc: tiktoken.Encoding, texts: dict[str, str]) -> None:
    """Tokenize every split into a temporary folder, then rename it into place (atomic)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if enc.n_vocab <= 2**16 else np.uint32
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".tmp-"))
    try:
        meta: dict = {"dtype": np.dtype(dtype).name, "n_tokens": {}}
        for s in SPLITS:
            ids = np.array(enc.encode_ordinary(texts[s]), dtype=dtype)
            ids.tofile(tmp / f"{s}.bin")
            meta["n_tokens"][s] = len(ids)
            if s == "train":
                np.save(tmp / "counts.npy", np.bincount(ids, minlength=enc.n_vocab).astype(np.int64))
        (tmp / "meta.json").write_text(json.dumps(meta))
        try:
            tmp.rename(folder)
        except OSError:  # another process cached the same key first; theirs is identical
            shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
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


def get_batch(
    tokens: np.ndarray, batch_size: int, block_size: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of the training split: inputs (B, T) and next-token targets (B, T)."""
    if len(tokens) <= block_size:
        raise TiecliError(f"the training split has {len(tokens)} tokens, fewer than block_size+1={block_size + 1}")
    starts = torch.randint(len(tokens) - block_size, (batch_size,), generator=generator).numpy()
    window = torch.from_numpy(tokens[starts[:, None] + np.arange(block_size + 1)].astype(np.int64))  # (B, T+1)
    return window[:, :-1], window[:, 1:]


def eval_windows(n_tokens: int, block_size: int, limit: int | None = None) -> list[tuple[int, int]]:
    """(start, length) of windows whose targets cover every token of a split once (its first excepted).

    With a limit, that many full windows spread evenly over the split: the same ones at every evaluation.
    """
    windows = [(s, min(block_size, n_tokens - 1 - s)) for s in range(0, n_tokens - 1, block_size)]
    if limit is not None and limit < len(windows):
        full = [w for w in windows if w[1] == block_size]
        windows = [full[i] for i in np.linspace(0, len(full) - 1, limit).round().astype(int)]
    return windows
