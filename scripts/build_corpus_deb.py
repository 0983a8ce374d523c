# python scripts/build_corpus_deb.py NAME [--debs FOLDER] [--count-tokens]   (NAME: docs_en or docs_ru; writes $TIECLI_CACHE_DIR/corpora/NAME.jsonl.xz)
"""Build a larger corpus (data=docs_en, data=docs_ru) from pinned Debian packages.

No registry reachable offline ships a large corpus of general natural prose (see docs/data.md for what
was checked), so these corpora are the natural-language documentation that Debian ships in English and
in Russian: for English the Python, Linux kernel, Django, PostgreSQL, SQLite, Octave, Maxima, git, Perl
and Rust manuals, for both the LibreOffice, GIMP and KiCad user manuals and Debian's FAQ and
Developer's Reference (HTML is turned into text; Sphinx, AsciiDoc and POD sources are read as they
are), and for Russian also fortune-mod-ru's quotations. Each package is pinned by version and by the sha256 of its
.deb; `apt-get download` fetches them (or --debs gives a folder that already holds them). Every
file becomes one document, {"name": package/path, "text": ...}, one JSON object per line,
xz-compressed, sorted by name; identical texts are kept once. Same .debs in, same sha256 out.
The output goes to tiecli's cache (TIECLI_CACHE_DIR, else ~/.cache/tiecli), not into the wheel.
"""

import argparse
import hashlib
import html.parser
import io
import json
import lzma
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tiecli.data.corpus import CORPORA, corpus_path
from tiecli.run.files import atomic_write

# (package, version, sha256 of the .deb, kind of file read, path pattern inside the package)
Package = tuple[str, str, str, str, str]
RST = r"/html/_sources/.*\.rst\.txt$"  # the Sphinx sources: text with light markup
HTML = r"\.html?$"
# The Rust books (not the API reference, nor the unstable book's generated stubs); print.html repeats a whole book
RUST_BOOKS = (
    r"/html/(book|reference|nomicon|rust-by-example|edition-guide|embedded-book|rustc)/(?!print\.html).*\.html$"
)
INDEX_PAGES = re.compile(r"/(genindex|search|py-modindex|modindex)[^/]*\.html$")  # lists of links, not text
# fmt: off
PACKAGES: dict[str, list[Package]] = {
    "docs_en": [
        ("python3.11-doc", "3.11.2-6+deb12u9", "5b3594189d6ef9a6963ce0347fd307a1cc67620ad697e144db366070e2e146be", "text", RST),
        ("linux-doc-6.1", "6.1.192-3", "f18dfe28dcab7bdbf9185be16b9521f5841277a6a96c374a6683a648d5d5fa4f", "text", RST),
        ("libreoffice-help-en-us", "4:7.4.7-1+deb12u14", "8faa840285734d6cfe1ed25537b48f07e74bd6412e3917bf8e5f8a653f7b3712", "html", HTML),
        ("gimp-help-en", "2.10.34-2", "a2deec76763aaf2fcdd197bac0736cdcb0770ba993d48d233329e1c92b0bfe36", "html", HTML),
        ("kicad-doc-en", "6.0.11+dfsg-1", "20dbe9acb2e6f38d49bd742d4b71bee2dc3e7dbd8c54a7a45ad05a742e5ae834", "html", HTML),
        ("developers-reference", "12.18", "0dba82f6fa16e373f2a84ad07e7971aa9264ad2e7d2ae46b37edbc9c5fd57e2e", "html", HTML),
        ("debian-faq", "11.1", "427426e0cfa6888622fc1d72631071cb4b5a1f86ccde722e7820bcef284de5d0", "html", HTML),
        ("python-django-doc", "3:3.2.25-0+deb12u7", "87307f067916df72e17180d35b7cde5c7ea6080336cda518efd7f6e66988a7ca", "html", HTML),
        ("postgresql-doc-15", "15.20-0+deb12u1", "4c44bf2c599f208b3f46454a6cf7a72e25ec46ff74d37b59dd31ad76b00eebb7", "html", HTML),
        ("sqlite3-doc", "3.40.1-2+deb12u2", "466e30d7066e2641fa13e56bc662a2ad521b8cc9c17dde9c9dac3d4f105e32f2", "html", HTML),
        ("octave-doc", "7.3.0-2", "b27897cc7e3d688daa5cb8f8d1ea47077f3fbd205ce32e22522200ff0c1eadd5", "html", HTML),
        ("git-doc", "1:2.39.5-0+deb12u3", "3c89668a11053a6bafade3de1f611f4613db31e082af63f43d8c5b69ad8795ec", "text", r"/doc/git-doc/[^/]+\.txt$"),
        ("debian-reference-en", "2.100", "9f31d3a17df505de09689ca255512ea58c1fc47c59bb1b0c7bf1c23362e9743f", "html", HTML),
        ("rust-doc", "1.63.0+dfsg1-2", "96ef96fe6df87d939ca713bd7df3d15c2b778ccb892eca025c4ee504146f697b", "html", RUST_BOOKS),
        ("perl-doc", "5.36.0-7+deb12u4", "f4269cff4576d6f02a6756df842988e58451c7e945b08517dd235531b24e48f8", "text", r"/pod/[^/]+\.pod$"),
        ("maxima-doc", "5.46.0-11", "01a726b693a7e465a62040ac5ade4762194d7553524231d77cd1fcd4a69a75b9", "html", HTML),
    ],
    "docs_ru": [
        ("libreoffice-help-ru", "4:7.4.7-1+deb12u14", "5a2f75d5b0dfcf660275070647af528a81be28b5d3e9c3ec2d419ef5518db7a2", "html", HTML),
        ("gimp-help-ru", "2.10.34-2", "6cc1afc044beda47a616cd2627ac5941bcca7ef7beb5edde7aa3b41cc61c3edd", "html", HTML),
        ("kicad-doc-ru", "6.0.11+dfsg-1", "bea783318a41d3154c552a3fb10ae2a30f10337166e76116ea9eb8169cd6ad26", "html", HTML),
        ("developers-reference-ru", "12.18", "a618bfa826e2436fa73d5bf4eaac7170ff9d25a5d1bdd86b1c25a196a2b886c6", "html", HTML),
        ("debian-faq-ru", "11.1", "aaaae7a409c5cf5f5b8c26991f6ef484297e0cd2dee74c8d675cfa6613bce541", "html", HTML),
        ("fortunes-ru", "1.52-3.1", "2dc76af9c0e02e2926d36f88dcb685bb171fab8677e553a6def41efe8a551cc6", "fortune", r"/games/fortunes/ru/[^/]+$"),
    ],
}
# fmt: on

BLOCK_TAGS = {
    "p", "div", "br", "li", "ul", "ol", "dl", "dt", "dd", "tr", "table", "pre", "blockquote", "section",
    "h1", "h2", "h3", "h4", "h5", "h6", "title", "hr", "td", "th",
}  # fmt: skip
SKIP_TAGS = {"script", "style", "head", "nav", "noscript"}


class _TextOf(html.parser.HTMLParser):
    """The visible text of an HTML page: script, style and head dropped, a line break at each block."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag, attrs):
        if tag in SKIP_TAGS:
            self.skipping += 1
        elif tag in BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in SKIP_TAGS:
            self.skipping = max(0, self.skipping - 1)
        elif tag in BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(data)


def html_to_text(page: str) -> str:
    parser = _TextOf()
    parser.feed(page)
    parser.close()
    return tidy("".join(parser.parts))  # convert_charrefs has decoded the entities, once


def tidy(text: str) -> str:
    """Line ends to \\n, runs of spaces in a line to one, no trailing spaces, at most one blank line in a row."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\xa0", " ")
    lines = [re.sub(r"[ \t]+", " ", line).strip() for line in text.split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def fortune_text(raw: str) -> str:
    """A fortune file's sayings ('%' lines between them), one paragraph each."""
    sayings = [tidy(s) for s in re.split(r"(?m)^%\s*$", raw)]
    return "\n\n".join(s for s in sayings if s)


def document_text(kind: str, raw: str) -> str:
    if kind == "html":
        return html_to_text(raw)
    if kind == "fortune":
        return fortune_text(raw)
    return tidy(raw)


def deb_members(deb: Path) -> Iterator[tuple[str, bytes]]:
    """(path, bytes) of each regular file in a .deb's data archive (an ar archive holding data.tar.*)."""
    blob = deb.read_bytes()
    if not blob.startswith(b"!<arch>\n"):
        sys.exit(f"{deb}: not a Debian package (no ar header)")
    pos = 8
    while pos + 60 <= len(blob):
        name = blob[pos : pos + 16].decode().strip().rstrip("/")
        size = int(blob[pos + 48 : pos + 58].decode().strip())
        body = blob[pos + 60 : pos + 60 + size]
        pos += 60 + size + (size & 1)
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as tar:
                for member in tar:
                    if member.isfile():
                        yield member.name.lstrip("./"), tar.extractfile(member).read()
            return
    sys.exit(f"{deb}: no data.tar member")


def package_documents(deb: Path, package: Package) -> list[tuple[str, str]]:
    name, _, _, kind, pattern = package
    docs = []
    for path, raw in deb_members(deb):
        if re.search(pattern, "/" + path) and not path.endswith(".dat") and not INDEX_PAGES.search("/" + path):
            text = document_text(kind, raw.decode("utf-8", errors="replace"))
            if text:
                docs.append((f"{name}/{path}", text))
    return docs


def to_jsonl(docs: list[tuple[str, str]]) -> bytes:
    lines = [
        json.dumps({"name": name, "text": text}, ensure_ascii=False, sort_keys=True, separators=(",", ":")) + "\n"
        for name, text in docs
    ]
    return "".join(lines).encode("utf-8")


def unique(docs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Sorted by name; a text that occurs again (the same page in two places) is kept the first time only."""
    seen, kept = set(), []
    for name, text in sorted(docs):
        digest = hashlib.sha256(text.encode()).digest()
        if digest not in seen:
            seen.add(digest)
            kept.append((name, text))
    return kept


def deb_file(folder: Path, package: Package) -> Path:
    name, version = package[0], package[1].split(":")[-1]  # the epoch is %3a-quoted or left out of file names
    matches = sorted(folder.glob(f"{name}_*{version}_*.deb"))
    if not matches:
        sys.exit(f"{folder}: no {name}_{package[1]}_*.deb (apt-get download {name}={package[1]})")
    return matches[0]


def download(folder: Path, packages: list[Package]) -> None:
    """apt-get download the pinned versions; apt-get's own errors above, then one line saying what to do."""
    pins = [f"{p[0]}={p[1]}" for p in packages]
    try:
        subprocess.run(["apt-get", "download", *pins], cwd=folder, check=True)
    except FileNotFoundError:
        sys.exit("apt-get is not on this machine: download the pinned .deb files elsewhere and pass --debs FOLDER")
    except subprocess.CalledProcessError as e:
        sys.exit(
            f"apt-get download of {len(pins)} pinned packages failed (exit {e.returncode}): a stale package list "
            "cannot find the pins, so run `apt-get update` first, or pass --debs FOLDER holding the .deb files"
        )


def check_sha256(deb: Path, package: Package) -> None:
    digest = hashlib.sha256(deb.read_bytes()).hexdigest()
    if digest != package[2]:
        sys.exit(f"{deb}: sha256 {digest} is not the pinned {package[0]}={package[1]} ({package[2]})")


def build(name: str, folder: Path, out: Path) -> None:
    start = time.monotonic()
    docs: list[tuple[str, str]] = []
    for package in PACKAGES[name]:
        deb = deb_file(folder, package)
        check_sha256(deb, package)
        found = package_documents(deb, package)
        print(f"{package[0]}={package[1]}: {len(found)} documents, {sum(len(t) for _, t in found):,} characters")
        docs += found
    docs = unique(docs)
    data = lzma.compress(to_jsonl(docs), format=lzma.FORMAT_XZ, preset=6)
    atomic_write(out, data)
    print(f"documents:  {len(docs)}")
    print(f"characters: {sum(len(text) for _, text in docs):,}")
    print(f"compressed: {len(data):,} bytes -> {out}")
    print(f"sha256:     {hashlib.sha256(data).hexdigest()}")
    print(f"seconds:    {time.monotonic() - start:.0f}")


def count_tokens(path: Path, vocab: int = 4096, sample_bytes: int = 10_000_000) -> None:
    """Estimate the corpus's tokens: a byte-level BPE (tokenizer=bpe) trained on every k-th document,
    about sample_bytes in all, then the whole corpus encoded with it."""
    from tiecli.data import tokenizer

    with lzma.open(path, "rt", encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for line in f]
    stride = max(1, sum(len(d.encode()) for d in docs) // sample_bytes)
    sample = "\n\n".join(docs[::stride])
    with tempfile.TemporaryDirectory() as cache:
        enc = tokenizer.build("bpe", vocab, sample, cache, key=f"{path} {stride}")
    n = sum(len(enc.encode_ordinary(d)) for d in docs)
    chars = sum(len(d) for d in docs)
    print(f"tokens:     {n:,} (BPE {vocab} trained on every {stride}th document, {len(sample):,} characters)")
    print(f"per token:  {chars / n:.2f} characters")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(PACKAGES))
    parser.add_argument(
        "--debs", type=Path, help="a folder holding the pinned .deb files (default: apt-get download them)"
    )
    parser.add_argument("--out", type=Path, help="where to write (default: tiecli's cache, where data=NAME reads it)")
    parser.add_argument("--count-tokens", action="store_true", help="only estimate the tokens of the built corpus")
    args = parser.parse_args()
    assert set(PACKAGES) == set(CORPORA)
    out = args.out or corpus_path(args.name)
    if args.count_tokens:
        count_tokens(out)
        return
    if args.debs:
        build(args.name, args.debs, out)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            download(Path(tmp), PACKAGES[args.name])
            build(args.name, Path(tmp), out)


if __name__ == "__main__":
    main()
