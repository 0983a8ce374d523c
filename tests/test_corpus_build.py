"""The larger corpora (data=docs_en, data=docs_ru): their build script on a small made-up .deb, the
presets' error when a corpus is not built, and the shipped Russian pairs file."""

import collections
import hashlib
import io
import re
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import TINY, data_config
from helpers import one_line_error, script, tiecli

from tiecli.data.corpus import corpus_path, load_documents
from tiecli.data.pairs import pairs_file, read_pairs_file

ROOT = Path(__file__).resolve().parent.parent
NODATA = [o for o in TINY if not o.startswith("data")]


deb = script("build_corpus_deb")
pairs_ru = script("build_pairs_ru")


def test_html_to_text_keeps_the_visible_text_one_block_a_line():
    page = (
        "<html><head><title>x</title><style>p {color: red}</style></head><body>"
        "<h1>Кошки  и&nbsp;коты</h1><script>var a = 1;</script>"
        "<p>One   &amp; two &amp;lt;b&amp;gt;,\r\n three.</p><ul><li>first</li><li>second</li></ul></body></html>"
    )
    assert deb.html_to_text(page) == "Кошки и коты\n\nOne & two &lt;b&gt;,\nthree.\n\nfirst\n\nsecond"


def test_fortune_text_makes_one_paragraph_per_saying():
    raw = "Аппетит приходит.\n\t\t-- Автор\n%\n\n%\nВторое  изречение.\n%\n"
    assert deb.fortune_text(raw) == "Аппетит приходит.\n-- Автор\n\nВторое изречение."


def make_deb(path, files):
    """A minimal Debian package: an ar archive holding debian-binary and data.tar.xz with these files."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as tar:
        for name, text in files.items():
            body = text.encode()
            info = tarfile.TarInfo("./" + name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    members = [("debian-binary", b"2.0\n"), ("data.tar.xz", data.getvalue())]
    out = b"!<arch>\n"
    for name, body in members:
        out += f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n".encode() + body
        out += b"\n" if len(body) % 2 else b""
    path.write_bytes(out)
    return hashlib.sha256(out).hexdigest()


def test_build_reads_the_pinned_deb_and_data_preset_reads_the_result(tmp_path, monkeypatch):
    monkeypatch.setenv("TIECLI_CACHE_DIR", str(tmp_path / "cache"))  # a fresh cache: nothing built yet
    files = {
        "usr/share/doc/x/html/a.html": "<p>Первый документ.</p>",
        "usr/share/doc/x/html/b.html": "<p>Второй документ.</p>",
        "usr/share/doc/x/html/copy.html": "<p>Первый документ.</p>",  # the same text again: kept once
        "usr/share/doc/x/html/genindex.html": "<p>index</p>",  # a list of links: left out
        "usr/share/doc/x/html/c.html": "<p>Третий.</p>",
        "usr/share/doc/x/html/style.css": "p {}",  # not HTML: left out
    }
    sha = make_deb(tmp_path / "x-doc_1.0-1_all.deb", files)
    monkeypatch.setitem(deb.PACKAGES, "docs_ru", [("x-doc", "1.0-1", sha, "html", deb.HTML)])
    deb.build("docs_ru", tmp_path, corpus_path("docs_ru"))
    first = corpus_path("docs_ru").read_bytes()
    docs = [text for _, text in load_documents(data_config(name="docs_ru"))]
    assert docs == ["Первый документ.", "Второй документ.", "Третий."]  # a, b, c by name; copy and index dropped
    deb.build("docs_ru", tmp_path, corpus_path("docs_ru"))
    assert corpus_path("docs_ru").read_bytes() == first  # reproducible: same .deb, same bytes

    monkeypatch.setitem(deb.PACKAGES, "docs_ru", [("x-doc", "1.0-1", "0" * 64, "html", deb.HTML)])
    with pytest.raises(SystemExit, match="is not the pinned x-doc=1.0-1"):
        deb.build("docs_ru", tmp_path, corpus_path("docs_ru"))
    assert corpus_path("docs_ru").read_bytes() == first  # a failed build leaves the corpus as it was


def test_a_corpus_that_is_not_built_is_a_one_line_error_naming_the_build(isolated, tmp_path, monkeypatch):
    monkeypatch.setenv("TIECLI_CACHE_DIR", str(tmp_path / "empty-cache"))
    for name in ("docs_en", "docs_ru"):
        result = tiecli("train", *NODATA, f"data={name}")
        one_line_error(result, 1, f"build it with: python scripts/build_corpus_deb.py {name}")
        assert "is not built yet" in result.output
    assert not (isolated / "runs").exists()


def test_ru_pairs_parse_and_every_pair_is_two_forms():
    path = pairs_file("ru")
    assert path == ROOT / "conf" / "pairs" / "ru.tsv"
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines() if not line.startswith("#")]
    assert len(rows) >= 1000
    assert all(len(r) == 2 and r[0] != r[1] for r in rows)
    assert ["кошка", "кошки"] in rows and ["идти", "шёл"] in rows  # the article's examples
    ids = collections.defaultdict(lambda: len(ids))  # every word one token: every line must give a pair
    pairs, skipped = read_pairs_file(path, lambda word: [ids[word.strip()]])  # " кошка" is "кошка"
    assert skipped == 0 and len(pairs) == len(set(map(tuple, rows)))


def fake_morph(lexemes):
    """A stand-in for pymorphy3's analyzer: lexemes maps (lemma, POS) to its forms."""
    owner = {form: (lemma, pos) for (lemma, pos), forms in lexemes.items() for form in forms}

    def parse(word):
        lemma, pos = owner.get(word, (word, "PREP"))
        forms = [SimpleNamespace(word=f) for f in lexemes.get((lemma, pos), [word])]
        return [SimpleNamespace(normal_form=lemma, tag=SimpleNamespace(POS=pos), lexeme=forms)]

    return SimpleNamespace(parse=parse)


def test_pairs_are_a_lemma_with_its_frequent_forms_seen_in_the_corpus(monkeypatch):
    monkeypatch.setattr(pairs_ru, "MIN_COUNT", 2)
    lines = ['{"name": "a", "text": "Кошка и кошки, кошки и КОШКУ. Кошке кошка кошку в лес, лес."}']
    counts = pairs_ru.word_counts(lines)
    assert counts == {"кошка": 2, "и": 2, "кошки": 2, "кошку": 2, "кошке": 1, "в": 1, "лес": 2}
    morph = fake_morph({("кошка", "NOUN"): ["кошка", "кошки", "кошку", "кошке"], ("лес", "NOUN"): ["лес", "леса"]})
    pairs = pairs_ru.build_pairs(counts, morph)
    # the article's pairs first (кошка/кошки only once); кошке is too rare, лес has no other form seen, и is no content word
    assert pairs == [*pairs_ru.ARTICLE_PAIRS, ("кошка", "кошку")]


@pytest.mark.parametrize(
    "apt_get, text",
    [("exit 100", "run `apt-get update` first"), (None, "apt-get is not on this machine")],
)
def test_a_failed_download_is_one_line_saying_what_to_do(tmp_path, monkeypatch, apt_get, text):
    """apt-get failing (a stale package list) or missing exits with a line naming the fix, not a traceback."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if apt_get:
        (bin_dir / "apt-get").write_text(f"#!/bin/sh\n{apt_get}\n")
        (bin_dir / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(SystemExit, match=re.escape(text)):
        deb.download(tmp_path, deb.PACKAGES["docs_en"])
