# Used by `tiecli train` (diag.pairs), `tiecli geometry` and `tiecli geometry --model`: which token pairs are
# forms of one word, for the related-form claims (R3, R4).
"""Related word forms as pairs of token ids: English suffix rules, or a pairs file.

Without a pairs file, `english_form_pairs` pairs single tokens by a handful of English suffix rules
(walk/walks, make/making). A pairs file lists word pairs, one per line, in any language; the shipped
ones live in conf/pairs/<name>.tsv and `pairs_file` resolves a name to them. `form_pairs` picks one of
the two for a tokenizer. The metrics over the pairs are in tiecli/measure/geometry.py (pair_contrast) and
tiecli/measure/diagnostics.py (pair gradients).
"""

from collections.abc import Callable
from pathlib import Path

import tiktoken

from tiecli.config.compose import default_config_dir
from tiecli.data import tokenizer
from tiecli.errors import TiecliError

_VOWELS = frozenset("aeiouAEIOU")


def _ends_cvc(word: str) -> bool:
    """Consonant-vowel-consonant ending (stop, plan), whose final consonant doubles."""
    c3, v, c1 = word[-3], word[-2], word[-1]
    return c3 not in _VOWELS and v in _VOWELS and c1 not in _VOWELS and c1 not in "wxyWXY"


def _inflections(word: str) -> list[str]:
    """Candidate inflected forms of an English word by a handful of suffix rules."""
    forms = [word + "s", word + "ed", word + "ing"]  # walks, walked, walking
    if word.endswith(("s", "x", "z", "ch", "sh", "o")):
        forms.append(word + "es")  # boxes, goes
    if word.endswith("e") and not word.endswith("ee"):
        forms.append(word + "d")  # liked
        if len(word) > 3:  # making keeps "mak"; a 3-letter base would pair the/thing, use/using
            forms.append(word[:-1] + "ing")
    if word.endswith("y") and word[-2] not in _VOWELS:
        forms += [word[:-1] + "ied", word[:-1] + "ies"]  # tried, tries
    if len(word) >= 3 and _ends_cvc(word):
        forms += [word + word[-1] + "ed", word + word[-1] + "ing"]  # stopped, stopping
    return forms


def english_form_pairs(token_strings: list[str | None]) -> list[tuple[int, int]]:
    """Pairs (base id, form id) of single tokens that are forms of one English word:
    + s / ed / ing, + es after s x z ch sh o, e-drop (make/making, like/liked), y -> ied / ies
    after a consonant, doubled final consonant (stop/stopped). Heuristic, by design simple;
    a curated pairs file (read_pairs_file) is the precise alternative.

    Only ASCII alphabetic words containing a vowel (y counts: "try"). In a vocabulary with
    GPT-2 style word tokens (" walk") only word-initial tokens count, since its bare pieces are
    mostly word endings ("irement"/"irements"); otherwise bare words do. The base word must have
    >= 3 letters, and the e-drop -ing form a base of >= 4: short bases are mostly word pieces
    that the rules would pair with unrelated words (be/bed, wa/was, ke/king, the/thing).
    "car" is not paired with "caring" or "cared" when "care" is a token too (the e-drop reading
    wins). Sorted, unique. token_strings[i] is token i's text, or None."""
    index: dict[str, int] = {}
    for i, s in enumerate(token_strings):
        if s is not None:
            index.setdefault(s, i)  # decoders can map several ids to one string: keep the first
    prefix = " " if any(s.startswith(" ") and s[1:].isalpha() for s in index) else ""

    pairs: set[tuple[int, int]] = set()
    for s, i in index.items():
        word = s[len(prefix) :]
        if not s.startswith(prefix) or len(word) < 3:
            continue
        if not (word.isascii() and word.isalpha() and set(word.lower()) & set("aeiouy")):
            continue
        e_word = prefix + word + "e" in index and not word.endswith("e")
        for form in _inflections(word):
            if e_word and form in (word + "ed", word + "ing"):
                continue  # "caring" belongs to "care", not "car"
            j = index.get(prefix + form)
            if j is not None:
                pairs.add((i, j))
    return sorted(pairs)


def read_pairs_file(path: str | Path, encode: Callable[[str], list[int]]) -> tuple[list[tuple[int, int]], int]:
    """Related-form pairs from a UTF-8 file, one pair per line, two words separated by a tab
    ("кошка<TAB>кошки"); '#' comment lines and blank lines are ignored. Each word pair is tried
    as-is and with a leading space (both words the same way); a variant is kept when both words
    encode to one token each, and to different tokens. Returns (unique pairs in file order,
    number of pair lines that gave no pair). A line without exactly two non-empty tab-separated
    words raises TiecliError naming the file and line."""
    try:
        with open(path, encoding="utf-8-sig") as f:  # -sig: a byte-order mark (Windows editors) is not a word
            lines = [line.rstrip("\r\n") for line in f]  # only \n, \r\n, \r end a line
    except (OSError, UnicodeDecodeError) as e:
        raise TiecliError(f"cannot read pairs file {path}: {e}") from None

    pairs: dict[tuple[int, int], None] = {}  # dict as an ordered set
    skipped = 0
    for lineno, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        words = [w.strip() for w in line.split("\t")]
        if len(words) != 2 or not all(words):
            raise TiecliError(f"{path}:{lineno}: expected two tab-separated words, got {line!r}")
        found = False
        for prefix in ("", " "):
            a, b = encode(prefix + words[0]), encode(prefix + words[1])
            if len(a) == 1 and len(b) == 1 and a[0] != b[0]:
                pairs[(a[0], b[0])] = None
                found = True
        skipped += not found
    return list(pairs), skipped


def pairs_file(name: str) -> Path:
    """The pairs file that diag.pairs / --pairs names: a bare name (letters, digits, _ and -, as
    "en") is a file shipped in conf/pairs/<name>.tsv; anything else is a path ("./en" for a file
    called en)."""
    if not name.replace("-", "").replace("_", "").isalnum():
        return Path(name).expanduser()
    shipped = default_config_dir() / "pairs"
    path = shipped / f"{name}.tsv"
    if not path.is_file():
        choices = ", ".join(sorted(p.stem for p in shipped.glob("*.tsv")))
        raise TiecliError(
            f"no shipped pairs file {name!r} (shipped: {choices}); give a path such as ./{name} for your own file"
        )
    return path


def form_pairs(enc: tiktoken.Encoding, path: str | None) -> tuple[list[tuple[int, int]], dict]:
    """Related-form token pairs and where they came from: a shipped or user's file, else English suffix rules."""
    if path is None:
        pairs = english_form_pairs(tokenizer.token_strings(enc))
        return pairs, {"source": "english suffix rules", "found": len(pairs)}
    pairs, skipped = read_pairs_file(pairs_file(str(path)), enc.encode_ordinary)
    return pairs, {"source": str(path), "found": len(pairs), "skipped_lines": skipped}
