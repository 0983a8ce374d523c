# Used by `tiecli sweep study=NAME`: a study file, checked, and the rules it gives some of its jobs.
"""A study: conf/study/NAME.yaml (the first config dir that has it), a sweep with a name.

description  one line, shown by --dry-run and kept in the manifest
axes         key: [values], the swept settings (key: value is one value)
fixed        key: value, the same for every job
when         rules giving the jobs whose axes take `match`'s values the settings in `set`
             (how a study runs each tying mode at its own learning rate)
add          rules repeating the jobs whose axes take `match`'s values for more values of some axes
             (more seeds on the primary comparison)
families     name: [claim, ...], the report's Holm families, carried to it by sweep.json
"""

from collections.abc import Sequence
from pathlib import Path

import yaml

from tiecli.config.compose import group_options, parse_overrides
from tiecli.errors import ConfigError, TiecliError
from tiecli.formats import typed

STUDY_KEYS = ("description", "axes", "fixed", "when", "add", "families")


def load_study(name: str, dirs: list[Path]) -> tuple[str, list[str], list[dict], dict]:
    """conf/study/NAME.yaml (the first config dir that has it): its description, its command-line overrides, its
    `when` rules and the rest the manifest keeps: `add` (more values of an axis for some jobs) and `families`."""
    path = next((d / "study" / f"{name}.yaml" for d in dirs if (d / "study" / f"{name}.yaml").is_file()), None)
    if path is None:
        raise ConfigError(f"unknown study {name!r}; valid studies: {', '.join(group_options('study', dirs)) or 'none'}")
    try:
        study = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeys)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{str(path)!r} is not UTF-8 text (byte {e.start} is {e.object[e.start]:#04x})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{str(path)!r} is not valid YAML: {' '.join(str(e).split())}") from None
    if not study:
        raise ConfigError(f"{str(path)!r} is empty; a study gives at least its axes (key: [values]) or fixed settings")
    if (
        not isinstance(study, dict)
        or set(study) - set(STUDY_KEYS)
        or not all(isinstance(study.get(k) or {}, dict) for k in ("axes", "fixed"))
    ):
        raise ConfigError(
            f"{str(path)!r}: a study is a mapping with description, axes (key: [values]), fixed (key: value), "
            "when (a list of {match: {axis: value}, set: {key: value}}), add (a list of {match: {axis: value}, "
            "axes: {axis: [values]}}) and families (name: [claim, ...])"
        )
    axes, fixed = study.get("axes") or {}, study.get("fixed") or {}
    lines = [f"{k}={','.join(map(typed, v)) if isinstance(v, list) else typed(v)}" for k, v in axes.items()]
    lines += [f"{k}={typed(v)}" for k, v in fixed.items()]
    for line in lines[len(axes) :]:
        if any(o.is_sweep_override() for o in parse_overrides([line])):
            raise ConfigError(f"study {name!r}: fixed setting {line!r} has several values; move it under axes")
    extra: dict = {"add": _additions(name, study.get("add") or [], axes)}
    if study.get("families") is not None:
        extra["families"] = _families(name, study["families"])
    rules = _rules(name, study.get("when") or [], _with_added(axes, extra["add"]), fixed)
    return str(study.get("description") or ""), lines, rules, extra


class _UniqueKeys(yaml.SafeLoader):
    """yaml.safe_load's loader, refusing a key given twice in one mapping (YAML would keep the last in silence)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _with_added(axes: dict, add: list[dict]) -> dict:
    """The axes with the values the `add` rules bring, which `when` rules may match too (a rate added for one
    tying mode gets its own min_lr)."""
    out = {k: list(v) if isinstance(v, list) else v for k, v in axes.items()}
    for rule in add:
        for key, values in rule["axes"].items():
            if isinstance(out[key], list):
                out[key] += [v for v in values if v not in map(typed, out[key])]
    return out


def _families(name: str, spec) -> dict[str, list[str]]:
    """A study's Holm families, checked against the claims the report judges; sweep.json carries them to the report."""
    from tiecli.report.claims import parse_families  # scipy, loaded only for a study that declares families

    try:
        return {k: list(v) for k, v in parse_families(spec, f"study {name!r}").items()}
    except TiecliError as e:
        raise ConfigError(str(e)) from None


def _check_match(where: str, match: dict, axes: dict) -> None:
    """A rule's match names axes of the study, each with one of its values."""
    for key, value in match.items():
        values = axes.get(key)
        if values is None:
            raise ConfigError(f"{where}: matches {key!r}, which is not an axis; the axes are {', '.join(axes)}")
        values = values if isinstance(values, list) else [values]
        if not any(_same(typed(v), value) for v in values):  # as the jobs are matched: 1e-3 is 0.001
            shown = ", ".join(map(typed, values))
            raise ConfigError(f"{where}: {key}={value} is not one of the axis's values: {shown}")


def _additions(name: str, add, axes: dict) -> list[dict]:
    """A study's `add` rules, checked: each repeats the jobs whose axes take `match`'s values for more values of
    some axes (more seeds on the primary comparison); `match` may be empty (every job), and may name a value an
    earlier rule brings (more seeds at a rate added for one size), as the rules apply in order."""
    rules: list[dict] = []
    for i, rule in enumerate(add if isinstance(add, list) else [add], 1):
        where = f"study {name!r}, add rule {i}"
        if (
            not isinstance(rule, dict)
            or set(rule) - {"match", "axes"}
            or not isinstance(rule.get("match") or {}, dict)
            or not isinstance(rule.get("axes"), dict)
            or not rule["axes"]
            or not all(isinstance(v, list) and v for v in rule["axes"].values())
        ):
            raise ConfigError(f"{where}: a rule is {{match: {{axis: value, ...}}, axes: {{axis: [values], ...}}}}")
        match = {k: typed(v) for k, v in (rule.get("match") or {}).items()}
        _check_match(where, match, _with_added(axes, rules))
        for key in rule["axes"]:
            if key not in axes:
                raise ConfigError(
                    f"{where}: adds values to {key!r}, which is not an axis; the axes are {', '.join(axes)}"
                )
        rules.append({"match": match, "axes": {k: list(map(typed, v)) for k, v in rule["axes"].items()}})
    return rules


def _rules(name: str, when, axes: dict, fixed: dict) -> list[dict]:
    """A study's `when` rules, checked: each matches axis values the study has and sets keys it does not sweep or fix.

    A rule gives the jobs whose axes take all of `match`'s values the settings in `set`: how a
    study runs each tying mode at its own learning rate.
    """
    rules = []
    for i, rule in enumerate(when if isinstance(when, list) else [when], 1):
        where = f"study {name!r}, when rule {i}"
        if (
            not isinstance(rule, dict)
            or set(rule) != {"match", "set"}
            or not all(isinstance(rule[k], dict) and rule[k] for k in rule)
        ):
            raise ConfigError(f"{where}: a rule is {{match: {{axis: value, ...}}, set: {{key: value, ...}}}}")
        match = {k: typed(v) for k, v in rule["match"].items()}
        _check_match(where, match, axes)
        settings = [f"{k}={typed(v)}" for k, v in rule["set"].items()]
        for key in rule["set"]:
            if key in axes or key in fixed:
                raise ConfigError(f"{where}: sets {key!r}, which the study already sweeps or fixes")
        if any(o.is_sweep_override() for o in parse_overrides(settings)):
            raise ConfigError(f"{where}: a rule sets one value per key; {settings} has several")
        rules.append({"match": match, "set": settings})
    return rules


def apply_rules(combo: list[str], rules: list[dict]) -> list[str]:
    """One job's override lines followed by the settings of every rule that matches it."""
    added = [line for rule in rules if matches(combo, rule["match"]) for line in rule["set"]]
    keys = [line.split("=", 1)[0] for line in added]
    twice = next((k for k in keys if keys.count(k) > 1), None)
    if twice:
        raise ConfigError(f"two when rules set {twice} for the job {' '.join(combo)}; make their matches exclusive")
    return combo + added


def unmatched(study: dict | None, jobs: Sequence[Sequence[str]]) -> list[str]:
    """A note for each `when` rule no job takes (the command line narrowed the axis it matches)."""
    rules = (study or {}).get("when", [])
    return [
        f"note: study {study['name']!r}, when rule {i} ({' '.join(f'{k}={v}' for k, v in rule['match'].items())}) "
        "matches no job of this sweep"
        for i, rule in enumerate(rules, 1)
        if study and not any(matches(job, rule["match"]) for job in jobs)
    ]


def matches(job: Sequence[str], match: dict) -> bool:
    """Whether a job (its override lines) takes every value of a rule's match."""
    values = dict(line.split("=", 1) for line in job if "=" in line)
    return all(_same(values.get(k), v) for k, v in match.items())


def _same(given: str | None, wanted: str) -> bool:
    """Whether an axis value matches a rule's: as text, or as numbers (1e-3 on the command line is 0.001)."""
    if given is None:
        return False
    try:
        return given == wanted or float(given) == float(wanted)
    except ValueError:
        return False
