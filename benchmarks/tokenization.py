# python benchmarks/tokenization.py [--mb 200] [--data textfile|hf] [--tokenizer gpt2] [--num-proc N]
"""Throughput and peak memory of tiecli's streaming tokenization, against tiktoken's batch encoder.

Builds a corpus of --mb megabytes (documents of 2-60 KB: the bundled Shakespeare's lines in random
order), as text files (data=textfile) or parquet files (data=hf). Then, each in a fresh process:

- tiecli: `load_corpus` with an empty cache, end to end: hash the files, measure and split the
  documents, tokenize in a pool of --num-proc processes, write the token files;
- tiktoken: the same documents read into a list, then `encode_ordinary_batch` with --num-proc
  threads (only the encoding is timed: tiktoken's best case).

It prints MB/s for both and the ratio (target: tiktoken at most 1.5x faster), and the peak resident
memory of tiecli's main process and of its largest worker (target: below 1 GB).
"""

import argparse
import json
import lzma
import os
import random
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TIECLI = """
import dataclasses, json, resource, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from conftest import conf
from tiecli.data import tokens as data
cfg = conf("tokenizer={tokenizer}")
d = dataclasses.replace(cfg.data, name={name!r}, path={path!r}, files={files!r}, num_proc={num_proc},
                        text_field="text", hf_split="train", split="document")
start = time.perf_counter()
corpus = data.load_corpus(d, cfg.tokenizer, Path({cache!r}))
seconds = time.perf_counter() - start
print(json.dumps({{
    "seconds": seconds,
    "tokens": sum(len(t) for t in corpus.tokens.values()),
    "rss_main_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "rss_worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
}}))
"""

TIKTOKEN = """
import json, resource, sys, time
from pathlib import Path
from tiecli.data import tokenizer
enc = {{"gpt2": tokenizer.gpt2, "bytes": tokenizer.byte_level}}[{tokenizer!r}]()
docs = [p.read_text() for p in sorted(Path({folder!r}).glob("*.txt"))]
start = time.perf_counter()
ids = enc.encode_ordinary_batch(docs, num_threads={num_proc})
seconds = time.perf_counter() - start
print(json.dumps({{
    "seconds": seconds,
    "tokens": sum(map(len, ids)),
    "rss_main_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}}))
"""


def build_corpus(folder: Path, mb: float, seed: int = 0) -> tuple[int, int]:
    """Text files of Shakespeare's lines in random order: (documents, bytes)."""
    with lzma.open(ROOT / "tiecli" / "assets" / "shakespeare.jsonl.xz", "rt", encoding="utf-8") as f:
        lines = [line for doc in map(json.loads, f) for line in doc["text"].splitlines(keepends=True)]
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    n_docs = n_bytes = 0
    while n_bytes < mb * 1e6:
        text = "".join(rng.choices(lines, k=rng.randint(50, 1500)))
        (folder / f"doc{n_docs:06d}.txt").write_text(text)
        n_docs, n_bytes = n_docs + 1, n_bytes + len(text.encode())
    return n_docs, n_bytes


def to_parquet(folder: Path, out: Path, rows_per_file: int = 2000) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir()
    paths = sorted(folder.glob("*.txt"))
    for i in range(0, len(paths), rows_per_file):
        texts = [p.read_text() for p in paths[i : i + rows_per_file]]
        pq.write_table(pa.table({"text": texts}), out / f"part{i // rows_per_file:04d}.parquet")


def run(code: str) -> dict:
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200, help="corpus size in MB (default 200)")
    parser.add_argument("--data", choices=["textfile", "hf"], default="textfile")
    parser.add_argument("--tokenizer", choices=["gpt2", "bytes"], default="gpt2")
    parser.add_argument("--num-proc", type=int, default=len(os.sched_getaffinity(0)), help="default: all cores")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tiecli-bench-") as tmp:
        folder = Path(tmp) / "txt"
        n_docs, n_bytes = build_corpus(folder, args.mb)
        path, files = str(folder), None
        if args.data == "hf":
            to_parquet(folder, Path(tmp) / "parquet")
            path, files = None, str(Path(tmp) / "parquet")
        name = "hf" if args.data == "hf" else "textfile"
        fields = dict(tokenizer=args.tokenizer, num_proc=args.num_proc, folder=str(folder))
        ours = run(
            TIECLI.format(
                tests=str(ROOT / "tests"), name=name, path=path, files=files, cache=str(Path(tmp) / "cache"), **fields
            )
        )
        theirs = run(TIKTOKEN.format(**fields))
    mb = n_bytes / 1e6
    print(
        f"corpus: {mb:.1f} MB in {n_docs:,} documents (data={args.data}, split by document), "
        f"tokenizer {args.tokenizer}, {args.num_proc} processes/threads"
    )
    print(f"{'':34} {'seconds':>8} {'MB/s':>7} {'tokens':>12} {'peak RSS':>10}")
    print(
        f"{'tiecli load_corpus (end to end)':34} {ours['seconds']:8.1f} {mb / ours['seconds']:7.2f} "
        f"{ours['tokens']:12,} {ours['rss_main_mb']:7.0f} MB  (largest worker {ours['rss_worker_mb']:.0f} MB)"
    )
    print(
        f"{'tiktoken encode_ordinary_batch':34} {theirs['seconds']:8.1f} {mb / theirs['seconds']:7.2f} "
        f"{theirs['tokens']:12,} {theirs['rss_main_mb']:7.0f} MB  (the corpus in memory)"
    )
    print(f"tiecli / tiktoken time: {ours['seconds'] / theirs['seconds']:.2f}x (target: at most 1.5x)")


if __name__ == "__main__":
    main()
