"""Validation: the composed config against the schema (keys and types, by OmegaConf), then its values.

Every refusal is a ConfigError of one line naming the key, the bad value and what is valid.
`to_config` is the one way from a composed DictConfig to a `Config`: for new runs, sweeps and the
runs read back from disk alike. `validate_launcher` checks one conf/launcher/*.yaml the same way.
"""

import dataclasses
import math
import re
import typing

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tiecli.config.messages import message
from tiecli.config.schema import Composed, Config, DataConfig, GPTConfig, LauncherConfig, Settings, TrainConfig
from tiecli.errors import ConfigError

WANDB_MODES = ("offline", "online", "disabled")
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "fp32", "bf16", "fp16")
COMPILE = ("auto", "true", "false")
DATA_SPLITS = ("document", "block")
TOKENIZERS = ("gpt2", "bpe", "bytes")
GPT2_N_VOCAB = 50257
BPE_MAX_VOCAB = 2**20
SEED_LIMIT = 2**63  # torch.manual_seed takes 64 bits, read as signed or unsigned; [0, 2**63) fits both


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
        raise ConfigError(message(e, cfg)) from None


def _check_finite(node: typing.Any, prefix: str = "") -> None:
    """Refuse inf and nan first: inf passes checks such as weight_decay >= 0, and nan fails them misleadingly."""
    for field in dataclasses.fields(node):
        key, value = f"{prefix}{field.name}", getattr(node, field.name)
        if dataclasses.is_dataclass(value):
            _check_finite(value, f"{key}.")
            continue
        numbers = value if isinstance(value, list) else [value]
        if any(isinstance(x, float) and not math.isfinite(x) for x in numbers):
            raise ConfigError(f"{key}={value} must be finite (not inf or nan)")


def vocab_size(name: str, size: int | None) -> int:
    """The vocabulary size that tokenizer.name and tokenizer.vocab_size imply, building nothing."""
    fixed = {"gpt2": GPT2_N_VOCAB, "bytes": 256}
    if name == "bpe":
        check_bpe_size(size)
        assert size is not None  # check_bpe_size raises unless it is an int
        return size
    if name not in fixed:
        raise ConfigError(f"tokenizer.name={name!r} is invalid: choose one of {', '.join(TOKENIZERS)}")
    # The configs state the fixed sizes too, so an override that disagrees is a mistake.
    if size is not None and size != fixed[name]:
        raise ConfigError(f"tokenizer.vocab_size={size} is invalid: {name} has exactly {fixed[name]} tokens")
    return fixed[name]


def check_bpe_size(size) -> None:
    """Refuse a bpe vocabulary size that is not an integer past the 256 byte tokens, or past BPE_MAX_VOCAB."""
    if isinstance(size, bool) or not isinstance(size, int):
        raise ConfigError(f"tokenizer.vocab_size={size!r} is invalid: bpe needs an integer")
    if size <= 256:
        raise ConfigError(f"tokenizer.vocab_size={size} is invalid: bpe needs more than 256 (the byte tokens)")
    if size > BPE_MAX_VOCAB:
        raise ConfigError(f"tokenizer.vocab_size={size} is invalid: bpe allows at most {BPE_MAX_VOCAB}")


def _gpt_config(composed: Composed) -> GPTConfig:
    n_vocab = vocab_size(composed.tokenizer.name, composed.tokenizer.vocab_size)
    # conf/ gives each mode only its own settings; GPTConfig's stand-ins fill the other modes' (None here).
    tying = {k: v for k, v in dataclasses.asdict(composed.tying).items() if k != "mode" and v is not None}
    try:
        return GPTConfig(vocab_size=n_vocab, tying=composed.tying.mode, **dataclasses.asdict(composed.model), **tying)
    except ValueError as e:
        raise ConfigError(f"invalid model or tying settings: {e}") from None


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _validate(c: Config) -> None:
    _validate_train(c.train)
    device_ok = c.device in DEVICES or re.fullmatch(r"cuda:\d+", c.device)
    _need(bool(device_ok), f"device={c.device!r} is not valid; choose one of {', '.join(DEVICES)} or cuda:N")
    _need(c.dtype in DTYPES, f"dtype={c.dtype!r} is not valid; choose one of {', '.join(DTYPES)}")
    _need(c.compile in COMPILE, f"compile={c.compile!r} is not valid; choose one of {', '.join(COMPILE)}")
    for key, seed in (("seed", c.seed), ("data.split_seed", c.data.split_seed), ("diag.seed", c.diag.seed)):
        _need(0 <= seed < SEED_LIMIT, f"{key}={seed} is not valid; a seed is an integer in [0, 2**63)")
    _validate_data(c.data)
    _need(
        c.tokenizer.train_bytes is None or c.tokenizer.train_bytes >= 1,
        f"tokenizer.train_bytes={c.tokenizer.train_bytes} must be at least 1 (or null: the whole training split)",
    )
    _need(c.diag.every >= 0, f"diag.every={c.diag.every} must be >= 0 (0 turns the gradient statistics off)")
    _need(
        c.diag.max_snapshots >= 2,
        f"diag.max_snapshots={c.diag.max_snapshots} must be at least 2 (step 0 and the last are "
        "always kept; diag.snapshots=false keeps none)",
    )
    _need(
        c.eval.max_tokens is None or c.eval.max_tokens >= c.model.block_size,
        f"eval.max_tokens={c.eval.max_tokens} must be at least model.block_size={c.model.block_size} (or null: whole splits)",
    )
    _need(
        c.eval.max_seconds is None or c.eval.max_seconds > 0,
        f"eval.max_seconds={c.eval.max_seconds} must be above 0 (or null: no time bound)",
    )
    b = c.eval.buckets
    _need(len(b) == 2 and 0 < b[0] < b[1] < 1, f"eval.buckets={b} must be two increasing fractions in (0, 1)")
    tb, wb = c.logger.tensorboard, c.logger.wandb
    if tb is not None and tb.projector_tokens is not None:
        _need(
            tb.projector_tokens >= 1,
            f"logger.tensorboard.projector_tokens={tb.projector_tokens} must be at least 1 (or null: all)",
        )
    if wb is not None:
        _need(
            wb.mode in WANDB_MODES,
            f"logger.wandb.mode={wb.mode!r} is not valid; choose one of {', '.join(WANDB_MODES)}",
        )


def _validate_data(d: DataConfig) -> None:
    """The data group's values: the split, its fractions and blocks, processes, and data=hf's source."""
    _need(d.split in DATA_SPLITS, f"data.split={d.split!r} is not valid; choose one of {', '.join(DATA_SPLITS)}")
    fractions = d.val_fraction + d.test_fraction
    _need(
        0 < d.val_fraction and 0 < d.test_fraction and fractions < 1,
        f"data.val_fraction={d.val_fraction} and data.test_fraction={d.test_fraction} must be > 0 and sum below 1",
    )
    _need(d.n_blocks >= 3, f"data.n_blocks={d.n_blocks} must be at least 3 (train, val, test)")
    _need(
        d.num_proc is None or d.num_proc >= 1,
        f"data.num_proc={d.num_proc} must be at least 1 (or null: all cores)",
    )
    _need(
        d.name != "hf" or (d.files is None) != (d.hub is None),
        "data=hf reads data.files=PATH (local files or a saved dataset folder) or data.hub=NAME (a Hub dataset): give exactly one",
    )
    _need(
        d.name == "hf" or (d.files is None and d.hub is None),
        f"data.files and data.hub are read by data=hf only; data={d.name} reads data.path",
    )


def _validate_train(t: TrainConfig) -> None:
    for key in (
        "max_steps",
        "batch_size",
        "grad_accum",
        "eval_interval",
        "eval_batches",
        "log_interval",
        "checkpoint_interval",
    ):
        _need(getattr(t, key) >= 1, f"train.{key}={getattr(t, key)} must be at least 1")
    for key, instead in (
        ("max_tokens", "train.max_steps sets the steps"),
        ("evals", "every train.eval_interval steps"),
        ("checkpoints", "every train.checkpoint_interval steps"),
    ):
        _need(
            getattr(t, key) is None or getattr(t, key) >= 1,
            f"train.{key}={getattr(t, key)} must be at least 1 (or null: {instead})",
        )
    _need(
        t.keep_checkpoints >= 0,
        f"train.keep_checkpoints={t.keep_checkpoints} must be >= 0 (0: last.pt only)",
    )
    _need(t.sample_tokens >= 0, f"train.sample_tokens={t.sample_tokens} must be >= 0 (0: no sample after training)")
    _need(
        t.lr > 0 and 0 <= t.min_lr <= t.lr,
        f"train.lr={t.lr}, train.min_lr={t.min_lr}: need 0 <= min_lr <= lr and lr > 0",
    )
    for key in ("lr_embedding", "lr_output"):
        _need(
            getattr(t, key) is None or getattr(t, key) > 0,
            f"train.{key}={getattr(t, key)} must be > 0 (or null: train.lr)",
        )
    _need(
        t.warmup_fraction is None or 0 <= t.warmup_fraction < 1,
        f"train.warmup_fraction={t.warmup_fraction} is not in [0, 1) (or null: train.warmup_steps)",
    )
    _need(
        t.warmup_steps >= 0 and t.weight_decay >= 0 and t.grad_clip >= 0,
        "train.warmup_steps, weight_decay and grad_clip must be >= 0",
    )
    for key in ("beta1", "beta2"):
        _need(
            0 <= getattr(t, key) < 1, f"train.{key}={getattr(t, key)} is not in [0, 1): AdamW's betas are decay rates"
        )


def validate_launcher(c: LauncherConfig) -> None:
    if c.local is not None:
        lo = c.local
        _need(
            lo.threads_per_job is None or lo.threads_per_job >= 1,
            "launcher.local.threads_per_job must be >= 1 (or null)",
        )
        _need(lo.timeout_min is None or lo.timeout_min > 0, f"launcher.local.timeout_min={lo.timeout_min} must be > 0")
        _need(lo.signal_delay_s is None or lo.signal_delay_s >= 0, "launcher.local.signal_delay_s must be >= 0")
        _need(
            c.kind != "submitit_local" or None not in (lo.timeout_min, lo.signal_delay_s),
            "launcher.local.timeout_min and signal_delay_s are submitit's time limit and its warning before it: give both",
        )
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
