"""What OmegaConf and the schema refuse, reworded into one line that names the key, its value and what is valid.

OmegaConf's own messages span several lines and name its internals (object types, full tracebacks of
interpolations); the CLI prints one line per error.
"""

import dataclasses
import re
import types
import typing

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    ConfigKeyError,
    GrammarParseError,
    InterpolationResolutionError,
    OmegaConfBaseException,
    ValidationError,
)

from tiecli.config.schema import Composed


def unknown_key(key: str, valid: list[str]) -> str:
    parent = key.rpartition(".")[0]
    return f"unknown config key {key!r}; valid keys {f'under {parent!r}' if parent else 'at the top level'}: {', '.join(valid)}"


def message(e: OmegaConfBaseException, cfg: DictConfig) -> str:
    """One line, naming the key and its value, for what OmegaConf refused (its own text spans lines)."""
    key = e.full_key or ""
    if isinstance(e, ConfigKeyError) and dataclasses.is_dataclass(e.object_type):
        return unknown_key(key, sorted(f.name for f in dataclasses.fields(e.object_type)))
    if isinstance(e, (InterpolationResolutionError, GrammarParseError)) and not isinstance(e, ValidationError):
        return f"{key}={_raw(cfg, key)!r} cannot be resolved: {(e.msg or str(e)).splitlines()[0]}"
    if isinstance(e, ValidationError) and key:
        expected = _expected(key)
        value = f"{_raw(cfg, key)!r} (= {e.value!r})" if isinstance(e, InterpolationResolutionError) else repr(e.value)
        if dataclasses.is_dataclass(expected):
            return f"{key}={value} must be a group of keys (e.g. {key}.KEY=VALUE), not a single value"
        return f"{key}={value} has the wrong type; expected {type_words(expected)}"
    return " ".join(str(e).split())


def _raw(cfg: DictConfig, key: str):
    """The value at `key` as written, interpolations unresolved."""
    node = OmegaConf.to_container(cfg, resolve=False)
    for part in re.findall(r"\w+", key):
        if isinstance(node, list):
            node = node[int(part)]
        elif isinstance(node, dict):
            node = node.get(part)
    return node


def _expected(key: str):
    """The type `Composed` gives `key`, e.g. eval.buckets[0] -> float."""
    hint = Composed
    for part in re.findall(r"\w+", key):
        if isinstance(hint, types.UnionType):  # an optional group of keys (logger.tensorboard): the group
            hint = next((t for t in typing.get_args(hint) if dataclasses.is_dataclass(t)), hint)
        hint = typing.get_type_hints(hint)[part] if dataclasses.is_dataclass(hint) else typing.get_args(hint)[0]
    return hint


def type_words(hint) -> str:
    if isinstance(hint, types.UnionType):
        return " or ".join("null" if t is type(None) else type_words(t) for t in typing.get_args(hint))
    if typing.get_origin(hint) is list:
        return f"a list of {type_words(typing.get_args(hint)[0])}"
    return hint.__name__
