# Used by `tiecli train` and `tiecli eval` (through data/tokens.py) and by scripts/build_corpus_deb.py.
"""Where a corpus's documents come from: the bundled Shakespeare, a built corpus in the cache
(docs_en, docs_ru), the user's text files (data=textfile), or Hugging Face datasets (data=hf).
Each source reads the same documents, in the same order, every time it is read.
"""

import codecs
import functools
import glob
import json
import lzma
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tiecli.config.schema import DataConfig
from tiecli.errors import ConfigError, TiecliError

SHAKESPEARE = Path(__file__).parent.parent / "assets" / "shakespeare.jsonl.xz"


CORPORA = ("docs_en", "docs_ru")  # too large to ship: scripts/build_corpus_deb.py builds them into the cache


READ_BYTES = 8 << 20  # a text file is read this many bytes at a time


HF_FORMATS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".txt": "text"}


HF_COMPRESSIONS = (".gz", ".xz", ".bz2", ".zst")  # datasets decompresses these itself


def cache_dir() -> Path:
    """Where tokenizers and token arrays are cached: $TIECLI_CACHE_DIR, else ~/.cache/tiecli."""
    if "TIECLI_CACHE_DIR" in os.environ:
        return Path(os.environ["TIECLI_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tiecli"


def corpus_path(name: str) -> Path:
    """Where a built corpus (one of CORPORA) lives: cache_dir()/corpora/<name>.jsonl.xz."""
    return cache_dir() / "corpora" / f"{name}.jsonl.xz"


@dataclass
class Source:
    """A corpus that reads the same documents, in the same order, every time it is read."""

    kind: str  # shakespeare, textfile or hf: part of the cache key
    files: list[Path]  # the files the cache key hashes
    documents: Callable[[], Iterator[Iterable[str]]]  # each document as pieces of text


def source(data: DataConfig) -> Source:
    if data.name == "shakespeare":
        return Source("shakespeare", [SHAKESPEARE], functools.partial(_jsonl_xz, SHAKESPEARE))
    if data.name in CORPORA:
        return _built_source(data.name)
    if data.name == "hf":
        return _hf_source(data)
    if data.path is None:
        raise TiecliError("data.path is required for data=textfile: give data.path=FILE, FOLDER or GLOB")
    files = _files(data.path, "data.path")
    return Source("textfile", files, lambda: (_read_text(f) for f in files))


def load_documents(data: DataConfig) -> Iterator[tuple[int, str]]:
    """(index, text) of each document, each whole: for tests and small corpora (load_corpus streams)."""
    for i, doc in enumerate(source(data).documents()):
        yield i, "".join(doc)


def _jsonl_xz(path: Path) -> Iterator[list[str]]:
    """The documents of an xz-compressed JSON-lines file, one {"name", "text"} object a line."""
    with lzma.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            yield [json.loads(line)["text"]]


def _built_source(name: str) -> Source:
    path = corpus_path(name)
    if not path.is_file():
        raise TiecliError(
            f"data={name}: the corpus is not built yet ({path} is missing); "
            f"build it with: python scripts/build_corpus_deb.py {name}"
        )
    return Source(name, [path], functools.partial(_jsonl_xz, path))


def _files(path: str, key: str) -> list[Path]:
    """The files a path names: itself, every file under a folder (hidden ones skipped), or a glob's matches."""
    p = Path(path).expanduser()
    if any(ch in path for ch in "*?["):
        files = [Path(f) for f in sorted(glob.glob(str(p), recursive=True)) if Path(f).is_file()]
        if not files:
            raise TiecliError(f"{key} {path!r} matches no files")
        return files
    try:
        mode = p.stat().st_mode  # stat only: a FIFO is never opened (reading one would block)
    except (FileNotFoundError, NotADirectoryError):
        raise TiecliError(f"{key} {path!r} does not exist") from None
    except OSError as e:  # a name too long, a folder it may not enter, a symlink loop
        raise TiecliError(f"{key} {_short(path)!r} cannot be used ({e.strerror or type(e).__name__})") from None
    if stat.S_ISREG(mode):
        return [p]
    if stat.S_ISDIR(mode):
        files = sorted(
            f for f in p.rglob("*") if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts)
        )
        if not files:
            raise TiecliError(f"{key} {path!r} is a folder with no files in it")
        return files
    raise TiecliError(f"{key} {path!r} is not a regular file or a folder (a FIFO, socket or device)")


def _short(path: str) -> str:
    return path if len(path) <= 80 else f"{path[:40]}...{path[-30:]}"


def cannot_read(path: Path, e: OSError) -> TiecliError:
    # /proc/self/mem and other files that stat as regular but cannot be read
    return TiecliError(f"file {str(path)!r} cannot be read ({e.strerror or type(e).__name__})")


def _read_text(path: Path) -> Iterator[str]:
    """A UTF-8 file's text, READ_BYTES at a time."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    read = 0
    try:
        with open(path, "rb") as f:
            while True:
                raw = f.read(READ_BYTES)
                read += len(raw)
                try:
                    text = decoder.decode(raw, final=not raw)
                except UnicodeDecodeError as e:  # e.object: the bytes held back from the last read, then these
                    where = read - len(e.object) + e.start
                    raise TiecliError(
                        f"data.path file {str(path)!r} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {where})"
                    ) from None
                if text:
                    yield text
                if not raw:
                    return
    except OSError as e:
        raise cannot_read(path, e) from None


def _datasets():
    try:
        import datasets
    except ImportError:
        raise TiecliError("data=hf needs Hugging Face datasets: pip install 'tiecli[hf]'") from None
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its errors reach the user as tiecli's one line
    return datasets


def _hf_source(data: DataConfig) -> Source:
    """data.files (local files or a saved dataset folder) or data.hub (a Hub dataset), column data.text_field."""
    field = data.text_field or "text"
    if data.hub is not None:
        datasets = _datasets()
        ds, where = _hub_dataset(datasets, data.hub, data.hf_split), f"data.hub={data.hub!r}"
        files = [Path(f["filename"]) for f in ds.cache_files]
    else:
        assert data.files is not None  # config checks that data=hf has one of files, hub
        where = f"data.files={data.files!r}"
        files = _files(data.files, "data.files")  # before importing datasets (seconds): a wrong path fails at once
        folder = Path(data.files).expanduser()
        datasets = _datasets()
        if (folder / "state.json").is_file() or (folder / "dataset_dict.json").is_file():
            ds = _saved_dataset(datasets, folder, data.hf_split)
        else:
            ds = _local_dataset(datasets, files)
    columns = ds.column_names or ["text"]  # the text builder's one column; features unknown until read
    if field not in columns:
        raise ConfigError(f"data.text_field={field!r} is not a column of {where}; its columns: {', '.join(columns)}")
    kind = getattr(ds.features.get(field) if ds.features else None, "dtype", "string")
    if kind not in ("string", "large_string"):
        raise ConfigError(f"data.text_field={field!r} holds {kind} values in {where}, not text")
    ds = ds.select_columns([field])
    return Source("hf", files, lambda: _rows(ds, field, where))


def _rows(ds, field: str, where: str) -> Iterator[list[str]]:
    """Each row's text: one document; rows whose text is null are skipped."""
    import pyarrow

    try:
        for batch in ds.iter(batch_size=1000):
            for text in batch[field]:
                if text is not None:
                    yield [text]
    except (pyarrow.ArrowException, ValueError) as e:
        raise TiecliError(f"{where} cannot be read: {' '.join(str(e).split())[:200]}") from None


def _local_dataset(datasets, files: list[Path]):
    formats = {}
    for f in files:
        suffixes = [x for x in f.suffixes if x not in HF_COMPRESSIONS]
        if not suffixes or suffixes[-1] not in HF_FORMATS:
            continue  # a README or licence beside the data
        formats[f] = HF_FORMATS[suffixes[-1]]
    if not formats:
        raise ConfigError(
            f"data.files holds no file data=hf reads ({len(files)} file(s)): give .parquet, .json, .jsonl or .txt "
            f"files (also {'/'.join(HF_COMPRESSIONS)}-compressed), or a folder saved with save_to_disk"
        )
    kinds = sorted(set(formats.values()))
    if len(kinds) > 1:
        raise ConfigError(f"data.files mixes formats ({', '.join(kinds)}): give files of one format")
    if kinds[0] == "parquet":
        _check_parquet(list(formats))
    options = {"sample_by": "document"} if kinds[0] == "text" else {}  # a .txt file is one document
    data_files = [str(f) for f in formats]
    return datasets.load_dataset(kinds[0], data_files=data_files, split="train", streaming=True, **options)


def _check_parquet(files: list[Path]) -> None:
    """Refuse empty and broken parquet files up front, by their footers: datasets would fail mid-stream."""
    import pyarrow
    import pyarrow.parquet as pq

    for f in files:
        try:
            rows = pq.ParquetFile(f).metadata.num_rows
        except (pyarrow.ArrowException, OSError) as e:
            raise TiecliError(
                f"data.files file {str(f)!r} is not a parquet file ({' '.join(str(e).split())})"
            ) from None
        if rows == 0:
            raise TiecliError(
                f"data.files file {str(f)!r} is an empty parquet file (0 rows): remove it or give another"
            )


def _saved_dataset(datasets, folder: Path, split: str | None):
    """A folder written by Dataset.save_to_disk, or by DatasetDict.save_to_disk (then data.hf_split picks one)."""
    try:
        ds = datasets.load_from_disk(str(folder))
    except (FileNotFoundError, ValueError) as e:
        raise TiecliError(f"data.files={str(folder)!r} cannot be read as a saved dataset: {e}") from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise ConfigError(f"data.hf_split={split!r} is not a split of {str(folder)!r}; its splits: {', '.join(ds)}")
        ds = ds[split]
    return ds


def _hub_dataset(datasets, name: str, split: str | None):
    """A Hub dataset, downloaded into Hugging Face's cache the first time and read from there after."""
    try:
        return datasets.load_dataset(name, split=split)
    except ConnectionError:
        raise TiecliError(
            f"data.hub={name!r} cannot be loaded: offline (no network, or HF_DATASETS_OFFLINE=1) "
            "and not in Hugging Face's cache; give local files with data.files=PATH"
        ) from None
    except datasets.exceptions.DatasetNotFoundError as e:
        raise TiecliError(f"data.hub={name!r} is not a dataset on the Hub: {' '.join(str(e).split())}") from None
    except ValueError as e:  # an unknown split names the valid ones
        raise ConfigError(f"data.hub={name!r}, data.hf_split={split!r}: {' '.join(str(e).split())}") from None
