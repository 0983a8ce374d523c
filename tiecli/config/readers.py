# Used by `tiecli train`, `tiecli info` and `tiecli sweep` (through compose): which choice of a group reads a key.
"""Which keys of a group each choice reads, told by conf/'s files themselves, so an override is never ignored.

A choice's file (conf/GROUP/CHOICE.yaml) holds the keys it reads. A key that only other choices read
is either absent from it (conf/tying/tied.yaml has no `shared_fraction`) or kept at null with a
comment that starts with `unused` (conf/data/shakespeare.yaml's `path: null  # unused: ...`), so that
every run's config.yaml has the same data and tokenizer keys, which `tiecli report` groups runs by.
Either way an override of such a key is refused, naming the choices that read it. The key that names
the choice itself (`data.name`, `tokenizer.name`, `tying.mode`: the file's own name in each of tiecli's
files) changes only with the choice (`data=textfile`). A new group file, or a new key in one (a user's
--config-dir included), is covered by writing it so; nothing here lists keys.
"""

import functools
import re
from pathlib import Path

import yaml

from tiecli.errors import ConfigError

UNUSED = re.compile(r"^([A-Za-z_]\w*):[^#\n]*#\s*unused\b", re.MULTILINE)


@functools.cache
def _file_keys(path: Path, mtime_ns: int) -> tuple[dict, frozenset[str]]:
    """A group file's top-level keys and values, and those marked `# unused`; cached per file version
    (a sweep composes every job with the same few files)."""
    text = path.read_text(encoding="utf-8")
    loaded = yaml.safe_load(text)
    return (loaded if isinstance(loaded, dict) else {}), frozenset(UNUSED.findall(text))


def file_keys(group: str, choice: str, dirs: list[Path]) -> tuple[dict, frozenset[str]]:
    """conf/GROUP/CHOICE.yaml's keys and values and its keys marked unused, from the first of `dirs` that has it."""
    path = next((d / group / f"{choice}.yaml" for d in dirs if (d / group / f"{choice}.yaml").is_file()), None)
    if path is None:
        return {}, frozenset()
    try:
        return _file_keys(path, path.stat().st_mtime_ns)
    except (OSError, ValueError, yaml.YAMLError):  # Hydra's composition names an unreadable file
        return {}, frozenset()


def choices_of(group: str, dirs: list[Path]) -> list[str]:
    return sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml")})


def readers(group: str, key: str, dirs: list[Path]) -> list[str]:
    """The choices of `group` whose files read `key` (hold it, not marked unused)."""
    found = []
    for choice in choices_of(group, dirs):
        keys, unused = file_keys(group, choice, dirs)
        if key in keys and key not in unused:
            found.append(choice)
    return found


@functools.cache
def naming_key(group: str, own: Path) -> str | None:
    """The key whose value is the file's own name in every one of tiecli's files of the group (data.name,
    tying.mode); `own`: tiecli's conf/, which does not change while tiecli runs."""
    names = choices_of(group, [own])
    named = [{k for k, v in file_keys(group, n, [own])[0].items() if v == n} for n in names]
    common = set.intersection(*named) if named else set()
    return min(common) if common else None


def check_read(line: str, key: str, choices: dict[str, str], known: set[str], dirs: list[Path]) -> None:
    """Refuse the override `line` of `key` when the group choice picked does not read it.

    choices: the group choices composed; known: the keys the composed config has under the key's group.
    A key no choice has is left to the caller's unknown-key message.
    """
    group, _, rest = key.partition(".")
    if group not in choices or not rest:
        return
    name, choice = rest.split(".")[0], choices[group]
    if name == naming_key(group, dirs[-1]):  # dirs[-1]: tiecli's own conf/
        raise ConfigError(
            f"{line!r}: {group}.{name} names the {group} choice itself; pick one with {group}=CHOICE "
            f"({', '.join(choices_of(group, dirs))})"
        )
    unused = file_keys(group, choice, dirs)[1]
    if name in known and name not in unused:
        return
    others = [c for c in readers(group, name, dirs) if c != choice]
    if not others and name in unused:
        raise ConfigError(f"{line!r}: {group}={choice} does not read {group}.{name} (its file marks it unused)")
    if not others:
        return
    named = [f"{group}={c}" for c in others]
    which = f"{named[0]} only" if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"
    add = f"add {named[0]}" if len(named) == 1 else "pick one of those"
    raise ConfigError(
        f"{line!r}: {group}.{name} is read by {which}, not by {group}={choice} (the {group} picked); {add}"
    )
