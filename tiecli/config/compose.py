# Used by `tiecli train`, `tiecli info` and `tiecli sweep` to turn overrides into a config.
"""Compose the Hydra config from conf/ plus overrides, and a stored run's config over conf/'s defaults.

conf/ is the one source of default values (docs/configuration.md, "Where defaults live"): the
dataclasses of tiecli.config.schema have none. Only this package and the CLI see OmegaConf;
everything downstream gets a `Config` (tiecli.config.checks.to_config).
"""

import contextlib
import copy
import shutil
import tempfile
import typing
from pathlib import Path

import torch
import yaml
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from tiecli.config.checks import to_config, validate_launcher
from tiecli.config.messages import message, type_words, unknown_key
from tiecli.config.readers import check_read
from tiecli.config.schema import GROUPS, LIST_GROUPS, Config, LauncherConfig
from tiecli.errors import ConfigError, TiecliError
from tiecli.run.records import ADDED, flatten

# A key given without its alternative replaces the alternative's default (conf/config.yaml's scale
# with the run): train.warmup_steps=20 alone means 20 warmup steps, not train.warmup_fraction's.
ALTERNATIVES = {
    "train.warmup_steps": "train.warmup_fraction",
    "train.eval_interval": "train.evals",
    "train.checkpoint_interval": "train.checkpoints",
}


def hardware_for(device: str) -> str:
    """conf/hardware's file for hardware=auto: gpu when `device` is CUDA, or auto on a machine that has it."""
    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        return "gpu"
    return "cpu"


def _hardware(parsed: list[Override], dirs: list[Path]) -> tuple[list[Override], str]:
    """The overrides without hardware=..., and the conf/hardware file they pick (auto resolved)."""
    given = [o for o in parsed if o.key_or_group == "hardware"]
    choice = str(given[-1].value()) if given else "auto"
    options = group_options("hardware", dirs)
    if choice not in (*options, "auto"):
        raise ConfigError(f"unknown hardware {choice!r}; valid choices: auto, {', '.join(options)}")
    if choice == "auto":
        choice = hardware_for(next((str(o.value()) for o in parsed if o.key_or_group == "device"), "auto"))
    return [o for o in parsed if o.key_or_group != "hardware"], choice


def default_config_dir() -> Path:
    """conf/ inside an installed wheel (tiecli/conf), else at the top of a source checkout."""
    packaged = Path(__file__).parent.parent / "conf"
    return packaged if packaged.is_dir() else Path(__file__).parent.parent.parent / "conf"


def parse_overrides(overrides: list[str]) -> list[Override]:
    try:
        return OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as e:
        raise ConfigError(f"cannot parse overrides {' '.join(overrides)!r}: {str(e).splitlines()[0]}") from None


def group_options(group: str, config_dirs: list[Path]) -> list[str]:
    return sorted({p.stem for d in config_dirs for p in (d / group).glob("*.yaml")})


def config_dirs(config_dir: Path | None) -> list[Path]:
    """The user's folder first (its files win), then tiecli's own conf/."""
    dirs = [default_config_dir()]
    if config_dir is not None:
        config_dir = Path(config_dir).expanduser().resolve()
        if not config_dir.is_dir():
            raise ConfigError(f"--config-dir {str(config_dir)!r} is not a folder")
        dirs.insert(0, config_dir)
    return dirs


def check_choices(parsed: list[Override], config_dirs: list[Path]) -> None:
    """Unknown group choices get the list of valid ones, before Hydra's multi-line error can."""
    for o in parsed:
        if o.key_or_group in GROUPS and o.key_or_group not in LIST_GROUPS:
            options = group_options(o.key_or_group, config_dirs)
            if str(o.value()) not in options:
                raise ConfigError(f"unknown {o.key_or_group} {o.value()!r}; valid choices: {', '.join(options)}")
        if o.key_or_group in LIST_GROUPS:
            options = group_options(o.key_or_group, config_dirs)
            value = o.value()
            values = [str(v) for v in value] if isinstance(value, list) else [str(value)]
            bad = next((v for v in values if v not in options or values.count(v) > 1), None)
            if bad is not None:
                raise ConfigError(
                    f"{o.input_line!r}: {bad!r} is unknown or repeated; valid choices: {', '.join(options)} "
                    f"(several at once: {o.key_or_group}=[{','.join(options)}])"
                )


def check_unique(parsed: list[Override], where: str) -> None:
    """Hydra would let the last of two values win in silence; a key given twice is more likely a slip."""
    seen: dict[str, str | None] = {}
    for o in parsed:
        if o.key_or_group in seen:
            raise ConfigError(
                f"{o.key_or_group!r} is given twice {where} ({seen[o.key_or_group]!r} and {o.input_line!r}); "
                "give it once (`tiecli sweep KEY=a,b,c` tries several values)"
            )
        seen[o.key_or_group] = o.input_line


def compose(overrides: list[str], config_dir: Path | None = None) -> tuple[DictConfig, dict[str, str]]:
    """The composed config for single-valued overrides, and the group choices it was made from."""
    parsed = parse_overrides(overrides)
    for o in parsed:
        if o.is_sweep_override():
            raise ConfigError(
                f"{o.input_line!r} is a sweep (several values); run it with `tiecli sweep`, or give one value"
            )
        if o.is_add() or o.is_delete() or o.is_force_add():
            raise ConfigError(f"{o.input_line!r} adds or deletes a key; tiecli only changes keys conf/ defines")
    check_unique(parsed, "on the command line")
    dirs = config_dirs(config_dir)
    parsed, hardware = _hardware(parsed, dirs)
    check_choices(parsed, dirs)
    # the parser sets input_line on every Override it returns
    group_overrides = [typing.cast(str, o.input_line) for o in parsed if o.key_or_group in GROUPS]
    with _merged(dirs) as primary, initialize_config_dir(config_dir=primary, version_base=None):
        # One composition when every key exists (a sweep composes each of its jobs: this is most of a dry run's
        # time); Hydra's error for an unknown key names no valid ones, so then the files alone say which are.
        failed: ConfigError | None = None
        try:
            cfg = _hydra_compose([*(typing.cast(str, o.input_line) for o in parsed), f"hardware={hardware}"])
        except ConfigError as error:
            failed, cfg = error, _hydra_compose([*group_overrides, f"hardware={hardware}"])
        picked = {g: str(cfg.hydra.runtime.choices[g]) for g in GROUPS if g not in LIST_GROUPS}
        for o in parsed:
            if o.key_or_group not in GROUPS:
                group = o.key_or_group.split(".")[0]
                known = set(typing.cast(set[str], set(cfg[group].keys()))) if group in picked else set()
                check_read(typing.cast(str, o.input_line), o.key_or_group, picked, known, dirs)
                _check_key(cfg, o.key_or_group)
        if failed:
            raise failed
    given = {o.key_or_group for o in parsed}
    for key, other in ALTERNATIVES.items():
        if key in given and other not in given:
            OmegaConf.update(cfg, other, None)
    choices = {g: cfg.hydra.runtime.choices[g] for g in GROUPS if g not in LIST_GROUPS}
    # Hydra records no choice for a list; str() of the parsed value is what `--resume` compares it with.
    choices |= {o.key_or_group: str(o.value()) for o in parsed if o.key_or_group in LIST_GROUPS}
    with open_dict(cfg):
        del cfg["hydra"]
    _check_resolvable(cfg)
    return cfg, choices


def _check_resolvable(cfg: DictConfig) -> None:
    """Callers name the run and write config.yaml before to_config, and both resolve interpolations."""
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        raise ConfigError(message(e, cfg)) from None


@contextlib.contextmanager
def _merged(dirs: list[Path]):
    """One config folder in which the user's files replace tiecli's of the same name.

    Hydra's search path would put a user folder after the primary one, so tiecli's model/micro.yaml
    would still win over the user's; a merged copy (a few dozen small files) keeps the user's.
    """
    if len(dirs) == 1:
        yield str(dirs[0])
        return
    with tempfile.TemporaryDirectory(prefix="tiecli-conf-") as tmp:
        for d in reversed(dirs):
            shutil.copytree(d, tmp, dirs_exist_ok=True)
        yield tmp


def _hydra_compose(overrides: list[str]) -> DictConfig:
    try:
        return hydra_compose("config", overrides=overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(" ".join(str(e).split())) from None


def _check_key(cfg: DictConfig, key: str) -> None:
    """Checked against the composed files rather than `Composed`: tying.rank exists only for tying=hybrid."""
    parts = key.split(".")
    node = cfg
    for i, part in enumerate(parts):
        if not isinstance(node, DictConfig):
            raise ConfigError(
                f"unknown config key {key!r}: {'.'.join(parts[:i])!r} is a single value, not a group of keys"
            )
        keys = sorted(
            typing.cast(set[str], set(node.keys())) - {"hydra"}
        )  # not `part in node`: that is False for a key set to null or ???
        if part not in keys and i == 1 and parts[0] in LIST_GROUPS:  # logger.wandb.project without logger=[wandb]
            raise ConfigError(f"{key!r} sets a {parts[0]} that is not picked; add {parts[0]}=[{part}]")
        if part not in keys:
            raise ConfigError(unknown_key(".".join(parts[: i + 1]), keys))
        node = OmegaConf.select(
            node, part, throw_on_resolution_failure=False
        )  # a bad interpolation is to_config's to report


def from_run(stored: dict, choices: dict[str, str], path: Path) -> Config:
    """A run's config.yaml (`stored`, parsed from `path`) with its group choices (overrides.yaml's) as a checked
    Config; TiecliError naming the file when it is not one."""
    try:
        return to_config(recompose(stored, choices))
    except ConfigError as e:
        raise TiecliError(f"{str(path)!r} is not a valid tiecli config: {e}") from None


def recompose(stored: dict, choices: dict[str, str]) -> DictConfig:
    """A run's stored config composed as a new run's is: conf/'s defaults for its group choices, its values on top.

    A run directory keeps the config it was trained with, and a newer tiecli must still read it
    (eval, sample, geometry, --resume). A key conf/ gained since takes conf/'s default for the run's
    own group choices (a tracker off, tokenizer processes, a sample length of 0), or ADDED's value
    where that default would change what the run does. Its stored values always win; a key it has that
    conf/ no longer defines is still refused, by name, when the config is checked.
    """
    try:
        defaults, _ = compose([f"{g}={v}" for g, v in choices.items() if g in GROUPS and g not in LIST_GROUPS])
    except ConfigError:  # a choice conf/ no longer has: check the stored config as it is
        return OmegaConf.create(stored)
    OmegaConf.set_struct(defaults, False)
    for key, old in ADDED.items():
        if OmegaConf.select(OmegaConf.create(stored), key, default="__absent__") == "__absent__":
            OmegaConf.update(defaults, key, old)
    return typing.cast(DictConfig, OmegaConf.merge(defaults, stored))


# --- `tiecli train --resume`: a resumed run trains with its own config.yaml; overrides may only extend it. ---
# Retyping the overrides is never needed. They may change the keys that do not alter what was already trained
# (EXTENDABLE, and every diag.* key); any other key or group must keep its value. Extending train.max_steps or
# train.max_tokens recomputes the cosine schedule over the new total: from the resume step on, the learning rate
# is the new schedule's.

EXTENDABLE = (
    "train.max_steps",
    "train.max_tokens",
    "train.keep_checkpoints",  # how many past checkpoints stay on disk: nothing the run trains on
    "train.eval_interval",
    "train.evals",
    "train.eval_batches",
    "train.log_interval",
    "train.checkpoint_interval",
    "train.checkpoints",
    "eval.test",
)
EXTENDABLE_PREFIXES = ("diag.",)


def fixed_changes(old: dict, new: dict) -> list[str]:
    """The flattened keys whose value differs between two configs and that --resume may not change."""
    changed = sorted(key for key in old.keys() | new.keys() if old.get(key) != new.get(key))
    return [key for key in changed if key not in EXTENDABLE and not key.startswith(EXTENDABLE_PREFIXES)]


def resume_config(stored: DictConfig, choices: dict[str, str], overrides: list[str]) -> DictConfig:
    """The stored config with the overrides applied; ConfigError naming the first key they may not change."""
    cfg = copy.deepcopy(stored)
    parsed = parse_overrides(overrides)
    check_unique(parsed, "on the command line")  # as for a new run: the last of two values never wins in silence
    for o in parsed:
        key = o.key_or_group
        if key in GROUPS:
            if str(o.value()) != choices.get(key):
                raise ConfigError(
                    f"this run was trained with {key}={choices.get(key)}; --resume cannot change it "
                    "(start a new run with another --name)"
                )
            continue
        if OmegaConf.select(cfg, key, default="__absent__") == "__absent__":
            raise ConfigError(f"unknown config key {key!r} in this run's config.yaml")
        OmegaConf.update(cfg, key, o.value(), merge=False)
    old = flatten(typing.cast(dict, OmegaConf.to_container(stored, resolve=True)))
    new = flatten(typing.cast(dict, OmegaConf.to_container(cfg, resolve=True)))
    changed = fixed_changes(old, new)
    if changed:
        key = changed[0]
        raise ConfigError(
            f"{key} was {old.get(key)!r} in this run; --resume may only change "
            f"{', '.join(EXTENDABLE)} and diag.* keys (start a new run with another --name)"
        )
    return cfg


def compose_launcher(name: str, overrides: list[str], config_dir: Path | None = None) -> LauncherConfig:
    """conf/launcher/NAME.yaml (the first config dir that has it) with `launcher.KEY=VALUE` overrides, checked."""
    dirs = config_dirs(config_dir)
    options = group_options("launcher", dirs)
    if name not in options:
        raise ConfigError(f"unknown --launcher {name!r}; valid launchers: {', '.join(options)}")
    path = next(d / "launcher" / f"{name}.yaml" for d in dirs if (d / "launcher" / f"{name}.yaml").is_file())
    file = OmegaConf.create({"launcher": _read_yaml(path)})
    kind = _launcher_kind(file.launcher, path)
    parsed = parse_overrides(overrides)
    check_unique(parsed, "on the command line")
    for o in parsed:
        if o.is_sweep_override():
            raise ConfigError(f"{o.input_line!r}: a launcher setting takes one value")
        _check_key(file, o.key_or_group)
        OmegaConf.update(file, o.key_or_group, o.value(), merge=False)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(LauncherConfig), file.launcher, {"kind": kind})
        launcher = typing.cast(LauncherConfig, OmegaConf.to_object(merged))
    except OmegaConfBaseException as e:
        hint: typing.Any = LauncherConfig
        for part in str(e.full_key).split("."):  # the key's type, through the `X | None` of each section
            hint = typing.get_type_hints(next(t for t in typing.get_args(hint) or (hint,) if t is not type(None)))[part]
        raise ConfigError(
            f"launcher.{e.full_key}={e.value!r} has the wrong type; expected {type_words(hint)}"
        ) from None
    validate_launcher(launcher)
    return launcher


def _launcher_kind(file: DictConfig, path: Path) -> str:
    """Which launcher runs the jobs of a conf/launcher file, by the keys it has, as tiecli's own three files differ:
    slurm: keys submit to SLURM, local: keys with a time limit (timeout_min) go through submitit, other local: keys
    are subprocesses of the sweep."""
    keys = sorted(typing.cast(set[str], set(file.keys())))
    if keys == ["slurm"]:
        return "submitit_slurm"
    if keys == ["local"]:
        local = file.local
        return "submitit_local" if isinstance(local, DictConfig) and "timeout_min" in local.keys() else "basic"
    raise ConfigError(
        f"{str(path)!r} has keys {', '.join(keys) or 'none'}; a launcher file has local: keys "
        "(basic, submitit_local) or slurm: keys (submitit_slurm), as tiecli's conf/launcher/ files"
    )


def _read_yaml(path: Path) -> dict:
    """A conf/ file read as it is (no Hydra defaults list); TiecliError naming it when unreadable or not a mapping."""
    what = f"{str(path)!r}: {path.name}"
    try:
        obj = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise TiecliError(f"{what} is unreadable ({type(e).__name__})") from None
    if not isinstance(obj, dict):
        raise TiecliError(f"{what} is not a mapping")
    return obj


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)
