"""Names: a run's default name from its config, and the one check of a name the user gives (train's and sweep's --name)."""

import hashlib
import re
import typing
from pathlib import Path

from omegaconf import DictConfig

from tiecli.config.compose import parse_overrides
from tiecli.config.schema import GROUPS
from tiecli.errors import ConfigError, TiecliError

NAME_CHARS = "A-Za-z0-9._-"  # shell-safe without quoting, and the same on every file system
NAME_LIMIT = 80


def run_name(choices: dict[str, str], cfg: DictConfig, overrides: list[str]) -> str:
    """A short, shell-safe run name, unique per setting: group choices, seed, then a hash of any other overrides.

    e.g. micro-untied-bpe4096-shakespeare-s0-3f9a1c2e; overrides.yaml keeps the overrides themselves.
    """
    tok = choices["tokenizer"] + (str(cfg.tokenizer.vocab_size) if choices["tokenizer"] == "bpe" else "")
    path = (
        cfg.data.get("path") or cfg.data.get("files") or cfg.data.get("hub")
    )  # its stem to read, a hash of the whole path to keep a/x.txt and b/x.txt apart
    data = choices["data"] + (f"_{Path(str(path)).stem[:24]}-{_hash(str(path), 6)}" if path else "")
    readable = f"{choices['model']}-{choices['tying']}-{tok}-{data}-s{cfg.seed}"
    named = {*GROUPS, "seed", "tokenizer.vocab_size", "data.path", "data.files", "data.hub"}
    extras = sorted(
        typing.cast(str, o.input_line)
        for o in parse_overrides(overrides)
        if o.key_or_group not in named and not o.key_or_group.startswith("logger.")  # trackers change nothing trained
    )
    name = re.sub(f"[^{NAME_CHARS}]", "_", readable)
    if len(name) > NAME_LIMIT - 9:  # long choice names (a --config-dir's): cut, and keep apart by the hash
        name, extras = name[: NAME_LIMIT - 9], [readable, *extras]
    return name + "-" + _hash("\n".join(extras), 8) if extras else name


def _hash(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def check_name(name: str, sweep: bool = False) -> None:
    """A --name: NAME_CHARS only, so the folder can be typed in any shell as is; a run's may also hold / to nest it
    in a folder under the runs directory (a sweep's folder is always runs/sweeps/NAME)."""
    bad = sorted(set(re.sub(f"[{'' if sweep else '/'}{NAME_CHARS}]", "", name)))
    if sweep and (bad or not name):
        raise ConfigError(f"--name {name!r} may only hold letters, digits, '.', '_' and '-'")
    if bad:
        raise TiecliError(
            f"run name {name!r} holds {''.join(bad)!r}; a run name may hold only A-Z a-z 0-9 . _ - "
            "(and / to nest it in a folder)"
        )
