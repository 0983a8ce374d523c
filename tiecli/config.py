# Used by `tiecli train`, `tiecli info` and `tiecli sweep` to turn overrides into a config.
"""Compose the Hydra config from conf/ plus overrides, check it, and convert it to dataclasses.

Only this module and the CLI see OmegaConf; everything downstream gets a `Config`.
"""

import contextlib
import dataclasses
import hashlib
import re
import shutil
import tempfile
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from tiecli import rundir, tokenizer
from tiecli.errors import ConfigError
from tiecli.model import GPTConfig

GROUPS = ("model", "tying", "data", "tokenizer")
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "fp32", "bf16")
DATA_SPLITS = ("document", "block")


def default_config_dir() -> Path:
    """conf/ inside an installed wheel (tiecli/conf), else at the top of a source checkout."""
    packaged = Path(__file__).parent / "conf"
    return packaged if packaged.is_dir() else Path(__file__).parent.parent / "conf"


@dataclass
class TrainConfig:
    max_steps: int = 500
    max_tokens: int | None = None
    batch_size: int = 16
    grad_accum: int = 1
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 50
    weight_decay: float = 0.1
    decay_embeddings: bool = True
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_interval: int = 100
    eval_batches: int = 8
    log_interval: int = 10
    checkpoint_interval: int = 100


@dataclass
class DataConfig:
    name: str = "shakespeare"
    path: str | None = None
    split: str = "document"
    val_fraction: float = 0.05
    test_fraction: float = 0.05
    split_seed: int = 1234
    n_blocks: int = 100


@dataclass
class TokenizerConfig:
    name: str = "bpe"
    vocab_size: int = 4096


@dataclass
class EvalConfig:
    buckets: list[float] = field(default_factory=lambda: [0.5, 0.9])


@dataclass
class DiagConfig:
    every: int = 10
    geometry: bool = True
    snapshots: bool = True
    pairs: str | None = None
    seed: int = 0


@dataclass
class Config:
    model: GPTConfig
    train: TrainConfig
    data: DataConfig
    tokenizer: TokenizerConfig
    eval: EvalConfig
    diag: DiagConfig
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    compile: bool = False

    @property
    def tokens_per_step(self) -> int:
        return self.train.batch_size * self.train.grad_accum * self.model.block_size

    @property
    def max_steps(self) -> int:
        """Optimizer steps to train: from the token budget when one is set."""
        if self.train.max_tokens is None:
            return self.train.max_steps
        return -(-self.train.max_tokens // self.tokens_per_step)


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


def compose(overrides: list[str], config_dir: Path | None = None) -> tuple[DictConfig, dict[str, str]]:
    """The composed config for single-valued overrides, and the group choices it was made from."""
    parsed = parse_overrides(overrides)
    for o in parsed:
        if o.is_sweep_override():
            raise ConfigError(f"{o.input_line!r} is a sweep (several values); run it with `tiecli sweep`, or give one value")
        if o.is_add() or o.is_delete() or o.is_force_add():
            raise ConfigError(f"{o.input_line!r} adds or deletes a key; tiecli only changes keys conf/ defines")
    dirs = config_dirs(config_dir)
    check_choices(parsed, dirs)
    group_overrides = [o.input_line for o in parsed if o.key_or_group in GROUPS]
    with _merged(dirs) as primary, initialize_config_dir(config_dir=primary, version_base=None):
        base = _hydra_compose(group_overrides)
        for o in parsed:
            if o.key_or_group not in GROUPS:
                _check_key(base, o.key_or_group)
        cfg = _hydra_compose(list(overrides))
    choices = {g: cfg.hydra.runtime.choices[g] for g in GROUPS}
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices


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
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if not isinstance(node, DictConfig) or leaf not in node.keys():
        where = f"under {parent!r}" if isinstance(node, DictConfig) and parent else "at the top level"
        valid = sorted(k for k in node.keys() if k != "hydra") if isinstance(node, DictConfig) else []
        raise ConfigError(f"unknown config key {key!r}; valid keys {where}: {', '.join(valid)}")


def _convert(cls, node, prefix: str, **extra):
    """A dataclass from a config node, checking every key and value type with a one-line error."""
    if not isinstance(node, (DictConfig, dict)):
        raise ConfigError(f"{prefix}={node!r} must be a group of keys (e.g. {prefix}.KEY=VALUE), not a single value")
    try:
        values = OmegaConf.to_container(node, resolve=True, throw_on_missing=True) if isinstance(node, DictConfig) else dict(node)
    except OmegaConfBaseException as e:
        raise ConfigError(f"missing or invalid value under {prefix!r}: {' '.join(str(e).split())}") from None
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key, value in values.items():
        name = f"{prefix}.{key}" if prefix else key
        if key not in names:
            raise ConfigError(f"unknown config key {name!r}; valid keys: {', '.join(sorted(names))}")
        values[key] = _check_type(value, hints[key], name)
    return cls(**values, **extra)


def _check_type(value, hint, key: str):
    allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None and type(None) in allowed:
        return value
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    for t in allowed:
        origin = typing.get_origin(t) or t
        if isinstance(value, origin) and not (isinstance(value, bool) and origin is int):
            return value
    names = " or ".join("null" if t is type(None) else getattr(typing.get_origin(t) or t, "__name__", str(t)) for t in allowed)
    raise ConfigError(f"{key}={value!r} has the wrong type; expected {names}")


def to_config(cfg: DictConfig) -> Config:
    """The composed DictConfig as dataclasses, with every value checked."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"{missing[0]} is required: add {missing[0]}=VALUE to the command")
    top = {k: cfg[k] for k in ("seed", "device", "dtype", "compile")}
    config = _convert(
        Config, top, "",
        train=_convert(TrainConfig, cfg.train, "train"),
        data=_convert(DataConfig, cfg.data, "data"),
        tokenizer=_convert(TokenizerConfig, cfg.tokenizer, "tokenizer"),
        eval=_convert(EvalConfig, cfg.eval, "eval"),
        diag=_convert(DiagConfig, cfg.diag, "diag"),
        model=_gpt_config(cfg),
    )
    _validate(config)
    return config


def _gpt_config(cfg: DictConfig) -> GPTConfig:
    vocab_size = tokenizer.vocab_size(cfg.tokenizer.name, cfg.tokenizer.get("vocab_size"))
    tying = dict(OmegaConf.to_container(cfg.tying, resolve=True))
    mode = tying.pop("mode")
    try:
        return _convert(GPTConfig, {**cfg.model, **tying}, "model", tying=mode, vocab_size=vocab_size)
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"invalid model or tying settings: {e}") from None


def _validate(c: Config) -> None:
    t = c.train

    def need(ok: bool, message: str) -> None:
        if not ok:
            raise ConfigError(message)

    device_ok = c.device in DEVICES or re.fullmatch(r"cuda:\d+", c.device)
    need(bool(device_ok), f"device={c.device!r} is not valid; choose one of {', '.join(DEVICES)} or cuda:N")
    need(c.dtype in DTYPES, f"dtype={c.dtype!r} is not valid; choose one of {', '.join(DTYPES)}")
    need(c.data.split in DATA_SPLITS, f"data.split={c.data.split!r} is not valid; choose one of {', '.join(DATA_SPLITS)}")
    for key in ("max_steps", "batch_size", "grad_accum", "eval_interval", "eval_batches", "log_interval", "checkpoint_interval"):
        need(getattr(t, key) >= 1, f"train.{key}={getattr(t, key)} must be at least 1")
    need(t.max_tokens is None or t.max_tokens >= 1, f"train.max_tokens={t.max_tokens} must be at least 1 (or null)")
    need(t.lr > 0 and 0 <= t.min_lr <= t.lr, f"train.lr={t.lr}, train.min_lr={t.min_lr}: need 0 <= min_lr <= lr and lr > 0")
    need(t.warmup_steps >= 0 and t.weight_decay >= 0 and t.grad_clip >= 0, "train.warmup_steps, weight_decay and grad_clip must be >= 0")
    fractions = c.data.val_fraction + c.data.test_fraction
    need(0 < c.data.val_fraction and 0 < c.data.test_fraction and fractions < 1,
         f"data.val_fraction={c.data.val_fraction} and data.test_fraction={c.data.test_fraction} must be > 0 and sum below 1")
    need(c.data.n_blocks >= 3, f"data.n_blocks={c.data.n_blocks} must be at least 3 (train, val, test)")
    need(c.diag.every >= 0, f"diag.every={c.diag.every} must be >= 0 (0 turns the gradient statistics off)")
    b = c.eval.buckets
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in b)
    need(numbers and len(b) == 2 and 0 < b[0] < b[1] < 1, f"eval.buckets={b} must be two increasing fractions in (0, 1)")


def run_name(choices: dict[str, str], cfg: DictConfig, overrides: list[str]) -> str:
    """A readable, unique-per-setting run name: group choices, seed, then any other overrides."""
    tok = choices["tokenizer"] + (str(cfg.tokenizer.vocab_size) if choices["tokenizer"] == "bpe" else "")
    path = cfg.data.get("path")  # its stem to read, a hash of the whole path to keep a/x.txt and b/x.txt apart
    data = choices["data"] + (f"_{Path(str(path)).stem}-{hashlib.sha256(str(path).encode()).hexdigest()[:6]}" if path else "")
    name = f"{choices['model']}-{choices['tying']}-{tok}-{data}-s{cfg.seed}"
    named = {*GROUPS, "seed", "tokenizer.vocab_size", "data.path"}
    extras = [o.input_line for o in parse_overrides(overrides) if o.key_or_group not in named]
    if extras:
        name += "," + ",".join(sorted(extras))
    name = re.sub(r"[^A-Za-z0-9._,=+-]", "_", name)
    if len(name) > 200:  # file systems allow 255 bytes; past 200, keep it unique with a hash
        name = name[:189] + "-" + hashlib.sha256(name.encode()).hexdigest()[:10]
    return name


def check_unchanged(stored: DictConfig, cfg: DictConfig) -> None:
    """Resuming is only meaningful with the config the run was started with."""
    old = rundir.flatten(OmegaConf.to_container(stored, resolve=True))
    new = rundir.flatten(OmegaConf.to_container(cfg, resolve=True))
    changed = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)]
    if changed:
        raise ConfigError(f"this run was trained with a different config ({'; '.join(changed)}); resume with the same overrides or pick another --name")


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


def load_yaml(path: Path) -> DictConfig:
    return OmegaConf.load(path)
