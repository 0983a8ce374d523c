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

from tiecli import rundir, tokenizer
from tiecli.errors import ConfigError, TiecliError
from tiecli.model import GPTConfig

GROUPS = ("model", "tying", "data", "tokenizer")
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "fp32", "bf16")
DATA_SPLITS = ("document", "block")
SEED_LIMIT = 2**63  # torch.manual_seed takes 64 bits, read as signed or unsigned; [0, 2**63) fits both


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


@dataclass
class DataConfig:
    name: str
    path: str | None
    split: str
    val_fraction: float
    test_fraction: float
    split_seed: int
    n_blocks: int


@dataclass
class TokenizerConfig:
    name: str
    vocab_size: int


@dataclass
class EvalConfig:
    buckets: list[float]
    test: bool


@dataclass
class DiagConfig:
    every: int
    geometry: bool
    snapshots: bool
    max_snapshots: int
    pairs: str | None
    seed: int


@dataclass
class Settings:
    """Everything but the model: the same in the composed config and in `Config`."""

    train: TrainConfig
    data: DataConfig
    tokenizer: TokenizerConfig
    eval: EvalConfig
    diag: DiagConfig
    seed: int
    device: str
    dtype: str
    compile: bool


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
        if o.key_or_group in GROUPS:
            options = group_options(o.key_or_group, config_dirs)
            if str(o.value()) not in options:
                raise ConfigError(f"unknown {o.key_or_group} {o.value()!r}; valid choices: {', '.join(options)}")


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
    check_choices(parsed, dirs)
    # the parser sets input_line on every Override it returns
    group_overrides = [typing.cast(str, o.input_line) for o in parsed if o.key_or_group in GROUPS]
    with _merged(dirs) as primary, initialize_config_dir(config_dir=primary, version_base=None):
        base = _hydra_compose(group_overrides)
        for o in parsed:
            if o.key_or_group not in GROUPS:
                _check_key(base, o.key_or_group)
        cfg = _hydra_compose(list(overrides))
    choices = {g: cfg.hydra.runtime.choices[g] for g in GROUPS}
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
        if part not in keys:
            raise ConfigError(_unknown_key(".".join(parts[: i + 1]), keys))
        node = OmegaConf.select(
            node, part, throw_on_resolution_failure=False
        )  # a bad interpolation is to_config's to report


def _unknown_key(key: str, valid: list[str]) -> str:
    parent = key.rpartition(".")[0]
    return f"unknown config key {key!r}; valid keys {f'under {parent!r}' if parent else 'at the top level'}: {', '.join(valid)}"


def to_config(cfg: DictConfig) -> Config:
    """The composed DictConfig as dataclasses, with every key, type and value checked."""
    composed = _check_types(cfg)
    _check_finite(composed)
    settings = {f.name: getattr(composed, f.name) for f in dataclasses.fields(Settings)}
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
    for key, value in rundir.flatten(dataclasses.asdict(composed)).items():
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
    need(c.diag.every >= 0, f"diag.every={c.diag.every} must be >= 0 (0 turns the gradient statistics off)")
    need(
        c.diag.max_snapshots >= 2,
        f"diag.max_snapshots={c.diag.max_snapshots} must be at least 2 (step 0 and the last are "
        "always kept; diag.snapshots=false keeps none)",
    )
    b = c.eval.buckets
    need(len(b) == 2 and 0 < b[0] < b[1] < 1, f"eval.buckets={b} must be two increasing fractions in (0, 1)")


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
    ):
        need(
            getattr(t, key) is None or getattr(t, key) >= 1,
            f"train.{key}={getattr(t, key)} must be at least 1 (or null: {instead})",
        )
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


NAME_CHARS = "A-Za-z0-9._-"  # shell-safe without quoting, and the same on every file system
NAME_LIMIT = 80


def run_name(choices: dict[str, str], cfg: DictConfig, overrides: list[str]) -> str:
    """A short, shell-safe run name, unique per setting: group choices, seed, then a hash of any other overrides.

    e.g. micro-untied-bpe4096-shakespeare-s0-3f9a1c2e; overrides.yaml keeps the overrides themselves.
    """
    tok = choices["tokenizer"] + (str(cfg.tokenizer.vocab_size) if choices["tokenizer"] == "bpe" else "")
    path = cfg.data.get("path")  # its stem to read, a hash of the whole path to keep a/x.txt and b/x.txt apart
    data = choices["data"] + (f"_{Path(str(path)).stem[:24]}-{_hash(str(path), 6)}" if path else "")
    readable = f"{choices['model']}-{choices['tying']}-{tok}-{data}-s{cfg.seed}"
    named = {*GROUPS, "seed", "tokenizer.vocab_size", "data.path"}
    extras = sorted(typing.cast(str, o.input_line) for o in parse_overrides(overrides) if o.key_or_group not in named)
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
