# Used by `tiecli train`, `tiecli info` and `tiecli sweep` to turn overrides into a config.
"""Compose the Hydra config from conf/ plus overrides, check it, and convert it to dataclasses.

conf/ is the one source of default values: the dataclasses here have none, they only give each key
its type, and OmegaConf checks the composed config against them (`Composed`). Only this module and
the CLI see OmegaConf; everything downstream gets a `Config`.
"""

import contextlib
import dataclasses
import hashlib
import math
import re
import shutil
import tempfile
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import (
    ConfigKeyError,
    GrammarParseError,
    InterpolationResolutionError,
    OmegaConfBaseException,
    ValidationError,
)

from tiecli import tokenizer
from tiecli.errors import ConfigError, TiecliError
from tiecli.model import GPTConfig
from tiecli.run.files import read_yaml
from tiecli.run.layout import CONFIG
from tiecli.run.reader import RunReader
from tiecli.run.records import flatten

GROUPS = ("model", "tying", "data", "tokenizer", "logger")
LIST_GROUPS = ("logger",)  # groups of which one picks several files at once (logger=[tensorboard,wandb]), or none
WANDB_MODES = ("offline", "online", "disabled")
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "fp32", "bf16", "fp16")
COMPILE = ("auto", "true", "false")
DATA_SPLITS = ("document", "block")
SEED_LIMIT = 2**63  # torch.manual_seed takes 64 bits, read as signed or unsigned; [0, 2**63) fits both
# A key given without its alternative replaces the alternative's default (conf/config.yaml's scale
# with the run): train.warmup_steps=20 alone means 20 warmup steps, not train.warmup_fraction's.
ALTERNATIVES = {
    "train.warmup_steps": "train.warmup_fraction",
    "train.eval_interval": "train.evals",
    "train.checkpoint_interval": "train.checkpoints",
}
# Keys added after runs were written, with the value that keeps those runs' behaviour (see upgraded);
# conf/'s own defaults for them differ.
ADDED = {"train.checkpoints": None, "eval.max_tokens": None}


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
    packaged = Path(__file__).parent / "conf"
    return packaged if packaged.is_dir() else Path(__file__).parent.parent / "conf"


@dataclass
class TrainConfig:
    max_steps: int
    max_tokens: int | None
    batch_size: int
    grad_accum: int
    lr: float
    lr_embedding: float | None
    lr_output: float | None
    min_lr: float
    warmup_steps: int
    warmup_fraction: float | None
    weight_decay: float
    decay_embeddings: bool
    beta1: float
    beta2: float
    grad_clip: float
    eval_interval: int
    evals: int | None
    eval_batches: int
    log_interval: int
    checkpoint_interval: int
    checkpoints: int | None
    keep_checkpoints: int
    sample_tokens: int


@dataclass
class DataConfig:
    name: str
    path: str | None
    split: str
    val_fraction: float
    test_fraction: float
    split_seed: int
    n_blocks: int
    num_proc: int | None
    files: str | None  # data=hf only, like text_field, hub and hf_split
    text_field: str | None
    hub: str | None
    hf_split: str | None


@dataclass
class TokenizerConfig:
    name: str
    vocab_size: int
    train_bytes: int | None  # tokenizer=bpe only; None: the whole training split


@dataclass
class EvalConfig:
    buckets: list[float]
    test: bool
    max_tokens: int | None


@dataclass
class DiagConfig:
    every: int
    geometry: bool
    snapshots: bool
    max_snapshots: int
    pairs: str | None
    seed: int


@dataclass
class TensorBoardLogger:
    projector: bool
    projector_tokens: int | None


@dataclass
class WandbLogger:
    project: str
    entity: str | None
    mode: str


@dataclass
class LoggerSettings:
    """The trackers logger=[...] picked (conf/logger/*.yaml); None: that tracker is off."""

    tensorboard: TensorBoardLogger | None = None
    wandb: WandbLogger | None = None


@dataclass
class Settings:
    """Everything but the model: the same in the composed config and in `Config`."""

    train: TrainConfig
    data: DataConfig
    tokenizer: TokenizerConfig
    eval: EvalConfig
    diag: DiagConfig
    logger: LoggerSettings
    seed: int
    device: str
    dtype: str
    compile: str  # auto, true or false (a bool given on the command line arrives as "True"/"False")


@dataclass
class ModelShape:
    """conf/config.yaml's model: keys plus one conf/model/*.yaml."""

    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    dropout: float
    bias: bool


@dataclass
class TyingSettings:
    """One conf/tying/*.yaml: the mode, and the settings that only some modes have (None: not this mode's).

    compose() already refuses a key the chosen mode's file lacks, so every mode can share this one shape.
    """

    mode: str
    scale_logits: bool | None = None
    scale_inputs: bool | None = None
    shared_fraction: float | None = None
    rank: int | None = None


@dataclass
class Composed(Settings):
    """The composed config's shape (conf/config.yaml and one file per group), which OmegaConf checks."""

    model: ModelShape
    tying: TyingSettings


@dataclass
class Config(Settings):
    """What the rest of tiecli gets: the settings, and the model and tying groups with the vocabulary size."""

    model: GPTConfig

    @property
    def tokens_per_step(self) -> int:
        return self.train.batch_size * self.train.grad_accum * self.model.block_size

    @property
    def max_steps(self) -> int:
        """Optimizer steps to train: from the token budget when one is set."""
        if self.train.max_tokens is None:
            return self.train.max_steps
        return -(-self.train.max_tokens // self.tokens_per_step)

    @property
    def warmup(self) -> int:
        """Linear warmup steps: train.warmup_fraction of max_steps (rounded) when set, else train.warmup_steps."""
        t = self.train
        return t.warmup_steps if t.warmup_fraction is None else round(t.warmup_fraction * self.max_steps)

    @property
    def n_evals(self) -> int:
        """In-training evaluations after the one at step 0; the last is at max_steps.

        train.evals (at most one a step), else one every train.eval_interval steps and one at the end.
        """
        if self.train.evals is None:
            return -(-self.max_steps // self.train.eval_interval)
        return min(self.train.evals, self.max_steps)

    @property
    def eval_every(self) -> int:
        """Steps between evaluations: train.eval_interval, or with train.evals the nearest whole number
        to max_steps / n_evals (the steps are then ceil(i * max_steps / n_evals): gaps differ by one at most)."""
        if self.train.evals is None:
            return self.train.eval_interval
        return round(self.max_steps / self.n_evals)

    def evals_by(self, step: int) -> int:
        """How many in-training evaluations steps 1..step hold: `step` evaluates when this grows."""
        if step >= self.max_steps:
            return self.n_evals
        if self.train.evals is None:
            return step // self.train.eval_interval
        return step * self.n_evals // self.max_steps  # spread evenly, whatever max_steps / evals leaves over

    def is_eval_step(self, step: int) -> bool:
        return step >= 1 and self.evals_by(step) > self.evals_by(step - 1)

    def is_checkpoint_step(self, step: int) -> bool:
        """Whether last.pt is saved after `step`: train.checkpoints times spread evenly (as train.evals
        spreads evaluations), else every train.checkpoint_interval steps; always at max_steps."""
        if step >= self.max_steps:
            return True
        n = self.train.checkpoints
        if n is None:
            return step % self.train.checkpoint_interval == 0
        n = min(n, self.max_steps)
        return step >= 1 and step * n // self.max_steps > (step - 1) * n // self.max_steps


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
        base = _hydra_compose([*group_overrides, f"hardware={hardware}"])
        for o in parsed:
            if o.key_or_group not in GROUPS:
                _check_key(base, o.key_or_group)
        cfg = _hydra_compose([*(typing.cast(str, o.input_line) for o in parsed), f"hardware={hardware}"])
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
        raise ConfigError(_message(e, cfg)) from None


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
            raise ConfigError(_unknown_key(".".join(parts[: i + 1]), keys))
        node = OmegaConf.select(
            node, part, throw_on_resolution_failure=False
        )  # a bad interpolation is to_config's to report


def _unknown_key(key: str, valid: list[str]) -> str:
    parent = key.rpartition(".")[0]
    return f"unknown config key {key!r}; valid keys {f'under {parent!r}' if parent else 'at the top level'}: {', '.join(valid)}"


def from_dict(stored: dict, run: Path) -> Config:
    """A run directory's config.yaml (parsed) as a checked Config; TiecliError naming the file when it is not one."""
    try:
        return to_config(upgraded(stored, RunReader(run).overrides().get("choices", {})))
    except ConfigError as e:
        raise TiecliError(f"{str(Path(run) / CONFIG)!r} is not a valid tiecli config: {e}") from None


def upgraded(stored: dict, choices: dict[str, str]) -> DictConfig:
    """A run's stored config plus the keys conf/ gained since it was written, at their defaults.

    A run directory keeps the config it was trained with, and a newer tiecli must still read it
    (eval, sample, geometry, --resume). Keys are only ever added with a default that keeps the old
    behaviour (a tracker off, tokenizer processes, a sample length of 0), so the default for the run's
    own group choices stands in for what it lacks. Its stored values always win; a key it has that
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


def to_config(cfg: DictConfig) -> Config:
    """The composed DictConfig as dataclasses, with every key, type and value checked."""
    composed = _check_types(cfg)
    _check_finite(composed)
    settings = {f.name: getattr(composed, f.name) for f in dataclasses.fields(Settings)}
    settings["compile"] = settings["compile"].lower()
    config = Config(**settings, model=_gpt_config(composed))
    _validate(config)
    return config


def _check_types(cfg: DictConfig) -> Composed:
    """`cfg` merged into the `Composed` schema: OmegaConf refuses unknown keys and wrong types."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Composed), cfg)
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise ConfigError(f"{missing[0]} is required: add {missing[0]}=VALUE to the command")
        return typing.cast(Composed, OmegaConf.to_object(merged))
    except OmegaConfBaseException as e:
        raise ConfigError(_message(e, cfg)) from None


def _message(e: OmegaConfBaseException, cfg: DictConfig) -> str:
    """One line, naming the key and its value, for what OmegaConf refused (its own text spans lines)."""
    key = e.full_key or ""
    if isinstance(e, ConfigKeyError) and dataclasses.is_dataclass(e.object_type):
        return _unknown_key(key, sorted(f.name for f in dataclasses.fields(e.object_type)))
    if isinstance(e, (InterpolationResolutionError, GrammarParseError)) and not isinstance(e, ValidationError):
        return f"{key}={_raw(cfg, key)!r} cannot be resolved: {(e.msg or str(e)).splitlines()[0]}"
    if isinstance(e, ValidationError) and key:
        expected = _expected(key)
        value = f"{_raw(cfg, key)!r} (= {e.value!r})" if isinstance(e, InterpolationResolutionError) else repr(e.value)
        if dataclasses.is_dataclass(expected):
            return f"{key}={value} must be a group of keys (e.g. {key}.KEY=VALUE), not a single value"
        return f"{key}={value} has the wrong type; expected {_type_words(expected)}"
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


def _type_words(hint) -> str:
    if isinstance(hint, types.UnionType):
        return " or ".join("null" if t is type(None) else _type_words(t) for t in typing.get_args(hint))
    if typing.get_origin(hint) is list:
        return f"a list of {_type_words(typing.get_args(hint)[0])}"
    return hint.__name__


def _check_finite(composed: Composed) -> None:
    """Refuse inf and nan first: inf passes checks such as weight_decay >= 0, and nan fails them misleadingly."""
    for key, value in flatten(dataclasses.asdict(composed)).items():
        numbers = value if isinstance(value, list) else [value]
        if any(isinstance(x, float) and not math.isfinite(x) for x in numbers):
            raise ConfigError(f"{key}={value} must be finite (not inf or nan)")


def _gpt_config(composed: Composed) -> GPTConfig:
    vocab_size = tokenizer.vocab_size(composed.tokenizer.name, composed.tokenizer.vocab_size)
    # conf/ gives each mode only its own settings; GPTConfig's stand-ins fill the other modes' (None here).
    tying = {k: v for k, v in dataclasses.asdict(composed.tying).items() if k != "mode" and v is not None}
    try:
        return GPTConfig(
            vocab_size=vocab_size, tying=composed.tying.mode, **dataclasses.asdict(composed.model), **tying
        )
    except ValueError as e:
        raise ConfigError(f"invalid model or tying settings: {e}") from None


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _validate(c: Config) -> None:
    need = _need
    _validate_train(c.train)
    device_ok = c.device in DEVICES or re.fullmatch(r"cuda:\d+", c.device)
    need(bool(device_ok), f"device={c.device!r} is not valid; choose one of {', '.join(DEVICES)} or cuda:N")
    need(c.dtype in DTYPES, f"dtype={c.dtype!r} is not valid; choose one of {', '.join(DTYPES)}")
    need(c.compile in COMPILE, f"compile={c.compile!r} is not valid; choose one of {', '.join(COMPILE)}")
    for key, seed in (("seed", c.seed), ("data.split_seed", c.data.split_seed), ("diag.seed", c.diag.seed)):
        need(0 <= seed < SEED_LIMIT, f"{key}={seed} is not valid; a seed is an integer in [0, 2**63)")
    need(
        c.data.split in DATA_SPLITS, f"data.split={c.data.split!r} is not valid; choose one of {', '.join(DATA_SPLITS)}"
    )
    fractions = c.data.val_fraction + c.data.test_fraction
    need(
        0 < c.data.val_fraction and 0 < c.data.test_fraction and fractions < 1,
        f"data.val_fraction={c.data.val_fraction} and data.test_fraction={c.data.test_fraction} must be > 0 and sum below 1",
    )
    need(c.data.n_blocks >= 3, f"data.n_blocks={c.data.n_blocks} must be at least 3 (train, val, test)")
    need(
        c.data.num_proc is None or c.data.num_proc >= 1,
        f"data.num_proc={c.data.num_proc} must be at least 1 (or null: all cores)",
    )
    need(
        c.data.name != "hf" or (c.data.files is None) != (c.data.hub is None),
        "data=hf reads data.files=PATH (local files or a saved dataset folder) or data.hub=NAME (a Hub dataset): give exactly one",
    )
    need(
        c.data.name == "hf" or (c.data.files is None and c.data.hub is None),
        f"data.files and data.hub are read by data=hf only; data={c.data.name} reads data.path",
    )
    need(
        c.tokenizer.train_bytes is None or c.tokenizer.train_bytes >= 1,
        f"tokenizer.train_bytes={c.tokenizer.train_bytes} must be at least 1 (or null: the whole training split)",
    )
    need(c.diag.every >= 0, f"diag.every={c.diag.every} must be >= 0 (0 turns the gradient statistics off)")
    need(
        c.diag.max_snapshots >= 2,
        f"diag.max_snapshots={c.diag.max_snapshots} must be at least 2 (step 0 and the last are "
        "always kept; diag.snapshots=false keeps none)",
    )
    need(
        c.eval.max_tokens is None or c.eval.max_tokens >= c.model.block_size,
        f"eval.max_tokens={c.eval.max_tokens} must be at least model.block_size={c.model.block_size} (or null: whole splits)",
    )
    b = c.eval.buckets
    need(len(b) == 2 and 0 < b[0] < b[1] < 1, f"eval.buckets={b} must be two increasing fractions in (0, 1)")
    tb, wb = c.logger.tensorboard, c.logger.wandb
    if tb is not None and tb.projector_tokens is not None:
        need(
            tb.projector_tokens >= 1,
            f"logger.tensorboard.projector_tokens={tb.projector_tokens} must be at least 1 (or null: all)",
        )
    if wb is not None:
        need(
            wb.mode in WANDB_MODES,
            f"logger.wandb.mode={wb.mode!r} is not valid; choose one of {', '.join(WANDB_MODES)}",
        )


def _validate_train(t: TrainConfig) -> None:
    need = _need
    for key in (
        "max_steps",
        "batch_size",
        "grad_accum",
        "eval_interval",
        "eval_batches",
        "log_interval",
        "checkpoint_interval",
    ):
        need(getattr(t, key) >= 1, f"train.{key}={getattr(t, key)} must be at least 1")
    for key, instead in (
        ("max_tokens", "train.max_steps sets the steps"),
        ("evals", "every train.eval_interval steps"),
        ("checkpoints", "every train.checkpoint_interval steps"),
    ):
        need(
            getattr(t, key) is None or getattr(t, key) >= 1,
            f"train.{key}={getattr(t, key)} must be at least 1 (or null: {instead})",
        )
    need(
        t.keep_checkpoints >= 0,
        f"train.keep_checkpoints={t.keep_checkpoints} must be >= 0 (0: last.pt only)",
    )
    need(t.sample_tokens >= 0, f"train.sample_tokens={t.sample_tokens} must be >= 0 (0: no sample after training)")
    need(
        t.lr > 0 and 0 <= t.min_lr <= t.lr,
        f"train.lr={t.lr}, train.min_lr={t.min_lr}: need 0 <= min_lr <= lr and lr > 0",
    )
    for key in ("lr_embedding", "lr_output"):
        need(
            getattr(t, key) is None or getattr(t, key) > 0,
            f"train.{key}={getattr(t, key)} must be > 0 (or null: train.lr)",
        )
    need(
        t.warmup_fraction is None or 0 <= t.warmup_fraction < 1,
        f"train.warmup_fraction={t.warmup_fraction} is not in [0, 1) (or null: train.warmup_steps)",
    )
    need(
        t.warmup_steps >= 0 and t.weight_decay >= 0 and t.grad_clip >= 0,
        "train.warmup_steps, weight_decay and grad_clip must be >= 0",
    )
    for key in ("beta1", "beta2"):
        need(0 <= getattr(t, key) < 1, f"train.{key}={getattr(t, key)} is not in [0, 1): AdamW's betas are decay rates")


# --- `tiecli sweep --launcher NAME`: conf/launcher/NAME.yaml and the command line's launcher.* overrides ---


@dataclass
class LocalLauncher:
    """conf/launcher/{basic,submitit_local}.yaml's local: keys (timeout_min and signal_delay_s: submitit_local's only)."""

    threads_per_job: int | None
    timeout_min: float | None = None
    signal_delay_s: int | None = None


@dataclass
class SlurmLauncher:
    """conf/launcher/submitit_slurm.yaml's slurm: keys, each an sbatch option."""

    partition: str | None
    time: int
    gpus_per_node: int
    cpus_per_task: int | None
    mem: str | None
    array_parallelism: int
    account: str | None
    qos: str | None
    signal_delay_s: int
    extra: list[str]
    setup: list[str]
    nodes: int  # --nodes: one job across this many nodes, one torchrun each, rendezvous on the first


@dataclass
class LauncherConfig:
    """One conf/launcher/*.yaml: a launcher has the local: keys or the slurm: keys."""

    local: LocalLauncher | None = None
    slurm: SlurmLauncher | None = None


def compose_launcher(name: str, overrides: list[str], config_dir: Path | None = None) -> LauncherConfig:
    """conf/launcher/NAME.yaml (the first config dir that has it) with `launcher.KEY=VALUE` overrides, checked."""
    dirs = config_dirs(config_dir)
    options = group_options("launcher", dirs)
    if name not in options:
        raise ConfigError(f"unknown --launcher {name!r}; valid launchers: {', '.join(options)}")
    path = next(d / "launcher" / f"{name}.yaml" for d in dirs if (d / "launcher" / f"{name}.yaml").is_file())
    file = OmegaConf.create({"launcher": read_yaml(path, repr(str(path)))})
    parsed = parse_overrides(overrides)
    check_unique(parsed, "on the command line")
    for o in parsed:
        if o.is_sweep_override():
            raise ConfigError(f"{o.input_line!r}: a launcher setting takes one value")
        _check_key(file, o.key_or_group)
        OmegaConf.update(file, o.key_or_group, o.value(), merge=False)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(LauncherConfig), file.launcher)
        launcher = typing.cast(LauncherConfig, OmegaConf.to_object(merged))
    except OmegaConfBaseException as e:
        hint: typing.Any = LauncherConfig
        for part in str(e.full_key).split("."):  # the key's type, through the `X | None` of each section
            hint = typing.get_type_hints(next(t for t in typing.get_args(hint) or (hint,) if t is not type(None)))[part]
        raise ConfigError(
            f"launcher.{e.full_key}={e.value!r} has the wrong type; expected {_type_words(hint)}"
        ) from None
    _validate_launcher(launcher)
    return launcher


def _validate_launcher(c: LauncherConfig) -> None:
    if c.local is not None:
        lo = c.local
        _need(
            lo.threads_per_job is None or lo.threads_per_job >= 1,
            "launcher.local.threads_per_job must be >= 1 (or null)",
        )
        _need(lo.timeout_min is None or lo.timeout_min > 0, f"launcher.local.timeout_min={lo.timeout_min} must be > 0")
        _need(lo.signal_delay_s is None or lo.signal_delay_s >= 0, "launcher.local.signal_delay_s must be >= 0")
    if c.slurm is not None:
        s = c.slurm
        for key in ("time", "array_parallelism"):
            _need(getattr(s, key) >= 1, f"launcher.slurm.{key}={getattr(s, key)} must be at least 1")
        _need(
            s.gpus_per_node >= 0 and s.signal_delay_s >= 0,
            "launcher.slurm.gpus_per_node and signal_delay_s must be >= 0",
        )
        _need(
            s.cpus_per_task is None or s.cpus_per_task >= 1,
            f"launcher.slurm.cpus_per_task={s.cpus_per_task} must be >= 1",
        )
        bad = next((line for line in s.extra if not re.fullmatch(r"--[A-Za-z][\w-]*(=.+)?", line)), None)
        _need(bad is None, f"launcher.slurm.extra line {bad!r} is not an sbatch option such as --constraint=a100")
        _need(s.nodes >= 1, f"launcher.slurm.nodes={s.nodes} must be at least 1")
        counts = next((line for line in s.extra if re.match(r"--(nodes|ntasks|ntasks-per-node)(=|$)", line)), None)
        _need(
            counts is None,
            f"launcher.slurm.extra line {counts!r} would start independent runs writing one run directory; "
            "use launcher.slurm.nodes=N for a job across N nodes",
        )


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


def check_name(name: str) -> None:
    """A --name for a new run: NAME_CHARS, and / to nest it in a folder under the runs directory."""
    bad = sorted(set(re.sub(f"[/{NAME_CHARS}]", "", name)))
    if bad:
        raise TiecliError(
            f"run name {name!r} holds {''.join(bad)!r}; a run name may hold only A-Z a-z 0-9 . _ - "
            "(and / to nest it in a folder)"
        )


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)
